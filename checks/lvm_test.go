package checks

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// The fixtures under testdata/lvm are the output of lvm 2.03.16 (Debian
// bookworm) in the VM tier's guest (tests/vm, scenario lvm_usage, with
// `lvm vgs`/`lvs` and the check's own arguments, hostio.LVMReportArgs["vgs"] and hostio.LVMReportArgs["lvs"], run
// by the scenario and logged): no volume group yet (vgs-none); a volume
// group on the NVMe drive with every extent allocated, a 16 MiB thin pool
// holding 15 MiB, a thin volume and a linear one (vgs-full, lvs-thinpool);
// the linear volume removed (vgs-half). lvs-pool-states is written by hand
// in the same shape, one thin pool per lv_attr case of lvs(8): active and
// measured, inactive (5th character '-'), active without percentages, and
// the health flags (9th character) D out of data space, M metadata
// read-only, F failed.
func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "lvm", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseLVMReports(t *testing.T) {
	vgs, err := ParseVGs(readFixture(t, "vgs-full.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []VGUsage{{Name: "vgvm", SizeBytes: 264241152, FreeBytes: 0, AllocatedPercent: 100}}; !reflect.DeepEqual(vgs, want) {
		t.Errorf("vgs = %+v, want %+v", vgs, want)
	}
	pools, err := ParseThinPools(readFixture(t, "lvs-thinpool.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []ThinPool{{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "pool", SizeBytes: 16777216, DataPercent: 93.75, MetadataPercent: 10.94}}}; !reflect.DeepEqual(pools, want) {
		t.Errorf("thin pools = %+v, want %+v (the thin and linear volumes are not pools)", pools, want)
	}
	pools, err = ParseThinPools(readFixture(t, "lvs-pool-states.json"))
	if err != nil {
		t.Fatal(err)
	}
	const mib16 = 16777216
	if want := []ThinPool{
		{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "pool", SizeBytes: mib16, DataPercent: 93.75, MetadataPercent: 10.94}},
		{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "off", SizeBytes: mib16, Inactive: true}},
		{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "nouse", SizeBytes: mib16, Unmeasured: true}},
		{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "full", SizeBytes: mib16, DataPercent: 100, MetadataPercent: 12.01, Health: "out of data space"}},
		{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "metaro", SizeBytes: mib16, DataPercent: 40, MetadataPercent: 100, Health: "metadata read-only"}},
		{VG: "vgvm", ThinPoolUsage: ThinPoolUsage{Name: "broken", SizeBytes: mib16, Health: "failed"}},
	}; !reflect.DeepEqual(pools, want) {
		t.Errorf("thin pools = %+v,\nwant %+v", pools, want)
	}
	vgs, err = ParseVGs(readFixture(t, "vgs-none.json"))
	if err != nil || len(vgs) != 0 {
		t.Errorf("no volume groups: %+v, %v", vgs, err)
	}
	vgs, err = ParseVGs(readFixture(t, "vgs-half.json"))
	if err != nil || len(vgs) != 1 || vgs[0].AllocatedPercent != 10 {
		t.Errorf("after the filler volume is removed: %+v, %v", vgs, err)
	}
}

