package checks

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

func init() {
	Register("DisksFailure", newDisksFailureSMART)
	Register("DiskWearHigh", newDiskWear)
	Register("DiskTemperatureHigh", newDiskTemp)
}

// disksFailureSMART: an NVMe SMART critical-warning bit other than the
// temperature bit is set (read over
// the admin ioctl). The temperature bit is left to DiskTemperatureHigh (an
// operability problem, not a failing disk). It is DisksFailure's check part
// (the catalog row's Parts); the kernel's I/O errors are the other.
// It collects the disks report list, whose drives it marks with the
// thresholds of the other disk conditions (nvmeThresholds).
type disksFailureSMART struct {
	nvme       *nvmeReader
	thresholds nvmeThresholds
}

func newDisksFailureSMART(env *Env) (Check, error) {
	return &disksFailureSMART{nvme: newNVMeReader(env, env.Config.Checks.DisksFailure.Timeout.Duration),
		thresholds: nvmeThresholdsOf(env.Config)}, nil
}

// nvmeThresholds are the settings of DiskWearHigh and DiskTemperatureHigh
// that decide which drives they name: the disks check marks those drives
// (NVMeHealth.OverThreshold), so that a disks list cut to fit its document
// keeps them first. A disabled check names no drive, and its threshold is
// left out (0): it decides nothing. They are part of the disks check's
// settings (alsoReads): a reload that changes them builds it again, and
// one that changes only a disabled check's threshold does not.
type nvmeThresholds struct {
	wearOn, tempOn bool
	wear, temp     int
}

func nvmeThresholdsOf(c *config.Config) nvmeThresholds {
	w, t := c.Checks.DiskWearHigh, c.Checks.DiskTemperatureHigh
	th := nvmeThresholds{wearOn: w.Enabled, tempOn: t.Enabled}
	if th.wearOn {
		th.wear = w.PercentageUsedThreshold
	}
	if th.tempOn {
		th.temp = t.ThresholdCelsius
	}
	return th
}

// over reports whether DiskWearHigh or DiskTemperatureHigh names the
// readable drive h.
func (t nvmeThresholds) over(h NVMeHealth) bool {
	if h.Error != "" {
		return false
	}
	return (t.wearOn && worn(h, t.wear)) || (t.tempOn && hot(h, t.temp))
}

func (c *disksFailureSMART) Probe(ctx context.Context) (Result, error) {
	hs, ok, bad, err := c.nvme.read(ctx)
	for i := range hs {
		hs[i].OverThreshold = c.thresholds.over(hs[i])
	}
	details := []report.Detail{{Domain: "disks", Field: "disks", Value: hs}}
	if err != nil {
		if hs == nil {
			// The drives could not be listed: nothing collected, not
			// "no disks" ([]); the list the last run read stays, stale.
			return Result{}, err
		}
		return Result{Details: details}, err // each drive with its error
	}
	var failing, hot []string
	for _, h := range ok {
		if w := warnings(h.CriticalWarning, 1<<1); len(w) > 0 {
			failing = append(failing, fmt.Sprintf("%s: SMART critical warning 0x%02x: %s", h.name(), h.CriticalWarning, strings.Join(w, ", ")))
		} else if h.CriticalWarning&(1<<1) != 0 {
			hot = append(hot, h.Controller)
		}
	}
	if len(failing) > 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonNVMeCriticalWarning, Message: strings.Join(failing, "; ") + unreadableNote(bad), Details: details}, nil
	}
	if len(ok) == 0 {
		// No drive: this part checked nothing; the kernel's I/O error part
		// decides DisksFailure (report.Store.SetPart).
		r := noDrives
		r.Message, r.Details = "no NVMe drives", details
		return r, nil
	}
	msg := drives(len(ok), "without SMART critical warnings")
	if len(hot) > 0 {
		// Not "without warnings" when a drive has the temperature one.
		msg = drives(len(ok), "without SMART critical warnings but temperature") + fmt.Sprintf(" (%s: its temperature warning is DiskTemperatureHigh's)", strings.Join(hot, ", "))
	}
	if len(bad) > 0 {
		return unreadable(msg, bad, details), nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonDisksHealthy, Message: msg, Details: details}, nil
}

// unreadable is the result of an NVMe check when no readable drive is
// past its threshold but some drive could not be read: a controller that
// does not answer may be the failing disk itself, so the check does not
// say "healthy" (False); it says what it read and which drives it could
// not (Unknown / CheckFailed). A drive past its threshold decides True
// all the same.
func unreadable(msg string, bad []string, details []report.Detail) Result {
	return Result{Status: report.StatusUnknown, Reason: report.ReasonCheckFailed, Message: msg + unreadableNote(bad), Details: details}
}

// nvmeReader reads the NVMe drives for one check, each drive's commands
// waited for at most nvmeTimeout of the check's timeout; stuck are the
// drives whose commands have not returned, shared with the other NVMe
// checks and with this check's instances before and after a reload
// (Env.Stuck).
type nvmeReader struct {
	env     *Env
	timeout time.Duration
	stuck   *stuckCalls[NVMeHealth]
}

func newNVMeReader(env *Env, checkTimeout time.Duration) *nvmeReader {
	return &nvmeReader{env: env, timeout: nvmeTimeout(checkTimeout), stuck: &env.stuckCalls().nvme}
}

