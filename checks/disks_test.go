package checks

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/kmsg"

	"github.com/syself/autopilot-health/report"

	"github.com/syself/autopilot-health/internal/testenv"
)

// fakeNVMe serves Identify and SMART pages built by the test.
type fakeNVMe struct {
	ctrls map[string]fakeDrive
	err   error
}

type fakeDrive struct {
	model          string
	wctempK        uint16
	tempK          uint16
	cw, spare, pct byte
	smartErr       error
	identifyErr    error
}

func (f *fakeNVMe) Controllers() ([]string, error) {
	var out []string
	for _, name := range []string{"nvme0", "nvme1", "nvme2", "nvme3", "nvme4", "nvme5"} {
		if _, ok := f.ctrls[name]; ok {
			out = append(out, name)
		}
	}
	return out, f.err
}

func (f *fakeNVMe) Identify(c string) ([]byte, error) {
	d := f.ctrls[c]
	if d.identifyErr != nil {
		return nil, d.identifyErr
	}
	b := make([]byte, 4096)
	copy(b[4:24], "SN-"+c+"                ")
	copy(b[24:64], d.model+strings.Repeat(" ", 40))
	copy(b[64:72], "1.0     ")
	binary.LittleEndian.PutUint16(b[266:268], d.wctempK)
	binary.LittleEndian.PutUint16(b[268:270], d.wctempK+10)
	return b, nil
}

func (f *fakeNVMe) SMART(c string) ([]byte, error) {
	d := f.ctrls[c]
	if d.smartErr != nil {
		return nil, d.smartErr
	}
	b := make([]byte, 512)
	b[0] = d.cw
	binary.LittleEndian.PutUint16(b[1:3], d.tempK)
	b[3], b[4], b[5] = d.spare, 10, d.pct
	binary.LittleEndian.PutUint64(b[128:136], 12345)
	binary.LittleEndian.PutUint64(b[160:168], 7)
	return b, nil
}

func nvmeEnv(t *testing.T, f *fakeNVMe) *Env {
	env := testEnv(t, nil)
	env.NVMe = f
	return env
}

func probe(t *testing.T, c Check) Result {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseNVMePages(t *testing.T) {
	f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "QEMU NVMe Ctrl", wctempK: 343, tempK: 323, cw: 0x05, spare: 0, pct: 3}}}
	hs, err := readNVMeHealth(context.Background(), f, &stuckCalls[NVMeHealth]{}, time.Minute)
	if err != nil || len(hs) != 1 {
		t.Fatal(hs, err)
	}
	h := hs[0]
	if h.TemperatureC == nil || *h.TemperatureC != 50 {
		t.Errorf("temperature %v, want 50°C", h.temperature())
	}
	h.TemperatureC = nil
	want := NVMeHealth{Controller: "nvme0", Model: "QEMU NVMe Ctrl", Serial: "SN-nvme0", Firmware: "1.0", CriticalWarning: 5,
		WarningTempC: 70, CriticalTempC: 80, AvailableSpare: 0, SpareThreshold: 10, PercentageUsed: 3, PowerOnHours: 12345, MediaErrors: 7}
	if h != want {
		t.Errorf("parsed\n%+v\nwant\n%+v", h, want)
	}
	if err := ParseSMART(&h, make([]byte, 10)); err == nil {
		t.Error("short SMART page accepted")
	}
}

func TestDisksFailureSMART(t *testing.T) {
	f := &fakeNVMe{ctrls: map[string]fakeDrive{
		"nvme0": {model: "A", wctempK: 343, tempK: 310},
		"nvme1": {model: "B", wctempK: 343, tempK: 310, cw: 0x02}, // temperature only: not a failing disk
	}}
	c, _ := newDisksFailureSMART(nvmeEnv(t, f))
	if r := probe(t, c); r.Status != report.StatusFalse || r.Message != "2 NVMe drives without SMART critical warnings but temperature (nvme1: its temperature warning is DiskTemperatureHigh's)" {
		t.Errorf("temperature only: %+v", r)
	}
	f.ctrls["nvme1"] = fakeDrive{model: "B", wctempK: 343, tempK: 310}
	if r := probe(t, c); r.Status != report.StatusFalse || r.Message != "2 NVMe drives without SMART critical warnings" {
		t.Errorf("healthy: %+v", r)
	}
	f.ctrls["nvme1"] = fakeDrive{model: "B", cw: 0x0d} // spare, read-only, reliability
	r := probe(t, c)
	if r.Status != report.StatusTrue || r.Reason != "NVMeCriticalWarning" ||
		r.Message != "nvme1 (B): SMART critical warning 0x0d: available spare below threshold, NVM subsystem reliability degraded, media placed in read-only mode" {
		t.Errorf("warning: %+v", r)
	}
	if d := r.Details[0]; d.Domain != "disks" || len(d.Value.([]NVMeHealth)) != 2 {
		t.Errorf("disks domain: %+v", d)
	}
	f.ctrls["nvme0"] = fakeDrive{smartErr: errors.New("permission denied")}
	f.ctrls["nvme1"] = fakeDrive{smartErr: errors.New("permission denied")}
	if _, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "no NVMe drive readable") {
		t.Errorf("unreadable: %v", err)
	}
	none, _ := newDisksFailureSMART(nvmeEnv(t, &fakeNVMe{}))
	// No drives: this part checked nothing (the kernel's part decides).
	if r := probe(t, none); r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck || r.Message != "no NVMe drives" {
		t.Errorf("no drives: %+v", r)
	}
}

