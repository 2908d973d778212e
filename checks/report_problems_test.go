package checks

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"golang.org/x/sys/unix"
)

// A report list cut to 32 entries keeps the entry its condition names: the
// certificate about to expire after 39 that are not present, the full
// filesystem after 39 that are not. Fails when the entries do not say they
// are a problem (report.Problem): the first 32 are kept.
func TestReportListCutKeepsTheProblemEntries(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	document := func(t *testing.T, ds []report.Detail, domain string) map[string]json.RawMessage {
		t.Helper()
		d := report.NewDetails()
		for _, x := range ds {
			d.Set(x)
		}
		docs, err := d.Documents(now, report.RoleWorker)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(docs[report.AnnotationPrefix+domain]), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}

	t.Run("certs", func(t *testing.T) {
		root := t.TempDir()
		var paths []string
		for i := range 40 {
			paths = append(paths, fmt.Sprintf("/etc/pki/c%02d.pem", i))
		}
		leaf := newCertFixture(t, "expiring", now.Add(48*time.Hour), false, nil)
		writeCertFile(t, root+paths[39], leaf.certPEM())
		env := testEnv(t, func(c *config.Config) {
			c.HostRoot = root
			c.Checks.CertRenewalFailing.Certificates = paths
		})
		env.Now = func() time.Time { return now }
		c, _ := newCertCheck(env)
		r, err := c.Probe(context.Background())
		if err != nil || r.Reason != report.ReasonCertificateExpiringSoon {
			t.Fatalf("got %s/%s %q, error %v", r.Status, r.Reason, r.Message, err)
		}
		m := document(t, r.Details, "certs")
		var certs []CertInfo
		json.Unmarshal(m["certs"], &certs)
		if len(certs) != report.MaxListLen || string(m["certsTruncated"]) != "8" || certs[len(certs)-1].Path != paths[39] {
			t.Errorf("certs document keeps %d certificates (last %+v), %s left out; want the expiring %s kept", len(certs), certs[len(certs)-1], m["certsTruncated"], paths[39])
		}
	})

	t.Run("filesystems", func(t *testing.T) {
		root := t.TempDir()
		var mi strings.Builder
		sys := &fakeSys{statfs: map[string]unix.Statfs_t{}}
		for i := range 40 {
			mp := fmt.Sprintf("/m%02d", i)
			fmt.Fprintf(&mi, "%d 1 8:%d / %s rw,relatime shared:1 - ext4 /dev/sd%d rw\n", 100+i, i, mp, i)
			used := uint64(20)
			if i == 39 {
				used = 95
			}
			sys.statfs[root+mp] = st(1000, used, 100, 5)
		}
		writeFile(t, root+"/proc/self/mountinfo", mi.String())
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.Sys = sys
		c, err := newDiskUsageCheck(env)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.Probe(context.Background())
		if err != nil || r.Reason != report.ReasonFilesystemSpaceHigh {
			t.Fatalf("got %s/%s %q, error %v", r.Status, r.Reason, r.Message, err)
		}
		m := document(t, r.Details, "storage")
		var fss []FSUsage
		json.Unmarshal(m["filesystems"], &fss)
		if len(fss) != report.MaxListLen || string(m["filesystemsTruncated"]) != "8" || fss[len(fss)-1].MountPoint != "/m39" {
			t.Errorf("storage document keeps %d filesystems (last %+v), %s left out; want the full /m39 kept", len(fss), fss[len(fss)-1], m["filesystemsTruncated"])
		}
	})

	// ServiceNotRecovering names a critical unit restarted 3 times since
	// its last run: it is active again (flapping), not failed.
	t.Run("flapping critical unit", func(t *testing.T) {
		var units []string
		var states []systemd.Unit
		for i := range 40 {
			units = append(units, fmt.Sprintf("crit%02d.service", i))
			states = append(states, running(units[i]))
		}
		m := newFakeManager(states...)
		env := testEnv(t, func(c *config.Config) { c.Checks.ServiceNotRecovering.WorkerUnits = units })
		env.Systemd = m
		env.Units = NewUnitWatch(nil, nil)
		c, _ := newServiceNotRecovering(env)
		if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
			t.Fatalf("baseline: %+v %v", r, err)
		}
		m.crash(units[39], 3)
		r, err := c.Probe(context.Background())
		if err != nil || r.Reason != report.ReasonUnitFlapping {
			t.Fatalf("got %s/%s %q, error %v", r.Status, r.Reason, r.Message, err)
		}
		m2 := document(t, r.Details, "services")
		var got []systemd.Unit
		json.Unmarshal(m2["services"], &got)
		if len(got) != report.MaxListLen || string(m2["servicesTruncated"]) != "8" || got[len(got)-1].Name != units[39] {
			t.Errorf("services document keeps %d critical units (last %+v), %s left out; want %s, which the condition names, kept",
				len(got), got[len(got)-1], m2["servicesTruncated"], units[39])
		}
	})

	// NodeServiceDown names an operability unit that is not active, failed
	// or not: one stopped (inactive/dead) or not installed is its cause.
	t.Run("operability units", func(t *testing.T) {
		var units []string
		var states []systemd.Unit
		for i := range 40 {
			units = append(units, fmt.Sprintf("op%02d.service", i))
			states = append(states, running(units[i]))
		}
		states[38].ActiveState, states[38].SubState = "inactive", "dead"
		states[39].LoadState, states[39].ActiveState, states[39].SubState = "not-found", "inactive", "dead"
		env := testEnv(t, func(c *config.Config) { c.Checks.NodeServiceDown.WorkerUnits = units })
		env.Systemd = newFakeManager(states...)
		c, _ := newNodeServiceDown(env)
		r, err := c.Probe(context.Background())
		if err != nil || r.Reason != report.ReasonUnitNotActive {
			t.Fatalf("got %s/%s %q, error %v", r.Status, r.Reason, r.Message, err)
		}
		m := document(t, r.Details, "services")
		var got []systemd.Unit
		json.Unmarshal(m["operabilityServices"], &got)
		if len(got) != report.MaxListLen || string(m["operabilityServicesTruncated"]) != "8" ||
			got[len(got)-2].Name != units[38] || got[len(got)-1].Name != units[39] {
			t.Errorf("services document keeps %d operability units (last two %+v), %s left out; want %s and %s, which the condition names, kept",
				len(got), got[len(got)-2:], m["operabilityServicesTruncated"], units[38], units[39])
		}
	})
}

