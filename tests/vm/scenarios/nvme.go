package scenarios

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/tests/vm/vmhost"
)

const awaitCheck = 40 * time.Second

// nvmeHealthy: QEMU's NVMe drive without warnings. The three disk
// conditions are False, and the disks report carries the drive's identity.
// QEMU reports available spare 0 % with threshold 0 %, which must not
// count as failing.
func nvmeHealthy(g *Guest) error {
	for _, w := range []struct{ typ, reason, msg string }{
		{"DisksFailure", "DisksHealthy", "1 NVMe drive without SMART critical warnings"},
		{"DiskWearHigh", "DiskWearOK", "1 NVMe drive below 80% of rated endurance"},
		{"DiskTemperatureHigh", "DiskTemperatureOK", "1 NVMe drive within their temperature thresholds"},
	} {
		c, err := g.Await(w.typ, "False", w.reason, awaitCheck)
		if err != nil {
			return err
		}
		if err := MessageHas(c, w.msg); err != nil {
			return err
		}
	}
	out, err := g.Check("DisksFailure")
	if err != nil {
		return err
	}
	var doc struct {
		Disks []struct {
			Controller      string `json:"controller"`
			Model           string `json:"model"`
			Serial          string `json:"serial"`
			Firmware        string `json:"firmware"`
			CriticalWarning int    `json:"criticalWarning"`
			TemperatureC    *int   `json:"temperatureC"`
			WarningTempC    int    `json:"warningTempC"`
			CriticalTempC   int    `json:"criticalTempC"`
			AvailableSpare  int    `json:"availableSparePercent"`
			SpareThreshold  int    `json:"spareThresholdPercent"`
			PercentageUsed  int    `json:"percentageUsed"`
			Error           string `json:"error"`
			IdentifyError   string `json:"identifyError"`
		} `json:"disks"`
	}
	if err := json.Unmarshal(out.Report["disks"], &doc); err != nil {
		return fmt.Errorf("disks report %s: %w", out.Report["disks"], err)
	}
	g.Logf("disks report: %s", compact(out.Report["disks"]))
	if len(doc.Disks) != 1 {
		return fmt.Errorf("disks report lists %d drives, want 1: %s", len(doc.Disks), out.Report["disks"])
	}
	d := doc.Disks[0]
	if d.Controller != "nvme0" || d.Model != "QEMU NVMe Ctrl" || d.Serial != NVMeSerial || d.Firmware == "" {
		return fmt.Errorf("disks report: identity %+v, want nvme0, QEMU NVMe Ctrl, %s, a firmware revision", d, NVMeSerial)
	}
	// QEMU 7.2's controller (hw/nvme): composite temperature 323 K, WCTEMP
	// 343 K, CCTEMP 373 K (Identify bytes 266-269), percentage used 0 (no
	// property changes it: DiskWearHigh True is tested with a faked drive
	// only, checks/disks_test.go).
	if d.TemperatureC == nil || *d.TemperatureC != 50 || d.WarningTempC != 70 || d.CriticalTempC != 100 {
		return fmt.Errorf("disks report: temperature %v°C, warning %d°C, critical %d°C; want QEMU's 50, 70, 100 (323 K, 343 K, 373 K)", deref(d.TemperatureC), d.WarningTempC, d.CriticalTempC)
	}
	if d.PercentageUsed != 0 || d.Error != "" || d.IdentifyError != "" {
		return fmt.Errorf("disks report: percentage used %d, error %q, identify error %q; want 0 and none", d.PercentageUsed, d.Error, d.IdentifyError)
	}
	if d.AvailableSpare != 0 || d.SpareThreshold != 0 || d.CriticalWarning != 0 {
		return fmt.Errorf("disks report: spare %d%% threshold %d%% warning %d: not QEMU's 0/0/0, so the spare case is not tested", d.AvailableSpare, d.SpareThreshold, d.CriticalWarning)
	}
	for _, c := range out.Conditions {
		if c.Type == "DisksFailure" && c.Status != "False" {
			return fmt.Errorf("check --json: %s, want False", c)
		}
	}
	return nil
}