// The two parts of DisksFailure through the runner: the SMART check's
// result does not override the kernel's part, and vice versa.
func TestDisksFailurePartThroughRunner(t *testing.T) {
	f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A", cw: 0x01}}}
	env := nvmeEnv(t, f)
	store := report.NewStore("b")
	store.SetPart(report.SourceKmsg, report.Condition{Type: "DisksFailure", Status: report.StatusFalse, Reason: "DisksHealthy", Message: "the kernel logged 0 disk I/O errors"}, env.Now())
	r, err := NewRunner(env, Options{Store: store, Only: []string{"DisksFailure"}})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(context.Background())
	c, _ := store.Get("DisksFailure")
	if c.Status != report.StatusTrue || c.Reason != "NVMeCriticalWarning" || !strings.HasPrefix(c.Message, "nvme0 (A): SMART critical warning 0x01") {
		t.Errorf("DisksFailure = %+v", c)
	}
	f.ctrls["nvme0"] = fakeDrive{model: "A"}
	r.RunOnce(context.Background())
	if c, _ := store.Get("DisksFailure"); c.Status != report.StatusFalse || c.Message != "the kernel logged 0 disk I/O errors; 1 NVMe drive without SMART critical warnings" {
		t.Errorf("both parts healthy: %+v", c)
	}
}

func TestDiskWearAndTemperature(t *testing.T) {
	f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 330, pct: 79}}}
	env := nvmeEnv(t, f)
	wear, _ := newDiskWear(env)
	temp, _ := newDiskTemp(env)
	if r := probe(t, wear); r.Status != report.StatusFalse {
		t.Errorf("79%%: %+v", r)
	}
	if r := probe(t, temp); r.Status != report.StatusFalse || r.Message != "1 NVMe drive within their temperature thresholds" {
		t.Errorf("57°C under WCTEMP 70°C: %+v", r)
	}
	f.ctrls["nvme0"] = fakeDrive{model: "A", wctempK: 343, tempK: 343, pct: 80}
	if r := probe(t, wear); r.Status != report.StatusTrue || r.Message != "nvme0 (A) has used 80% of its rated endurance (threshold 80%)" {
		t.Errorf("80%%: %+v", r)
	}
	if r := probe(t, temp); r.Status != report.StatusTrue || r.Message != "nvme0 (A) is at 70°C, threshold 70°C" {
		t.Errorf("at WCTEMP: %+v", r)
	}
	// No WCTEMP reported: the drive's own temperature warning bit decides.
	f.ctrls["nvme0"] = fakeDrive{model: "A", tempK: 400, cw: 0x02}
	if r := probe(t, temp); r.Status != report.StatusTrue || !strings.Contains(r.Message, "reports its temperature outside its threshold (127°C)") {
		t.Errorf("warning bit: %+v", r)
	}
	// A configured threshold wins over WCTEMP.
	env.Config.Checks.DiskTemperatureHigh.ThresholdCelsius = 60
	temp, _ = newDiskTemp(env)
	f.ctrls["nvme0"] = fakeDrive{model: "A", wctempK: 363, tempK: 335}
	if r := probe(t, temp); r.Status != report.StatusTrue || r.Message != "nvme0 (A) is at 62°C, threshold 60°C" {
		t.Errorf("configured threshold: %+v", r)
	}
}

