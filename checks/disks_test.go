package checks

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/config"

	"github.com/syself/autopilot-health/report"
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
}

func (f *fakeNVMe) Controllers() ([]string, error) {
	var out []string
	for _, name := range []string{"nvme0", "nvme1", "nvme2"} {
		if _, ok := f.ctrls[name]; ok {
			out = append(out, name)
		}
	}
	return out, f.err
}

func (f *fakeNVMe) Identify(c string) ([]byte, error) {
	d := f.ctrls[c]
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
	hs, err := readNVMeHealth(f)
	if err != nil || len(hs) != 1 {
		t.Fatal(hs, err)
	}
	h := hs[0]
	want := NVMeHealth{Controller: "nvme0", Model: "QEMU NVMe Ctrl", Serial: "SN-nvme0", Firmware: "1.0", CriticalWarning: 5,
		TemperatureC: 50, WarningTempC: 70, CriticalTempC: 80, AvailableSpare: 0, SpareThreshold: 10, PercentageUsed: 3, PowerOnHours: 12345, MediaErrors: 7}
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
	hs, err := readNVMeHealth(realNVMe{env: env})
	if err != nil || hs == nil || len(hs) != 0 {
		t.Fatalf("no /sys/class/nvme: %#v, %v; want an empty list, no error", hs, err)
	}
	mkdir(t, root+"/sys/class/nvme")
	if hs, err := readNVMeHealth(realNVMe{env: env}); err != nil || len(hs) != 0 {
		t.Fatalf("empty /sys/class/nvme: %+v, %v", hs, err)
	}

	mkdir(t, root+"/sys/class/nvme/nvme1")
	mkdir(t, root+"/sys/class/nvme/nvme0")
	mkdir(t, root+"/dev")
	if err := os.Symlink("/dev/null", root+"/dev/nvme1"); err != nil { // opens, but is no NVMe controller
		t.Fatal(err)
	}
	hs, err = readNVMeHealth(realNVMe{env: env})
	if err != nil || len(hs) != 2 || hs[0].Controller != "nvme0" || hs[1].Controller != "nvme1" {
		t.Fatalf("two controllers: %+v, %v", hs, err)
	}
	if want := "open " + root + "/dev/nvme0: no such file or directory"; hs[0].Error != want {
		t.Errorf("nvme0 without a device: error %q, want %q", hs[0].Error, want)
	}
	if want := root + "/dev/nvme1: NVMe admin command 0x06: inappropriate ioctl for device"; hs[1].Error != want {
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
	hs, err := readNVMeHealth(realNVMe{env: env})
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
			t.Skipf("no /dev/nvmeN, yet /sys/class/nvme lists %+v: devices hidden from this machine", hs)
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
			t.Skipf("%s: %s (the admin ioctl needs CAP_SYS_ADMIN)", c, h.Error)
		}
		t.Logf("%s: %+v", c, h)
		if h.Error != "" || h.Model == "" || h.Serial == "" || h.Firmware == "" {
			t.Errorf("%s: no model, serial or firmware read: %+v", c, h)
		}
		if h.TemperatureC < -40 || h.TemperatureC > 150 || h.AvailableSpare > 100 || h.SpareThreshold > 100 {
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