// Bad input is a clear error naming what is wrong, never a crash or a
// made-up number.
func TestParseLVMReportsRejectBadInput(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, "LVM vg report: unexpected end of JSON input"},
		{`{"report": []}`, `LVM vg report: no "report" entries`},
		{`{"report": [{"vg": [{"vg_name":"a", "vg_size":"1", "vg_free":"x", "vg_extent_count":"1", "vg_free_count":"0"}]}]}`, `volume group 1: vg_free "x" is not a number`},
		{`{"report": [{"vg": [{"vg_name":"a", "vg_size":"1", "vg_free":"0", "vg_extent_count":"1"}]}]}`, `volume group 1: no vg_free_count`},
		{`{"report": [{"vg": [{"vg_name":"a", "vg_size":"1", "vg_free":"0", "vg_extent_count":"1", "vg_free_count":"2"}]}]}`, `2 free of 1 extents`},
		{`{"report": [{"vg": [{"vg_name":"", "vg_size":"1", "vg_free":"0", "vg_extent_count":"1", "vg_free_count":"0"}]}]}`, `name ""`},
	} {
		if _, err := ParseVGs([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseVGs(%s): %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "lv_attr":"twi-a-tz--", "segtype":"thin-pool", "lv_size":"1", "data_percent":"101", "metadata_percent":"1"}]}]}`, `thin pool a/p: "101" is not a percentage`},
		{`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "lv_attr":"twi-a-tz--", "segtype":"thin-pool", "lv_size":"1", "data_percent":"5", "metadata_percent":""}]}]}`, `thin pool a/p: "" is not a percentage`},
		// NaN and Inf parse as floats; json.Marshal refuses them.
		{`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "lv_attr":"twi-a-tz--", "segtype":"thin-pool", "lv_size":"1", "data_percent":"NaN", "metadata_percent":"1"}]}]}`, `thin pool a/p: "NaN" is not a percentage`},
		{`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "lv_attr":"twi-a-tz--", "segtype":"thin-pool", "lv_size":"1", "data_percent":"1", "metadata_percent":"-Inf"}]}]}`, `thin pool a/p: "-Inf" is not a percentage`},
		{`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "segtype":"thin-pool", "lv_size":"1", "data_percent":"5", "metadata_percent":"1"}]}]}`, `thin pool a/p: lv_attr "" is not LVM's attribute string`},
		{`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "segtype":"thin-pool", "data_percent":"5", "metadata_percent":"1"}]}]}`, `volume 1: no lv_size`},
	} {
		if _, err := ParseThinPools([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseThinPools(%s): %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	// An inactive pool has no use to report: listed, not measured.
	pools, err := ParseThinPools([]byte(`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "lv_attr":"twi---tz--", "segtype":"thin-pool", "lv_size":"1", "data_percent":"", "metadata_percent":""}]}]}`))
	if err != nil || len(pools) != 1 || !pools[0].Inactive {
		t.Errorf("inactive pool: %+v, %v", pools, err)
	}
}

func FuzzParseLVMReport(f *testing.F) {
	for _, n := range []string{"vgs-full.json", "vgs-none.json", "vgs-half.json", "lvs-thinpool.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "lvm", n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"report": [{"lv": [{"vg_name":"a", "lv_name":"p", "lv_attr":"twi-a-tz--", "segtype":"thin-pool", "lv_size":"1", "data_percent":"NaN", "metadata_percent":"1"}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if vgs, err := ParseVGs(b); err == nil {
			for _, vg := range vgs {
				if vg.AllocatedPercent < 0 || vg.AllocatedPercent > 100 {
					t.Fatalf("allocated %d%%", vg.AllocatedPercent)
				}
			}
			if _, err := json.Marshal(vgs); err != nil {
				t.Fatalf("vgs %+v: %v", vgs, err)
			}
		}
		if pools, err := ParseThinPools(b); err == nil {
			for _, p := range pools {
				if p.DataPercent < 0 || p.DataPercent > 100 || p.MetadataPercent < 0 || p.MetadataPercent > 100 {
					t.Fatalf("pool %+v", p)
				}
			}
			// What parses goes into the storage report as JSON.
			if _, err := json.Marshal(pools); err != nil {
				t.Fatalf("pools %+v: %v", pools, err)
			}
		}
	})
}

// fakeLVM answers vgs and lvs from fixtures (or errors). exit: vgs's
// report comes with this error (lvm exited non-zero after writing it).
type fakeLVM struct {
	vgs, lvs  []byte
	err, exit error
	calls     []string
}

func (f *fakeLVM) Report(ctx context.Context, command string, args ...string) ([]byte, error) {
	f.calls = append(f.calls, command+" "+strings.Join(args, " "))
	if f.err != nil {
		return nil, f.err
	}
	if command == "vgs" {
		return f.vgs, f.exit
	}
	return f.lvs, nil
}

func lvmEnv(t *testing.T, l LVM, mutate func(c *config.Config)) *Env {
	const root = "testdata/roots/node-a"
	env, _ := diskEnv(t, &fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 50, 100, 10), root + "/var": st(1000, 10, 100, 10),
		root + "/mnt/with space": st(100, 1, 0, 0), root + "/boot": st(100, 1, 10, 1), root + "/var/lib/data": st(100, 1, 10, 1)}})
	if mutate != nil {
		mutate(env.Config)
	}
	env.LVM = l
	return env
}