// The real reader under a made-up host root: no /sys/class/nvme (or an
// empty one) is "no drives", not an error; a controller whose device cannot
// be opened, or does not answer the admin ioctl, carries that error, and
// with no drive readable the NVMe checks fail instead of reporting health.
func TestRealNVMeReaderHostRoot(t *testing.T) {
	root := t.TempDir()
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	hs, err := readNVMeHealth(context.Background(), realNVMe{env: env}, &stuckCalls[NVMeHealth]{}, time.Minute)
	if err != nil || hs == nil || len(hs) != 0 {
		t.Fatalf("no /sys/class/nvme: %#v, %v; want an empty list, no error", hs, err)
	}
	mkdir(t, root+"/sys/class/nvme")
	if hs, err := readNVMeHealth(context.Background(), realNVMe{env: env}, &stuckCalls[NVMeHealth]{}, time.Minute); err != nil || len(hs) != 0 {
		t.Fatalf("empty /sys/class/nvme: %+v, %v", hs, err)
	}

	mkdir(t, root+"/sys/class/nvme/nvme1")
	mkdir(t, root+"/sys/class/nvme/nvme0")
	mkdir(t, root+"/dev")
	if err := os.Symlink("/dev/null", root+"/dev/nvme1"); err != nil { // opens, but is no NVMe controller
		t.Fatal(err)
	}
	hs, err = readNVMeHealth(context.Background(), realNVMe{env: env}, &stuckCalls[NVMeHealth]{}, time.Minute)
	if err != nil || len(hs) != 2 || hs[0].Controller != "nvme0" || hs[1].Controller != "nvme1" {
		t.Fatalf("two controllers: %+v, %v", hs, err)
	}
	if want := "open " + root + "/dev/nvme0: no such file or directory"; hs[0].Error != want {
		t.Errorf("nvme0 without a device: error %q, want %q", hs[0].Error, want)
	}
	// Identify (0x06) fails, and the SMART page (Get Log Page, 0x02) is
	// asked for all the same.
	if want := root + "/dev/nvme1: NVMe admin command 0x06: inappropriate ioctl for device"; hs[1].IdentifyError != want {
		t.Errorf("nvme1 on /dev/null: Identify error %q, want %q", hs[1].IdentifyError, want)
	}
	if want := root + "/dev/nvme1: NVMe admin command 0x02: inappropriate ioctl for device"; hs[1].Error != want {
		t.Errorf("nvme1 on /dev/null: error %q, want %q", hs[1].Error, want)
	}
	c, _ := newDisksFailureSMART(env)
	if _, err := c.Probe(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "no NVMe drive readable: ") {
		t.Errorf("DisksFailure with no drive readable: %v", err)
	}
}