// read reads every NVMe drive and splits the readable ones (their SMART
// page read) from the others, each named with its error; it fails when
// drives exist and none is readable.
func (r *nvmeReader) read(ctx context.Context) (all, ok []NVMeHealth, bad []string, err error) {
	all, err = readNVMeHealth(ctx, r.env.nvme(), r.stuck, r.timeout)
	if err != nil {
		return nil, nil, nil, err
	}
	ok, bad = nvmeUnreadable(all)
	if len(all) > 0 && len(ok) == 0 {
		return all, nil, bad, fmt.Errorf("no NVMe drive readable: %s", strings.Join(bad, "; "))
	}
	return all, ok, bad, nil
}

// noDrives is the result of a check that only NVMe drives feed, on a node
// that has none: it measured nothing, so it is not False.
var noDrives = Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
	Message: "no NVMe drives on this node (only NVMe drives report wear and temperature)"}

func drives(n int, what string) string {
	switch n {
	case 0:
		return "no NVMe drives"
	case 1:
		return "1 NVMe drive " + what
	}
	return fmt.Sprintf("%d NVMe drives %s", n, what)
}

func unreadableNote(bad []string) string {
	if len(bad) == 0 {
		return ""
	}
	return "; not readable: " + strings.Join(bad, "; ")
}

// diskWear: an NVMe drive's "percentage used" of its rated endurance is at
// or above the threshold.
type diskWear struct {
	nvme      *nvmeReader
	threshold int
}

func newDiskWear(env *Env) (Check, error) {
	c := env.Config.Checks.DiskWearHigh
	return &diskWear{nvme: newNVMeReader(env, c.Timeout.Duration), threshold: c.PercentageUsedThreshold}, nil
}

func (c *diskWear) Probe(ctx context.Context) (Result, error) {
	_, ok, bad, err := c.nvme.read(ctx)
	if err != nil {
		return Result{}, err
	}
	var wornOut []string
	for _, h := range ok {
		if worn(h, c.threshold) {
			wornOut = append(wornOut, fmt.Sprintf("%s has used %d%% of its rated endurance", h.name(), h.PercentageUsed))
		}
	}
	if len(ok) == 0 {
		return noDrives, nil
	}
	if len(wornOut) > 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonEnduranceMostlyUsed, Message: strings.Join(wornOut, "; ") + fmt.Sprintf(" (threshold %d%%)", c.threshold) + unreadableNote(bad)}, nil
	}
	msg := drives(len(ok), fmt.Sprintf("below %d%% of rated endurance", c.threshold))
	if len(bad) > 0 {
		return unreadable(msg, bad, nil), nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonDiskWearOK, Message: msg}, nil
}

// worn reports whether the drive has used threshold percent or more of
// its rated endurance (DiskWearHigh names it).
func worn(h NVMeHealth, threshold int) bool { return h.PercentageUsed >= threshold }

// tempLimit is the temperature at which DiskTemperatureHigh names the
// drive: the configured threshold, or (0) the drive's own WCTEMP; 0 when
// it has neither.
func tempLimit(h NVMeHealth, threshold int) int {
	if threshold == 0 {
		return h.WarningTempC
	}
	return threshold
}

// hot reports whether the drive's temperature is at or over its limit
// (tempLimit). Its temperature warning bit, which DiskTemperatureHigh
// also names it for, is a critical warning (NVMeHealth.Problem).
func hot(h NVMeHealth, threshold int) bool {
	limit := tempLimit(h, threshold)
	return h.TemperatureC != nil && limit > 0 && *h.TemperatureC >= limit
}

// diskTemp: an NVMe drive is past its temperature threshold: the configured
// one, or (threshold_celsius = 0) the drive's own warning threshold WCTEMP,
// or, where the drive reports none, its own temperature warning bit. A
// drive whose composite temperature is 0 K reports no temperature: only its
// warning bit can make it hot, and it is named, not counted within its
// threshold.
type diskTemp struct {
	nvme      *nvmeReader
	threshold int
}

func newDiskTemp(env *Env) (Check, error) {
	c := env.Config.Checks.DiskTemperatureHigh
	return &diskTemp{nvme: newNVMeReader(env, c.Timeout.Duration), threshold: c.ThresholdCelsius}, nil
}

func (c *diskTemp) Probe(ctx context.Context) (Result, error) {
	_, ok, bad, err := c.nvme.read(ctx)
	if err != nil {
		return Result{}, err
	}
	var hotOut, untold []string
	within := 0
	for _, h := range ok {
		limit := tempLimit(h, c.threshold)
		switch {
		case hot(h, c.threshold):
			hotOut = append(hotOut, fmt.Sprintf("%s is at %d°C, threshold %d°C", h.name(), *h.TemperatureC, limit))
		case h.CriticalWarning&(1<<1) != 0:
			hotOut = append(hotOut, fmt.Sprintf("%s reports its temperature outside its threshold (%s)", h.name(), h.temperature()))
		case h.TemperatureC == nil:
			// 0 K: the drive does not report its temperature; it is not
			// "within" anything.
			untold = append(untold, h.name())
		default:
			within++
		}
	}
	if len(ok) == 0 {
		return noDrives, nil
	}
	var untoldNote string
	if len(untold) > 0 {
		untoldNote = "; no temperature reported: " + strings.Join(untold, ", ")
	}
	if len(hotOut) > 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonTemperatureAboveThreshold, Message: strings.Join(hotOut, "; ") + untoldNote + unreadableNote(bad)}, nil
	}
	msg := drives(within, "within their temperature thresholds") + untoldNote
	if within == 0 {
		msg = "no NVMe drive reports its temperature (composite temperature 0 K): " + strings.Join(untold, ", ")
	}
	if len(bad) > 0 {
		return unreadable(msg, bad, nil), nil
	}
	if within == 0 {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: msg}, nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonDiskTemperatureOK, Message: msg}, nil
}