// manyNVMe is a node with more NVMe controllers than fakeNVMe lists.
type manyNVMe struct {
	*fakeNVMe
	names []string
}

func (m manyNVMe) Controllers() ([]string, error) { return m.names, nil }

// The disks list cut to 32 entries keeps every drive a disks condition
// names, not only those with a SMART critical warning: of 40 drives, the
// worn one DiskWearHigh names (percentage used at its threshold) and the
// hot one DiskTemperatureHigh names (at its configured threshold_celsius,
// under its own WCTEMP) are in the disks document the conditions point to.
// Fails when the disks check does not mark them: the first 32 are kept.
func TestDisksListCutKeepsTheDrivesTheConditionsName(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	f := &fakeNVMe{ctrls: map[string]fakeDrive{}}
	var names []string
	for i := range 40 {
		c := fmt.Sprintf("nvme%d", i)
		names = append(names, c)
		// 40°C, WCTEMP 85°C, 10% used.
		f.ctrls[c] = fakeDrive{model: "M", wctempK: 273 + 85, tempK: 273 + 40, spare: 100, pct: 10}
	}
	worn, hot := f.ctrls["nvme37"], f.ctrls["nvme39"]
	worn.pct = 80 // the default percentage_used_threshold
	hot.tempK = 273 + 72
	f.ctrls["nvme37"], f.ctrls["nvme39"] = worn, hot
	env := testEnv(t, func(c *config.Config) { c.Checks.DiskTemperatureHigh.ThresholdCelsius = 70 })
	env.NVMe = manyNVMe{f, names}

	// The conditions name them.
	wear, _ := newDiskWear(env)
	if r := probe(t, wear); r.Reason != report.ReasonEnduranceMostlyUsed || !strings.Contains(r.Message, "nvme37 ") {
		t.Fatalf("DiskWearHigh: %s/%s %q", r.Status, r.Reason, r.Message)
	}
	temp, _ := newDiskTemp(env)
	if r := probe(t, temp); r.Reason != report.ReasonTemperatureAboveThreshold || !strings.Contains(r.Message, "nvme39 ") {
		t.Fatalf("DiskTemperatureHigh: %s/%s %q", r.Status, r.Reason, r.Message)
	}

	smart, _ := newDisksFailureSMART(env)
	r := probe(t, smart)
	d := report.NewDetails()
	for _, x := range r.Details {
		d.Set(x)
	}
	docs, err := d.Documents(now, report.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Disks          []NVMeHealth `json:"disks"`
		DisksTruncated int          `json:"disksTruncated"`
	}
	if err := json.Unmarshal([]byte(docs[report.AnnotationPrefix+"disks"]), &doc); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, h := range doc.Disks {
		kept = append(kept, h.Controller)
	}
	if len(kept)+doc.DisksTruncated != 40 || !slices.Contains(kept, "nvme37") || !slices.Contains(kept, "nvme39") {
		t.Errorf("disks document keeps %v (%d left out); want nvme37 (worn, DiskWearHigh) and nvme39 (hot, DiskTemperatureHigh) kept", kept, doc.DisksTruncated)
	}
}