// The real reader on this machine, against its own devices. Without NVMe
// controllers it answers "no drives" (an empty list, no error). With
// /dev/nvmeN, it reads each one over the admin ioctl (as root): a model and
// serial from Identify, and a SMART page with plausible values.
func TestRealNVMeReader(t *testing.T) {
	env := testEnv(t, nil)
	hs, err := readNVMeHealth(context.Background(), realNVMe{env: env}, &stuckCalls[NVMeHealth]{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := filepath.Glob("/dev/nvme*")
	var ctrls []string // /dev/nvmeN character devices: controllers (not namespaces nvmeNnM)
	for _, d := range devs {
		if fi, err := os.Stat(d); err == nil && fi.Mode()&os.ModeCharDevice != 0 && regexp.MustCompile(`^nvme[0-9]+$`).MatchString(filepath.Base(d)) {
			ctrls = append(ctrls, filepath.Base(d))
		}
	}
	if len(ctrls) == 0 {
		if len(hs) != 0 {
			testenv.Skip(t, fmt.Sprintf("no /dev/nvmeN, yet /sys/class/nvme lists %+v: devices hidden from this machine", hs))
		}
		if ok, bad := nvmeUnreadable(hs); len(ok) != 0 || len(bad) != 0 || drives(len(ok), "") != "no NVMe drives" {
			t.Errorf("no drives: %+v %v", ok, bad)
		}
		t.Log("no NVMe controller on this machine: no drives")
		return
	}
	got := map[string]NVMeHealth{}
	for _, h := range hs {
		got[h.Controller] = h
	}
	for _, c := range ctrls {
		h, ok := got[c]
		if !ok {
			t.Errorf("/dev/%s exists but the reader does not list it (it lists %+v)", c, hs)
			continue
		}
		if h.Error != "" && os.Geteuid() != 0 {
			testenv.Skip(t, fmt.Sprintf("%s: %s (the admin ioctl needs CAP_SYS_ADMIN)", c, h.Error))
		}
		t.Logf("%s: %+v", c, h)
		if h.Error != "" || h.Model == "" || h.Serial == "" || h.Firmware == "" {
			t.Errorf("%s: no model, serial or firmware read: %+v", c, h)
		}
		if h.TemperatureC != nil && (*h.TemperatureC < -40 || *h.TemperatureC > 150) || h.AvailableSpare > 100 || h.SpareThreshold > 100 {
			t.Errorf("%s: implausible SMART values: %+v", c, h)
		}
	}
}

// No NVMe drive on the node: wear and temperature measured nothing, so they
// are Unknown (NothingToCheck), never a fake False.
func TestDiskWearAndTemperatureWithoutDrives(t *testing.T) {
	env := nvmeEnv(t, &fakeNVMe{ctrls: map[string]fakeDrive{}})
	wear, _ := newDiskWear(env)
	temp, _ := newDiskTemp(env)
	for name, c := range map[string]Check{"wear": wear, "temperature": temp} {
		if r := probe(t, c); r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck || !strings.Contains(r.Message, "no NVMe drives") {
			t.Errorf("%s without drives: %+v", name, r)
		}
	}
}

// A drive whose SMART page cannot be read is not a healthy drive: the
// three NVMe checks say Unknown / CheckFailed naming it, unless another
// drive is past a threshold (True, naming the unreadable one too). A drive
// whose Identify fails is still read: its SMART page decides. Fails when
// readNVMeHealth skips SMART after a failed Identify (nvme1's read-only
// media is "not readable", DisksFailure Unknown, not True), or when an
// unreadable drive only adds a note to False as before (False/DisksHealthy).
func TestNVMeUnreadableDrive(t *testing.T) {
	const eio = "not readable: nvme1 (input/output error)"
	for _, tc := range []struct {
		name                   string
		drives                 map[string]fakeDrive
		failure, wear, temp    report.Status
		failMsg, wearMsg, tMsg string
	}{
		{name: "SMART EIO, the other drive healthy",
			drives:  map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 310, pct: 3}, "nvme1": {model: "B", smartErr: unix.EIO}},
			failure: report.StatusUnknown, failMsg: "1 NVMe drive without SMART critical warnings; " + eio,
			wear: report.StatusUnknown, wearMsg: "1 NVMe drive below 80% of rated endurance; " + eio,
			temp: report.StatusUnknown, tMsg: "1 NVMe drive within their temperature thresholds; " + eio},
		{name: "SMART EIO, the other drive past its thresholds",
			drives:  map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 350, pct: 90, cw: 1 << 3}, "nvme1": {model: "B", smartErr: unix.EIO}},
			failure: report.StatusTrue, failMsg: "nvme0 (A): SMART critical warning 0x08: media placed in read-only mode; " + eio,
			wear: report.StatusTrue, wearMsg: "nvme0 (A) has used 90% of its rated endurance (threshold 80%); " + eio,
			temp: report.StatusTrue, tMsg: "nvme0 (A) is at 77°C, threshold 70°C; " + eio},
		{name: "Identify EIO, its SMART page past the thresholds",
			drives:  map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 310, pct: 3}, "nvme1": {identifyErr: unix.EIO, tempK: 400, pct: 85, cw: 1<<3 | 1<<1}},
			failure: report.StatusTrue, failMsg: "nvme1: SMART critical warning 0x0a: media placed in read-only mode",
			wear: report.StatusTrue, wearMsg: "nvme1 has used 85% of its rated endurance (threshold 80%)",
			temp: report.StatusTrue, tMsg: "nvme1 reports its temperature outside its threshold (127°C)"},
		{name: "Identify EIO, its SMART page healthy",
			drives:  map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 310, pct: 3}, "nvme1": {identifyErr: unix.EIO, tempK: 310, pct: 3}},
			failure: report.StatusFalse, failMsg: "2 NVMe drives without SMART critical warnings",
			wear: report.StatusFalse, wearMsg: "2 NVMe drives below 80% of rated endurance",
			temp: report.StatusFalse, tMsg: "2 NVMe drives within their temperature thresholds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := nvmeEnv(t, &fakeNVMe{ctrls: tc.drives})
			for _, c := range []struct {
				cond   string
				status report.Status
				msg    string
			}{{"DisksFailure", tc.failure, tc.failMsg}, {"DiskWearHigh", tc.wear, tc.wearMsg}, {"DiskTemperatureHigh", tc.temp, tc.tMsg}} {
				chk, err := registry[c.cond](env)
				if err != nil {
					t.Fatal(err)
				}
				r := probe(t, chk)
				if d, _ := report.Lookup(c.cond); !d.ValidReason(r.Status, r.Reason) || r.Status != c.status || r.Message != c.msg {
					t.Errorf("%s: %s/%s %q\nwant %s %q", c.cond, r.Status, r.Reason, r.Message, c.status, c.msg)
				}
				if r.Status == report.StatusUnknown && r.Reason != report.ReasonCheckFailed {
					t.Errorf("%s: Unknown/%s, want CheckFailed", c.cond, r.Reason)
				}
			}
		})
	}
}

// hangingNVMe: nvme1's SMART read blocks until release is closed (a
// controller that does not answer: the kernel waits 60 s for an admin
// command, longer than the check's 30 s); calls counts those reads begun.
// mu guards the fake's drives, which the test changes while nvme1's read
// hangs on a goroutine of the check's.
type hangingNVMe struct {
	*fakeNVMe
	mu      sync.Mutex
	release chan struct{}
	calls   atomic.Int32
}

func (h *hangingNVMe) Identify(c string) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fakeNVMe.Identify(c)
}