// NVMe admin opcodes and the temperature threshold feature.
const (
	nvmeGetLogPage  = 0x02
	nvmeSetFeatures = 0x09
	nvmeGetFeatures = 0x0a
	nvmeFeatTemp    = 0x04
)

// nvmeTemperature: a Set Features temperature threshold below the drive's
// temperature makes the controller raise its temperature warning:
// DiskTemperatureHigh True, DisksFailure still False (the temperature bit
// is not a failing disk); the old threshold back, False again.
func nvmeTemperature(g *Guest) error {
	smart := make([]byte, 512)
	// SMART / Health log (LID 02h) of the controller (all namespaces).
	if _, err := NVMeAdmin(nvmeGetLogPage, 0xffffffff, (512/4-1)<<16|0x02, 0, smart); err != nil {
		return err
	}
	kelvin := binary.LittleEndian.Uint16(smart[1:3])
	if kelvin < 273 {
		return fmt.Errorf("SMART log: composite temperature %dK", kelvin)
	}
	old, err := NVMeAdmin(nvmeGetFeatures, 0, nvmeFeatTemp, 0, nil)
	if err != nil {
		return err
	}
	g.Logf("composite temperature %dK, threshold %dK", kelvin, old&0xffff)
	if _, err := NVMeAdmin(nvmeSetFeatures, 0, nvmeFeatTemp, uint32(kelvin-10), nil); err != nil {
		return err
	}
	c, err := g.Await("DiskTemperatureHigh", "True", "TemperatureAboveThreshold", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, fmt.Sprintf("nvme0 (QEMU NVMe Ctrl) reports its temperature outside its threshold (%d°C)", int(kelvin)-273)); err != nil {
		return err
	}
	st, err := g.State()
	if err != nil {
		return err
	}
	if df := st["DisksFailure"]; df.Status != "False" {
		return fmt.Errorf("the temperature warning bit made %s, want False", df)
	}
	if _, err := NVMeAdmin(nvmeSetFeatures, 0, nvmeFeatTemp, old&0xffff, nil); err != nil {
		return err
	}
	_, err = g.Await("DiskTemperatureHigh", "False", "DiskTemperatureOK", awaitCheck)
	return err
}

// nvmeCriticalWarning: QEMU's smart_critical_warning=0x05 (available spare
// below threshold, reliability degraded): DisksFailure True naming both
// bits and the drive.
func nvmeCriticalWarning(g *Guest) error {
	c, err := g.Await("DisksFailure", "True", "NVMeCriticalWarning", awaitCheck)
	if err != nil {
		return err
	}
	return MessageHas(c, "nvme0 (QEMU NVMe Ctrl): SMART critical warning 0x05: available spare below threshold, NVM subsystem reliability degraded")
}

// compact returns a JSON document on one line.
func compact(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}

// QOMSet asks the host to set property prop of the emulated device dev
// (nvme0: the boot's NVMe drive) over QEMU's monitor (vmhost.QOMSetPrefix).
// The host does not answer the guest: the caller waits for the device to
// show the change.
func (g *Guest) QOMSet(dev, prop string, value uint64) {
	fmt.Printf("%s%s %s %d\n", vmhost.QOMSetPrefix, dev, prop, value)
}

// awaitSMARTWarning reads the drive's SMART page until its critical
// warning byte is want (QEMU applies a qom-set as the host sends it).
func awaitSMARTWarning(want uint8, d time.Duration) error {
	deadline := time.Now().Add(d)
	page := make([]byte, 512)
	for {
		if _, err := NVMeAdmin(nvmeGetLogPage, 0xffffffff, (512/4-1)<<16|0x02, 0, page); err != nil {
			return err
		}
		if page[0] == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the drive's SMART critical warning is 0x%02x %v after the qom-set, want 0x%02x (the host's answer is its HOST| line)", page[0], d, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// throughHelper reads the drive's Identify and SMART pages as the daemon
// does with --privileged-helper: a request to the helper's server
// (internal/privileged, the code of autopilot-health-privileged) on a Unix
// socket, which sends the admin commands to /dev/nvme0.
func throughHelper() (checks.NVMeHealth, error) {
	h := checks.NVMeHealth{Controller: "nvme0"}
	sock := "/run/vmtest-helper.sock"
	os.Remove(sock)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return h, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&privileged.Server{}).Serve(ctx, l) }()
	defer func() { cancel(); l.Close(); <-done }()
	c := &privileged.Client{Path: sock}
	id, err := c.Identify("nvme0")
	if err == nil {
		err = checks.ParseIdentify(&h, id)
	}
	if err != nil {
		return h, fmt.Errorf("Identify through the helper: %w", err)
	}
	s, err := c.SMART("nvme0")
	if err == nil {
		err = checks.ParseSMART(&h, s)
	}
	if err != nil {
		return h, fmt.Errorf("SMART through the helper: %w", err)
	}
	return h, nil
}