func TestDiskUsageLVM(t *testing.T) {
	full, half, none, pool := readFixture(t, "vgs-full.json"), readFixture(t, "vgs-half.json"), readFixture(t, "vgs-none.json"), readFixture(t, "lvs-thinpool.json")
	for _, tc := range []struct {
		name       string
		lvm        *fakeLVM
		mutate     func(c *config.Config)
		wantStatus report.Status
		wantReason report.Reason
		wantMsg    string
		wantVGs    int // -1: no volumeGroups field (LVM not asked, or no report)
		wantPools  int // thin pools listed under the one volume group; 0 means 1
	}{
		{name: "volume group full, thin pool over its data threshold", lvm: &fakeLVM{vgs: full, lvs: pool},
			wantStatus: report.StatusTrue, wantReason: report.ReasonVolumeGroupSpaceHigh, wantVGs: 1,
			wantMsg: "volume group vgvm 100% of extents allocated (threshold 90%), thin pool vgvm/pool 93.75% of data used (threshold 90%)"},
		{name: "thin pool alone", lvm: &fakeLVM{vgs: half, lvs: pool},
			wantStatus: report.StatusTrue, wantReason: report.ReasonThinPoolSpaceHigh, wantVGs: 1,
			wantMsg: "thin pool vgvm/pool 93.75% of data used (threshold 90%)"},
		{name: "metadata threshold", lvm: &fakeLVM{vgs: half, lvs: pool}, mutate: func(c *config.Config) {
			c.Checks.DiskUsageHigh.ThinPoolDataPct = 95
			c.Checks.DiskUsageHigh.ThinPoolMetaPct = 10
		},
			wantStatus: report.StatusTrue, wantReason: report.ReasonThinPoolSpaceHigh, wantVGs: 1,
			wantMsg: "thin pool vgvm/pool 10.94% of metadata used (threshold 10%)"},
		// The highest threshold the configuration allows, 99, is exceeded
		// by a full volume group; the thin pool's 93.75 % is not over 94.
		// (Exactly at a threshold is not over it:
		// TestDiskUsageFiresOverTheThresholdNotAt.)
		{name: "volume group over its threshold, thin pool not over its own", lvm: &fakeLVM{vgs: full, lvs: pool}, mutate: func(c *config.Config) {
			c.Checks.DiskUsageHigh.VolumeGroupPercent = 99
			c.Checks.DiskUsageHigh.ThinPoolDataPct = 94
		},
			wantStatus: report.StatusTrue, wantReason: report.ReasonVolumeGroupSpaceHigh, wantVGs: 1,
			wantMsg: "volume group vgvm 100% of extents allocated (threshold 99%)"},
		{name: "healthy", lvm: &fakeLVM{vgs: half, lvs: pool}, mutate: func(c *config.Config) { c.Checks.DiskUsageHigh.ThinPoolDataPct = 94 },
			wantStatus: report.StatusFalse, wantReason: report.ReasonDiskUsageOK, wantVGs: 1,
			wantMsg: "5 filesystems not over 90% space and 90% inodes, 1 LVM volume group not over 90% of extents allocated, 1 thin pool not over 94% of data and 90% of metadata used"},
		{name: "no volume groups", lvm: &fakeLVM{vgs: none},
			wantStatus: report.StatusFalse, wantReason: report.ReasonDiskUsageOK, wantVGs: 0,
			wantMsg: "5 filesystems not over 90% space and 90% inodes"},
		// Not asked: no volumeGroups at all (an empty list would say "none").
		{name: "no LVM", lvm: &fakeLVM{err: ErrNoLVM},
			wantStatus: report.StatusFalse, wantReason: report.ReasonDiskUsageOK, wantVGs: -1,
			wantMsg: "5 filesystems not over 90% space and 90% inodes"},
		{name: "thin pool health flags, an active pool without use", lvm: &fakeLVM{vgs: half, lvs: readFixture(t, "lvs-pool-states.json")}, mutate: func(c *config.Config) {
			c.Checks.DiskUsageHigh.ThinPoolDataPct = 94
		},
			wantStatus: report.StatusTrue, wantReason: report.ReasonThinPoolSpaceHigh, wantVGs: 1, wantPools: 6,
			wantMsg: "thin pool vgvm/full out of data space, thin pool vgvm/metaro metadata read-only, thin pool vgvm/broken failed; not checked: thin pool vgvm/nouse: active, but LVM reports no data or metadata use"},
		{name: "healthy pools but one active without use", lvm: &fakeLVM{vgs: half, lvs: []byte(`{"report": [{"lv": [
			{"vg_name":"vgvm", "lv_name":"pool", "lv_attr":"twi-aotz--", "segtype":"thin-pool", "lv_size":"16777216", "data_percent":"10.00", "metadata_percent":"1.00"},
			{"vg_name":"vgvm", "lv_name":"nouse", "lv_attr":"twi-a-tz--", "segtype":"thin-pool", "lv_size":"16777216", "data_percent":"", "metadata_percent":""}]}]}`)},
			wantStatus: report.StatusFalse, wantReason: report.ReasonDiskUsageOK, wantVGs: 1, wantPools: 2,
			wantMsg: "5 filesystems not over 90% space and 90% inodes, 1 LVM volume group not over 90% of extents allocated, 1 thin pool not over 90% of data and 90% of metadata used; not checked: thin pool vgvm/nouse: active, but LVM reports no data or metadata use"},
		// vgs exited 5 with a report of the volume groups it could read:
		// they are checked, and the exit is noted.
		{name: "lvm exits non-zero with a report", lvm: &fakeLVM{vgs: full, lvs: pool, exit: errors.New("/usr/sbin/lvm vgs: exit status 5 (its report is used): Volume group vgbad has unknown devices")},
			wantStatus: report.StatusTrue, wantReason: report.ReasonVolumeGroupSpaceHigh, wantVGs: 1,
			wantMsg: "volume group vgvm 100% of extents allocated (threshold 90%), thin pool vgvm/pool 93.75% of data used (threshold 90%); not checked: /usr/sbin/lvm vgs: exit status 5 (its report is used): Volume group vgbad has unknown devices"},
		{name: "lvm fails", lvm: &fakeLVM{err: errors.New("/usr/sbin/lvm vgs: no answer within 10s")},
			wantStatus: report.StatusFalse, wantReason: report.ReasonDiskUsageOK, wantVGs: -1,
			wantMsg: "5 filesystems not over 90% space and 90% inodes; not checked: /usr/sbin/lvm vgs: no answer within 10s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := newDiskUsageCheck(lvmEnv(t, tc.lvm, tc.mutate))
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Probe(context.Background())
			if err != nil || res.Status != tc.wantStatus || res.Reason != tc.wantReason || res.Message != tc.wantMsg {
				t.Errorf("got %+v, %v\nwant %s/%s %q", res, err, tc.wantStatus, tc.wantReason, tc.wantMsg)
			}
			var vgs []VGUsage
			found := false
			for _, d := range res.Details {
				if d.Domain == "storage" && d.Field == "volumeGroups" {
					vgs, found = d.Value.([]VGUsage), true
				}
			}
			if tc.wantVGs < 0 && found || tc.wantVGs >= 0 && (!found || len(vgs) != tc.wantVGs) {
				t.Errorf("storage.volumeGroups: found %v, %+v; want %d", found, vgs, tc.wantVGs)
			}
			if tc.wantPools == 0 {
				tc.wantPools = 1
			}
			if tc.wantVGs == 1 && (len(vgs[0].ThinPools) != tc.wantPools || vgs[0].ThinPools[0].Name != "pool") {
				t.Errorf("the storage report does not list the thin pool under its volume group: %+v", vgs)
			}
		})
	}
}