func (h *hangingNVMe) SMART(c string) ([]byte, error) {
	if c == "nvme1" {
		h.calls.Add(1)
		<-h.release
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fakeNVMe.SMART(c)
}

// A drive that does not answer costs itself only: the run returns after
// half the check's timeout (15 s) with nvme0's critical warning True and
// nvme1 named as not read; the next run does not ask nvme1 again while
// its command has not returned (one goroutine stuck, not one per run), and
// reads it once it has. Fails when the drives are read in the probe's
// goroutine (Unknown/CheckTimeout after 30 s, nvme0's warning lost), or
// when a stuck drive is asked again every run (3 reads hung, not 1).
func TestNVMeHungDriveKeepsTheOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A", tempK: 310, cw: 1 << 3}, "nvme1": {model: "B", tempK: 310}}}
		n := &hangingNVMe{fakeNVMe: f, release: make(chan struct{})}
		env := testEnv(t, nil)
		env.NVMe = n
		store := report.NewStore("b")
		store.SetPart(report.SourceKmsg, report.Condition{Type: "DisksFailure", Status: report.StatusFalse, Reason: "DisksHealthy", Message: "the kernel logged 0 disk I/O errors"}, time.Now())
		r, err := NewRunner(env, Options{Store: store, Only: []string{"DisksFailure"}})
		if err != nil {
			t.Fatal(err)
		}
		const hung = "; not readable: nvme1 (no answer within 15s: admin command hung; read again once it answers)"
		run := func(wantTook time.Duration, status report.Status, msg string) {
			t.Helper()
			start := time.Now()
			r.RunOnce(t.Context())
			c, _ := store.Part(report.SourceCheck, "DisksFailure")
			if took := time.Since(start); took != wantTook || c.Status != status || c.Message != msg {
				t.Errorf("run took %s: SMART part %s/%s %q\nwant %s: %s %q", took, c.Status, c.Reason, c.Message, wantTook, status, msg)
			}
		}
		run(15*time.Second, report.StatusTrue, "nvme0 (A): SMART critical warning 0x08: media placed in read-only mode"+hung)
		n.mu.Lock()
		f.ctrls["nvme0"] = fakeDrive{model: "A", tempK: 310}
		n.mu.Unlock()
		run(0, report.StatusUnknown, "1 NVMe drive without SMART critical warnings"+hung)
		run(0, report.StatusUnknown, "1 NVMe drive without SMART critical warnings"+hung)
		if c, _ := store.Get("DisksFailure"); c.Status == report.StatusFalse {
			t.Errorf("DisksFailure %s/%s %q with nvme1 not answering", c.Status, c.Reason, c.Message)
		}
		if got := n.calls.Load(); got != 1 {
			t.Errorf("nvme1's SMART read %d times over 3 runs while the first hung, want once", got)
		}
		close(n.release)
		synctest.Wait()
		run(0, report.StatusFalse, "2 NVMe drives without SMART critical warnings")
		if got := n.calls.Load(); got != 2 {
			t.Errorf("nvme1's SMART read %d times in all, want 2", got)
		}
	})
}

// The reviewer's case: a reload that changes DisksFailure's settings
// builds the check again (Runner.Apply), and the new instance must see the
// old one's hung SMART read, or each reload starts another hung call on
// the same drive (4 after 3 reloads). The record is Env's (Env.Stuck), and
// the Env of a reload is a copy of the old one. Fails when the check keeps
// its own record (newNVMeReader ignoring Env.Stuck): nvme1 read 4 times.
func TestNVMeHungDriveAskedOnceAcrossReloads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A", tempK: 310}, "nvme1": {model: "B", tempK: 310}}}
		n := &hangingNVMe{fakeNVMe: f, release: make(chan struct{})}
		env := testEnv(t, nil)
		env.NVMe, env.Stuck = n, &StuckCalls{}
		store := report.NewStore("b")
		r, err := NewRunner(env, Options{Store: store, Only: []string{"DisksFailure"}})
		if err != nil {
			t.Fatal(err)
		}
		r.RunOnce(t.Context())
		for i := range 3 {
			next := *env
			cfg := *env.Config
			cfg.Checks.DisksFailure.Interval = config.Duration{Duration: time.Duration(2+i) * time.Minute}
			next.Config = &cfg
			if a, err := r.Apply(&next); err != nil || len(a.Changed) != 1 {
				t.Fatalf("Apply: %+v, %v; want DisksFailure changed", a, err)
			}
			r.RunOnce(t.Context())
			if c, _ := store.Part(report.SourceCheck, "DisksFailure"); !strings.Contains(c.Message, "nvme1 (no answer within 15s") {
				t.Errorf("after reload %d: %s %q, want nvme1 named as hung", i+1, c.Status, c.Message)
			}
		}
		if got := n.calls.Load(); got != 1 {
			t.Errorf("nvme1's SMART read %d times over 4 runs and 3 reloads while the first hung, want once", got)
		}
		close(n.release)
		synctest.Wait()
		r.RunOnce(t.Context())
		if c, _ := store.Part(report.SourceCheck, "DisksFailure"); c.Status != report.StatusFalse || n.calls.Load() != 2 {
			t.Errorf("after nvme1 answered: %s %q, nvme1 read %d times in all, want False and 2", c.Status, c.Message, n.calls.Load())
		}
	})
}

// slowNVMe: every SMART read takes delay; nvme1's hangs until release is
// closed. smart counts the SMART reads begun per controller.
type slowNVMe struct {
	*fakeNVMe
	delay   time.Duration
	release chan struct{}
	mu      sync.Mutex
	smart   map[string]int
}

func (s *slowNVMe) SMART(c string) ([]byte, error) {
	s.mu.Lock()
	s.smart[c]++
	s.mu.Unlock()
	time.Sleep(s.delay)
	if c == "nvme1" {
		<-s.release
	}
	return s.fakeNVMe.SMART(c)
}