// The entries of the report's lists that know they are a problem.
func TestReportEntriesKnowTheirProblems(t *testing.T) {
	temp := func(c int) *int { return &c }
	for _, tc := range []struct {
		name  string
		entry report.Problem
		want  bool
	}{
		{"healthy drive", NVMeHealth{Controller: "nvme0", TemperatureC: temp(40), WarningTempC: 70}, false},
		{"drive with a critical warning", NVMeHealth{Controller: "nvme5", CriticalWarning: 1 << 2}, true},
		{"drive with the temperature warning", NVMeHealth{Controller: "nvme5", CriticalWarning: 1 << 1}, true},
		{"drive at its WCTEMP", NVMeHealth{Controller: "nvme5", TemperatureC: temp(70), WarningTempC: 70}, true},
		{"drive not read", NVMeHealth{Controller: "nvme5", Error: "timed out"}, true},
		{"drive without temperature", NVMeHealth{Controller: "nvme0", WarningTempC: 70}, false},
		{"drive DiskWearHigh or DiskTemperatureHigh names", NVMeHealth{Controller: "nvme5", OverThreshold: true}, true},
		{"certificate valid", CertInfo{Path: "/a.pem", DaysLeft: 300}, false},
		{"certificate not present", CertInfo{Path: "/a.pem", Error: "not present"}, false},
		{"certificate unreadable", CertInfo{Path: "/a.pem", Error: "no certificate in the file"}, true},
		{"certificate expiring", CertInfo{Path: "/a.pem", DaysLeft: 2, Expiring: true}, true},
		{"filesystem", FSUsage{MountPoint: "/"}, false},
		{"filesystem over its threshold", FSUsage{MountPoint: "/", OverThreshold: true}, true},
		{"filesystem not measured", FSUsage{MountPoint: "/srv", Error: "statfs: input/output error"}, true},
		{"volume group", VGUsage{Name: "vg0"}, false},
		{"volume group over its threshold", VGUsage{Name: "vg0", OverThreshold: true}, true},
		{"unit active", systemd.Unit{Name: "kubelet.service", ActiveState: "active"}, false},
		{"unit failed", systemd.Unit{Name: "kubelet.service", ActiveState: "failed"}, true},
		{"service failed", ServiceState{Unit: systemd.Unit{Name: "containerd.service", ActiveState: "failed"}}, true},
		{"service activating", ServiceState{Unit: systemd.Unit{Name: "containerd.service", ActiveState: "activating"}}, false},
		{"service flapping or not helped by its repairs", ServiceState{Unit: systemd.Unit{Name: "containerd.service", ActiveState: "active"}, NotRecovering: true}, true},
		{"operability unit active", OperabilityUnit{Unit: systemd.Unit{Name: "syself-tunnel-agent.service", ActiveState: "active"}}, false},
		{"operability unit down", OperabilityUnit{Unit: systemd.Unit{Name: "syself-tunnel-agent.service", ActiveState: "inactive"}, Down: true}, true},
	} {
		if got := tc.entry.Problem(); got != tc.want {
			t.Errorf("%s: Problem() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The disks check marks the drives by DiskWearHigh's and
// DiskTemperatureHigh's settings: a reload that changes one of them builds
// it again, as a change of its own table does, so that it does not keep
// marking by the thresholds of the file before. Fails when its settings are
// its table alone: Apply keeps its instance.
func TestReloadOfADiskThresholdRebuildsTheDisksCheck(t *testing.T) {
	only := []string{"DisksFailure", "DiskWearHigh", "DiskTemperatureHigh"}
	env := testEnv(t, nil)
	env.NVMe = &fakeNVMe{}
	r, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: only})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(c *config.Config)
		want   []string
	}{
		{"wear threshold", func(c *config.Config) { c.Checks.DiskWearHigh.PercentageUsedThreshold = 90 }, []string{"DisksFailure", "DiskWearHigh"}},
		{"temperature threshold", func(c *config.Config) { c.Checks.DiskTemperatureHigh.ThresholdCelsius = 60 }, []string{"DisksFailure", "DiskTemperatureHigh"}},
		{"temperature check disabled", func(c *config.Config) { c.Checks.DiskTemperatureHigh.Enabled = false }, []string{"DisksFailure"}},
		{"the others' intervals", func(c *config.Config) {
			c.Checks.DiskWearHigh.Interval = config.Duration{Duration: time.Hour}
			c.Checks.DiskTemperatureHigh.Interval = config.Duration{Duration: time.Hour}
		}, []string{"DiskWearHigh", "DiskTemperatureHigh"}},
	} {
		next := testEnv(t, tc.mutate)
		next.NVMe = env.NVMe
		a, err := r.Apply(next)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.Changed, tc.want) {
			t.Errorf("%s: Apply changed %v, want %v", tc.name, a.Changed, tc.want)
		}
		// Back to the defaults for the next case.
		if _, err := r.Apply(env); err != nil {
			t.Fatal(err)
		}
	}
}