// The real lvm binary: run with the report arguments, bounded by
// lvm_timeout, absent means no LVM, and never run for a host root that is
// not this machine's.
func TestRealLVMCommand(t *testing.T) {
	testenv.StartsProcesses(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "lvm")
	args := filepath.Join(dir, "args")
	abs, _ := filepath.Abs(filepath.Join("testdata", "lvm", "vgs-full.json"))
	os.WriteFile(script, []byte("#!/bin/sh\necho \"$@\" > "+args+"\nenv | grep ^LVM_SYSTEM_DIR= >> "+args+"\n[ \"$1\" = hang ] && exec sleep 30\n[ \"$1\" = partial ] && { cat "+abs+"; echo '  Volume group vgbad has unknown devices' >&2; exit 5; }\n[ \"$1\" = fails ] && { echo '  Device /dev/x not found' >&2; exit 5; }\ncat "+abs+"\n"), 0o755)
	// An lvm.conf to honour: lvm's own LVM_SYSTEM_DIR.
	hostio.LVMSystemDir = dir
	os.WriteFile(filepath.Join(dir, "lvm.conf"), nil, 0o644)
	defer func() { hostio.LVMSystemDir = "/etc/lvm" }()
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = "/"
		c.Checks.DiskUsageHigh.LVMCommand = script
		c.Checks.DiskUsageHigh.LVMTimeout = config.Duration{Duration: 20e9} // a busy machine starts sh slowly
	})
	out, err := env.lvm().Report(context.Background(), "vgs", hostio.LVMReportArgs["vgs"]...)
	if err != nil || string(out) != string(readFixture(t, "vgs-full.json")) {
		t.Fatalf("Report: %q, %v", out, err)
	}
	b, _ := os.ReadFile(args)
	if want := "vgs --reportformat json --units b --nosuffix --nolocking -o vg_name,vg_size,vg_free,vg_extent_count,vg_free_count\n"; string(b) != want {
		t.Errorf("lvm ran with %q, want %q", b, want)
	}
	// No lvm.conf (a fresh /etc): LVM_SYSTEM_DIR="" so lvm does not try
	// to create its directory on the sandbox's read-only /etc.
	os.Remove(filepath.Join(dir, "lvm.conf"))
	env.lvm().Report(context.Background(), "vgs")
	if b, _ := os.ReadFile(args); !strings.HasSuffix(string(b), "\nLVM_SYSTEM_DIR=\n") {
		t.Errorf("without lvm.conf lvm ran with %q, want LVM_SYSTEM_DIR set empty", b)
	}
	env.Config.Checks.DiskUsageHigh.LVMTimeout = config.Duration{Duration: 200e6}
	if _, err := env.lvm().Report(context.Background(), "hang"); err == nil || !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Errorf("a hung lvm: %v", err)
	}
	// The cases after it have the busy machine's timeout again: with
	// 200ms a slow start of sh under load read as a hang.
	env.Config.Checks.DiskUsageHigh.LVMTimeout = config.Duration{Duration: 20e9}
	// A non-zero exit after a JSON report: the report, and the exit noted.
	out, err = env.lvm().Report(context.Background(), "partial")
	if vgs, perr := ParseVGs(out); perr != nil || len(vgs) != 1 || err == nil ||
		err.Error() != script+" partial: exit status 5 (its report is used): Volume group vgbad has unknown devices" {
		t.Errorf("exit 5 with a report: %q, %v (parsed %+v, %v)", out, err, vgs, perr)
	}
	// Without one: an error alone.
	out, err = env.lvm().Report(context.Background(), "fails")
	if out != nil || err == nil || err.Error() != script+" fails: exit status 5: Device /dev/x not found" {
		t.Errorf("exit 5 without a report: %q, %v", out, err)
	}
	env.Config.Checks.DiskUsageHigh.LVMCommand = filepath.Join(dir, "absent")
	if _, err := env.lvm().Report(context.Background(), "vgs"); !errors.Is(err, ErrNoLVM) {
		t.Errorf("absent lvm: %v, want ErrNoLVM", err)
	}
	env.Config.Checks.DiskUsageHigh.LVMCommand = script
	env.Config.HostRoot = "testdata/roots/node-a"
	if _, err := env.lvm().Report(context.Background(), "vgs"); !errors.Is(err, ErrNoLVM) {
		t.Errorf("a fixture host root: %v, want ErrNoLVM", err)
	}
}