func (s *slowNVMe) reads(c string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.smart[c]
}

// DisksFailure, DiskWearHigh and DiskTemperatureHigh read the same drives:
// one hung drive costs one call, not one per check, and the checks that
// run at the same time (the runner's grid wakes them together) share each
// drive's answer instead of taking a drive that is being read by another
// check for a hung one. Fails when each check keeps its own record (nvme1
// read 3 times), or when a call running for another check counts as stuck
// without being waited for (nvme0, which answers in 1 s, reported hung).
func TestNVMeChecksShareOneCallPerDrive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &slowNVMe{fakeNVMe: &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 310, pct: 3}, "nvme1": {model: "B", tempK: 310}}},
			delay: time.Second, release: make(chan struct{}), smart: map[string]int{}}
		env := testEnv(t, nil)
		env.NVMe, env.Stuck = n, &StuckCalls{}
		var chks []Check
		for _, cond := range []string{"DisksFailure", "DiskWearHigh", "DiskTemperatureHigh"} {
			c, err := registry[cond](env)
			if err != nil {
				t.Fatal(err)
			}
			chks = append(chks, c)
		}
		const hung = "; not readable: nvme1 (no answer within 15s: admin command hung; read again once it answers)"
		want := []string{
			"1 NVMe drive without SMART critical warnings" + hung,
			"1 NVMe drive below 80% of rated endurance" + hung,
			"1 NVMe drive within their temperature thresholds" + hung,
		}
		probeAll := func(together bool, wantTook time.Duration) {
			t.Helper()
			start := time.Now()
			got := make([]Result, len(chks))
			errs := make([]error, len(chks))
			var wg sync.WaitGroup
			for i, c := range chks {
				if together {
					wg.Go(func() { got[i], errs[i] = c.Probe(context.Background()) })
				} else {
					got[i], errs[i] = c.Probe(context.Background())
				}
			}
			wg.Wait()
			if took := time.Since(start); took != wantTook {
				t.Errorf("the three checks took %s, want %s", took, wantTook)
			}
			for i, r := range got {
				if errs[i] != nil || r.Status != report.StatusUnknown || r.Message != want[i] {
					t.Errorf("check %d: %s %q, %v\nwant Unknown %q", i, r.Status, r.Message, errs[i], want[i])
				}
			}
		}
		probeAll(true, 15*time.Second)
		if n.reads("nvme0") != 1 || n.reads("nvme1") != 1 {
			t.Errorf("three checks at once read nvme0 %d times and nvme1 %d times, want once each", n.reads("nvme0"), n.reads("nvme1"))
		}
		// The next runs, one after another: nvme0 read by each, nvme1 not
		// asked again while its read hangs.
		probeAll(false, 3*time.Second)
		if n.reads("nvme0") != 4 || n.reads("nvme1") != 1 {
			t.Errorf("nvme0 read %d times, nvme1 %d times in all, want 4 and 1", n.reads("nvme0"), n.reads("nvme1"))
		}
		close(n.release)
		synctest.Wait()
	})
}

// countingNVMe counts the SMART reads per controller.
type countingNVMe struct {
	*fakeNVMe
	mu    sync.Mutex
	smart map[string]int
}

func (c *countingNVMe) SMART(ctrl string) ([]byte, error) {
	c.mu.Lock()
	c.smart[ctrl]++
	c.mu.Unlock()
	return c.fakeNVMe.SMART(ctrl)
}