// nvmeWarningAtRunTime: a SMART critical warning that appears while the
// daemon runs, set by the host over QMP (hw/nvme's smart_critical_warning
// property, qom-set), as a drive's firmware would raise it: DisksFailure
// False, then True naming the bit (NVM subsystem reliability degraded,
// 0x04), the helper reading the same bit, DiskTemperatureHigh False; the
// temperature bit added (0x06): DiskTemperatureHigh True, DisksFailure
// naming the reliability bit only; then the bits cleared and both False
// again.
func nvmeWarningAtRunTime(g *Guest) error {
	if _, err := g.Await("DisksFailure", "False", "DisksHealthy", awaitCheck); err != nil {
		return err
	}
	g.QOMSet("nvme0", "smart_critical_warning", 0x04)
	if err := awaitSMARTWarning(0x04, 20*time.Second); err != nil {
		return err
	}
	c, err := g.Await("DisksFailure", "True", "NVMeCriticalWarning", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "nvme0 (QEMU NVMe Ctrl): SMART critical warning 0x04: NVM subsystem reliability degraded"); err != nil {
		return err
	}
	h, err := throughHelper()
	if err != nil {
		return err
	}
	g.Logf("through the helper: %+v", h)
	if h.CriticalWarning != 0x04 || h.Model != "QEMU NVMe Ctrl" || h.Serial != NVMeSerial {
		return fmt.Errorf("through the helper: warning 0x%02x, model %q, serial %q; want 0x04, QEMU NVMe Ctrl, %s", h.CriticalWarning, h.Model, h.Serial, NVMeSerial)
	}
	st, err := g.State()
	if err != nil {
		return err
	}
	if dt := st["DiskTemperatureHigh"]; dt.Status != "False" {
		return fmt.Errorf("the reliability bit made %s, want False", dt)
	}
	// The temperature bit added (0x06): DiskTemperatureHigh's; DisksFailure
	// still names the reliability bit alone.
	g.QOMSet("nvme0", "smart_critical_warning", 0x06)
	if err := awaitSMARTWarning(0x06, 20*time.Second); err != nil {
		return err
	}
	c, err = g.Await("DiskTemperatureHigh", "True", "TemperatureAboveThreshold", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "nvme0 (QEMU NVMe Ctrl) reports its temperature outside its threshold (50°C)"); err != nil {
		return err
	}
	if c, err = g.Await("DisksFailure", "True", "NVMeCriticalWarning", awaitCheck); err != nil {
		return err
	}
	if err := MessageHas(c, "nvme0 (QEMU NVMe Ctrl): SMART critical warning 0x06: NVM subsystem reliability degraded"); err != nil {
		return err
	}
	if strings.Contains(c.Message, "temperature") {
		return fmt.Errorf("DisksFailure names the temperature bit, DiskTemperatureHigh's: %s", c)
	}
	g.QOMSet("nvme0", "smart_critical_warning", 0)
	if err := awaitSMARTWarning(0, 20*time.Second); err != nil {
		return err
	}
	if _, err := g.Await("DiskTemperatureHigh", "False", "DiskTemperatureOK", awaitCheck); err != nil {
		return err
	}
	c, err = g.Await("DisksFailure", "False", "DisksHealthy", awaitCheck)
	if err != nil {
		return err
	}
	return MessageHas(c, "1 NVMe drive without SMART critical warnings")
}

func deref(p *int) any {
	if p == nil {
		return "none"
	}
	return *p
}