// LVM is asked again only when what it reports can have changed: its
// answer is reused while the same logical volumes are active with the same
// sizes, there is no thin pool, and it is at most lvmRefresh old.
func TestDiskUsageReusesLVMsAnswer(t *testing.T) {
	root := t.TempDir()
	mountinfo, err := os.ReadFile("testdata/roots/node-a/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/self/mountinfo", string(mountinfo))
	write("sys/block/dm-0/dm/uuid", "CRYPT-VERITY-4b1c\n") // the sealed root: not LVM
	write("sys/block/dm-0/size", "409600\n")
	write("sys/block/dm-1/dm/uuid", "LVM-abcDEFvol1\n")
	write("sys/block/dm-1/size", "2097152\n")
	write("sys/block/sda/size", "10485760\n")
	now := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	fs := map[string]unix.Statfs_t{}
	for _, mp := range []string{"", "/var", "/mnt/with space", "/boot", "/var/lib/data"} {
		fs[root+mp] = st(1000, 50, 100, 10)
	}
	lvm := &fakeLVM{vgs: readFixture(t, "vgs-half.json"), lvs: []byte(`{"report": [{"lv": []}]}`)}
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		c.Checks.DiskUsageHigh.ThinPoolDataPct = 95 // the fixture's pool: 93.75%
	})
	env.Sys, env.LVM, env.Now = &fakeSys{statfs: fs}, lvm, func() time.Time { return now }
	c, err := newDiskUsageCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	asks := func(what string, want int) {
		t.Helper()
		lvm.calls = nil
		r, err := c.Probe(context.Background())
		if err != nil || !strings.Contains(r.Message, "1 LVM volume group") {
			t.Fatalf("%s: %+v, %v", what, r, err)
		}
		if got := len(lvm.calls) / 2; got != want { // vgs and lvs
			t.Errorf("%s: LVM asked %d times, want %d (%v)", what, got, want, lvm.calls)
		}
	}
	asks("first run", 1)
	now = now.Add(2 * time.Minute)
	asks("nothing changed", 0)
	write("sys/block/dm-1/size", "4194304\n") // lvextend
	asks("a volume extended", 1)
	now = now.Add(2 * time.Minute)
	write("sys/block/dm-2/dm/uuid", "LVM-abcDEFvol2\n") // lvcreate
	write("sys/block/dm-2/size", "2048\n")
	asks("a volume created", 1)
	now = now.Add(2 * time.Minute)
	asks("nothing changed again", 0)
	now = now.Add(lvmRefresh)
	asks("the answer too old", 1)
	// A thin pool: its use moves with every write, so LVM is asked every run.
	lvm.lvs = readFixture(t, "lvs-thinpool.json")
	now = now.Add(lvmRefresh)
	asks("a thin pool appears (the answer too old)", 1)
	now = now.Add(2 * time.Minute)
	asks("thin pool", 1)
	asks("thin pool, again", 1)
	// A change of a volume group's metadata no device shows (a volume
	// created inactive, the group extended): LVM's backup of it is new.
	lvm.lvs = []byte(`{"report": [{"lv": []}]}`)
	now = now.Add(lvmRefresh)
	asks("no thin pool any more (the answer too old)", 1)
	asks("nothing changed once more", 0)
	write("etc/lvm/backup/vgvm", "# metadata, seqno 7\n")
	asks("a metadata backup written", 1)
	asks("nothing changed after it", 0)
	write("etc/lvm/backup/vgvm", "# metadata, seqno 8, a longer one\n")
	asks("the backup written anew", 1)
	// An answer with an error is not reused.
	lvm.exit = errors.New("/usr/sbin/lvm vgs: exit status 5 (its report is used): Volume group vgbad has unknown devices")
	now = now.Add(lvmRefresh)
	asks("an answer with an error", 1)
	asks("after an answer with an error", 1)
	lvm.exit = nil
	// No LVM device list (a /sys without block devices): asked every run.
	lvm.lvs = []byte(`{"report": [{"lv": []}]}`)
	os.RemoveAll(filepath.Join(root, "sys"))
	asks("no /sys/block", 1)
	asks("no /sys/block, again", 1)
}