// A drive whose Identify fails with EIO answered: its SMART page is asked
// all the same (a drive may fail one command and serve another; ENOENT and
// ENOTTY too: TestRealNVMeReaderHostRoot). One whose Identify timed out
// (the privileged helper's deadline while the helper's ioctl still hangs;
// the kernel's ETIMEDOUT, or its EINTR for a command its timeout cancelled)
// or never reached it (the helper's socket
// refused, no answer from it) is not: SMART would be a second hung call on
// the drive, with the helper a second of its slots. Fails when SMART is
// asked after any Identify error (nvme1-5 read), or after EINTR (nvme5).
func TestNVMeSMARTNotAskedAfterAnIdentifyTimeout(t *testing.T) {
	timeout := fmt.Errorf("privileged helper at /run/autopilot-health/privileged.sock: %w",
		&net.OpError{Op: "read", Net: "unix", Err: os.ErrDeadlineExceeded})
	refused := fmt.Errorf("privileged helper: %w",
		&net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	noAnswer := errors.New("privileged helper at /run/autopilot-health/privileged.sock: no answer (refused, or it stopped)")
	kernelTimeout := fmt.Errorf("/dev/nvme4: NVMe admin command 0x06: %w", unix.ETIMEDOUT)
	// The kernel's answer to a passthrough command its timeout cancelled.
	cancelled := fmt.Errorf("/dev/nvme5: NVMe admin command 0x06: %w", unix.EINTR)
	n := &countingNVMe{fakeNVMe: &fakeNVMe{ctrls: map[string]fakeDrive{
		"nvme0": {identifyErr: fmt.Errorf("/dev/nvme0: NVMe admin command 0x06: %w", unix.EIO), tempK: 310},
		"nvme1": {identifyErr: timeout, tempK: 310},
		"nvme2": {identifyErr: refused, tempK: 310},
		"nvme3": {identifyErr: noAnswer, tempK: 310},
		"nvme4": {identifyErr: kernelTimeout, tempK: 310},
		"nvme5": {identifyErr: cancelled, tempK: 310},
	}}, smart: map[string]int{}}
	hs, err := readNVMeHealth(context.Background(), n, &stuckCalls[NVMeHealth]{}, time.Minute)
	if err != nil || len(hs) != 6 {
		t.Fatalf("readNVMeHealth: %+v, %v", hs, err)
	}
	if hs[0].Error != "" || hs[0].temperature() != "37°C" || !strings.Contains(hs[0].IdentifyError, "input/output error") {
		t.Errorf("nvme0 (Identify EIO): %+v, want its SMART page read", hs[0])
	}
	for i, cause := range []error{timeout, refused, noAnswer, kernelTimeout, cancelled} {
		h := hs[i+1]
		if want := "SMART page not asked: Identify failed: " + cause.Error(); h.Error != want {
			t.Errorf("%s: error %q\nwant %q", h.Controller, h.Error, want)
		}
	}
	if n.smart["nvme0"] != 1 || len(n.smart) != 1 {
		t.Errorf("SMART read %v, want nvme0 once and none of nvme1-5 (Identify timed out or did not reach the drive)", n.smart)
	}
}

// A drive whose controller completes Identify with an NVMe error status
// (the kernel returns the status, not an errno: an internal error, a
// field it refuses) answered, as one that fails it with EIO did: its
// SMART page is asked all the same, and its critical warning decides
// DisksFailure (the privileged helper hands the status back:
// TestNVMeStatusThroughTheHelper). Fails when such
// an Identify is taken for a timeout: nvme1 is "not readable" ("SMART page
// not asked") and DisksFailure is Unknown, its read-only warning unseen.
func TestNVMeSMARTAskedAfterAnIdentifyStatus(t *testing.T) {
	status := &hostio.NVMeStatusError{Dev: "/dev/nvme1", Opcode: 0x06, Status: 0x4006} // internal error, do not retry
	n := &countingNVMe{fakeNVMe: &fakeNVMe{ctrls: map[string]fakeDrive{
		"nvme0": {model: "A", wctempK: 343, tempK: 310},
		"nvme1": {identifyErr: status, tempK: 310, cw: 1 << 3},
	}}, smart: map[string]int{}}
	env := testEnv(t, nil)
	env.NVMe = n
	c, _ := newDisksFailureSMART(env)
	if r := probe(t, c); r.Status != report.StatusTrue || r.Reason != report.ReasonNVMeCriticalWarning ||
		r.Message != "nvme1: SMART critical warning 0x08: media placed in read-only mode" {
		t.Errorf("Identify answered with status 0x4006: %s/%s %q, want True/NVMeCriticalWarning from its SMART page", r.Status, r.Reason, r.Message)
	}
	if n.smart["nvme1"] != 1 {
		t.Errorf("nvme1's SMART page read %d times, want once", n.smart["nvme1"])
	}
}

// Identify's text fields padded with NUL bytes (some firmware does, the
// spec says spaces) or holding other bytes read as printable text.
func TestIdentifyTextIsPrintable(t *testing.T) {
	id := make([]byte, 4096)
	copy(id[4:24], "S5GXNX0T12345\x00\x00\x00\x00\x00\x00\x00")
	copy(id[24:64], "Samsung SSD 980 PRO\x01 1TB\x00\x00\x00")
	copy(id[64:72], "5B2QGXA7")
	var h NVMeHealth
	if err := ParseIdentify(&h, id); err != nil {
		t.Fatal(err)
	}
	if h.Serial != "S5GXNX0T12345" || h.Model != "Samsung SSD 980 PRO? 1TB" || h.Firmware != "5B2QGXA7" {
		t.Errorf("serial %q, model %q, firmware %q", h.Serial, h.Model, h.Firmware)
	}
}

// FuzzNVMePages: whatever a drive answers to Identify and to the SMART log
// page, parsing is an error (a page too short) or values, never a panic;
// the Identify text fields are printable ASCII (no NUL or control byte for
// a message).
func FuzzNVMePages(f *testing.F) {
	d := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "QEMU NVMe Ctrl", wctempK: 343, tempK: 323, cw: 0x05, spare: 0, pct: 3}}}
	id, _ := d.Identify("nvme0")
	smart, _ := d.SMART("nvme0")
	f.Add(id, smart)
	f.Add([]byte{}, make([]byte, 511))
	f.Fuzz(func(t *testing.T, id, smart []byte) {
		var h NVMeHealth
		if err := ParseIdentify(&h, id); (err == nil) != (len(id) >= 4096) {
			t.Fatalf("Identify page of %d bytes: %v", len(id), err)
		}
		if err := ParseSMART(&h, smart); (err == nil) != (len(smart) >= 512) {
			t.Fatalf("SMART page of %d bytes: %v", len(smart), err)
		}
		h.name()
		for _, v := range []string{h.Model, h.Serial, h.Firmware} {
			for _, c := range []byte(v) {
				if c < 0x20 || c > 0x7e {
					t.Fatalf("Identify text %q holds byte %#x", v, c)
				}
			}
		}
	})
}