// A threshold of a disabled DiskWearHigh or DiskTemperatureHigh marks no
// drive (nvmeThresholds): an operator who edits it while the check is off
// changes nothing that runs, and the disks check (DisksFailure's SMART
// part) is not stopped and started again for it: no extra read of every
// drive, no "checks changed: DisksFailure" in the reload's line.
func TestReloadOfADisabledChecksThresholdKeepsTheDisksCheck(t *testing.T) {
	only := []string{"DisksFailure", "DiskWearHigh", "DiskTemperatureHigh"}
	off := func(c *config.Config) {
		c.Checks.DiskWearHigh.Enabled = false
		c.Checks.DiskTemperatureHigh.Enabled = false
	}
	env := testEnv(t, off)
	env.NVMe = &fakeNVMe{}
	r, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: only})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(c *config.Config)
	}{
		{"wear threshold", func(c *config.Config) { c.Checks.DiskWearHigh.PercentageUsedThreshold = 90 }},
		{"temperature threshold", func(c *config.Config) { c.Checks.DiskTemperatureHigh.ThresholdCelsius = 60 }},
	} {
		next := testEnv(t, func(c *config.Config) { off(c); tc.mutate(c) })
		next.NVMe = env.NVMe
		a, err := r.Apply(next)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Empty() {
			t.Errorf("%s of a disabled check: Apply changed %v, started %v, stopped %v; want nothing", tc.name, a.Changed, a.Started, a.Stopped)
		}
		if _, err := r.Apply(env); err != nil {
			t.Fatal(err)
		}
	}
}