// A composite temperature of 0 K is a drive that does not report its
// temperature (AWS's EBS and Oxide's propolis answer 0; smartctl
// prints "-"), not one at -273 °C: DiskTemperatureHigh does not count it
// "within its thresholds", names it, and is Unknown / NothingToCheck when no
// drive reports a temperature; its own warning bit still decides; the
// disks report leaves its temperature out. Fails when 0 K is read as
// -273 °C (False "1 NVMe drive within their temperature thresholds",
// "temperatureC":-273).
func TestDiskTemperatureNotReported(t *testing.T) {
	for _, tc := range []struct {
		name      string
		threshold int
		drives    map[string]fakeDrive
		status    report.Status
		reason    report.Reason
		msg       string
	}{
		{name: "the only drive reports none",
			drives: map[string]fakeDrive{"nvme0": {model: "Amazon Elastic Block Store"}},
			status: report.StatusUnknown, reason: report.ReasonNothingToCheck,
			msg: "no NVMe drive reports its temperature (composite temperature 0 K): nvme0 (Amazon Elastic Block Store)"},
		{name: "the only drive reports none, a threshold configured", threshold: 60,
			drives: map[string]fakeDrive{"nvme0": {model: "Amazon Elastic Block Store"}},
			status: report.StatusUnknown, reason: report.ReasonNothingToCheck,
			msg: "no NVMe drive reports its temperature (composite temperature 0 K): nvme0 (Amazon Elastic Block Store)"},
		{name: "another drive measured",
			drives: map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 310}, "nvme1": {model: "B"}},
			status: report.StatusFalse, reason: report.ReasonDiskTemperatureOK,
			msg: "1 NVMe drive within their temperature thresholds; no temperature reported: nvme1 (B)"},
		{name: "its warning bit set",
			drives: map[string]fakeDrive{"nvme0": {model: "A", wctempK: 343, tempK: 310}, "nvme1": {model: "B", cw: 1 << 1}},
			status: report.StatusTrue, reason: report.ReasonTemperatureAboveThreshold,
			msg: "nvme1 (B) reports its temperature outside its threshold (temperature not reported)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := nvmeEnv(t, &fakeNVMe{ctrls: tc.drives})
			env.Config.Checks.DiskTemperatureHigh.ThresholdCelsius = tc.threshold
			c, _ := newDiskTemp(env)
			if r := probe(t, c); r.Status != tc.status || r.Reason != tc.reason || r.Message != tc.msg {
				t.Errorf("%s/%s %q\nwant %s/%s %q", r.Status, r.Reason, r.Message, tc.status, tc.reason, tc.msg)
			}
		})
	}
	f := &fakeNVMe{ctrls: map[string]fakeDrive{"nvme0": {model: "A"}}}
	d, _ := newDisksFailureSMART(nvmeEnv(t, f))
	r := probe(t, d)
	b, err := json.Marshal(r.Details[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "temperatureC") {
		t.Errorf("disks report of a drive at 0 K: %s, want no temperatureC", b)
	}
}

// The controllers of NVMe over Fabrics (transport tcp, rdma, fc, loop: a
// volume of a storage array or of Longhorn's or Mayastor's SPDK target,
// attached over the network) are not this node's drives: their SMART page
// is the target's, shared by every node attached to it, and a controller
// that is reconnecting answers "host path error", which would make the
// three checks Unknown on each of those nodes. Only the local controllers
// (pcie, or a transport not known as a fabric) are read. Fails when every
// entry of /sys/class/nvme is listed (nvme1-nvme4 too).
func TestNVMeFabricsControllersAreNotDrives(t *testing.T) {
	root := t.TempDir()
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	for name, transport := range map[string]string{"nvme0": "pcie", "nvme1": "tcp", "nvme2": "rdma", "nvme3": "fc", "nvme4": "loop", "nvme5": "apple-nvme"} {
		writeFile(t, root+"/sys/class/nvme/"+name+"/transport", transport+"\n")
	}
	mkdir(t, root+"/sys/class/nvme/nvme6") // no transport attribute: kept
	got, err := realNVMe{env: env}.Controllers()
	if want := []string{"nvme0", "nvme5", "nvme6"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("controllers %v, %v; want %v", got, err, want)
	}
	// The kernel log monitor leaves the same controllers' I/O errors out
	// of DisksFailure.
	if !slices.Equal(fabricsTransports, kmsg.FabricsTransports) {
		t.Errorf("fabrics transports %q, the kernel log monitor's %q", fabricsTransports, kmsg.FabricsTransports)
	}
}
