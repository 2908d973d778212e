package checks

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// fakeSys answers statfs from a table keyed by path and adjtimex from fields.
type fakeSys struct {
	statfs   map[string]unix.Statfs_t
	statErr  map[string]error
	timex    unix.Timex
	state    int
	timexErr error
}

func (f *fakeSys) Statfs(path string, st *unix.Statfs_t) error {
	if err := f.statErr[path]; err != nil {
		return err
	}
	v, ok := f.statfs[path]
	if !ok {
		return unix.ENOENT
	}
	*st = v
	return nil
}

func (f *fakeSys) Adjtimex(tx *unix.Timex) (int, error) {
	if tx.Modes != 0 {
		return 0, errors.New("test: the clock check must only read (modes 0)")
	}
	*tx = f.timex
	return f.state, f.timexErr
}

func TestClockCheck(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sys        fakeSys
		wantStatus report.Status
		wantReason string
		wantMsg    string
		wantErr    string
	}{
		{name: "synced", sys: fakeSys{timex: unix.Timex{Status: 0x2001, Esterror: 1500}, state: 0},
			wantStatus: report.StatusFalse, wantReason: "ClockSynchronized", wantMsg: "clock synchronized, estimated error 1.5ms"},
		{name: "unsync bit", sys: fakeSys{timex: unix.Timex{Status: 0x41, Maxerror: 16000000}, state: 0},
			wantStatus: report.StatusTrue, wantReason: "ClockUnsynchronized",
			wantMsg: "the kernel reports the clock as not synchronized (adjtimex state 0, status 0x41, maximum error 16s): is an NTP client running and reaching its servers?"},
		{name: "TIME_ERROR state", sys: fakeSys{timex: unix.Timex{Status: 0x1, Maxerror: 500000}, state: 5},
			wantStatus: report.StatusTrue, wantReason: "ClockUnsynchronized",
			wantMsg: "the kernel reports the clock as not synchronized (adjtimex state 5, status 0x1, maximum error 500ms): is an NTP client running and reaching its servers?"},
		{name: "error just at the limit", sys: fakeSys{timex: unix.Timex{Esterror: 5000000}},
			wantStatus: report.StatusFalse, wantReason: "ClockSynchronized", wantMsg: "clock synchronized, estimated error 5s"},
		{name: "error above the limit", sys: fakeSys{timex: unix.Timex{Esterror: 5000001}},
			wantStatus: report.StatusTrue, wantReason: "ClockErrorTooLarge", wantMsg: "estimated clock error 5.000001s is above the limit of 5s"},
		{name: "syscall fails", sys: fakeSys{timexErr: unix.EPERM}, wantErr: "adjtimex: operation not permitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(t, nil)
			env.Sys = &tc.sys
			c, _ := newClockCheck(env)
			res, err := c.Probe(context.Background())
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || res.Status != tc.wantStatus || res.Reason != tc.wantReason || res.Message != tc.wantMsg {
				t.Errorf("got %+v, %v\nwant %s/%s %q", res, err, tc.wantStatus, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

// The real adjtimex on this machine: the call works read-only and gives a
// status the check can interpret (either way).
func TestClockCheckRealAdjtimex(t *testing.T) {
	env := testEnv(t, nil)
	c, _ := newClockCheck(env)
	res, err := c.Probe(context.Background())
	if err != nil {
		t.Fatalf("adjtimex on this host: %v", err)
	}
	if d, _ := report.Lookup("ClockNotSynchronized"); !d.ValidReason(res.Status, res.Reason) {
		t.Errorf("real result %+v has a reason outside the catalog", res)
	}
}

// st builds a statfs answer: blocks of 4 KiB, percent used, inode percent used.
func st(blocks, usedPct, files, inodePct uint64) unix.Statfs_t {
	used := blocks * usedPct / 100
	return unix.Statfs_t{Bsize: 4096, Blocks: blocks, Bfree: blocks - used, Bavail: blocks - used, Files: files, Ffree: files - files*inodePct/100}
}

func diskEnv(t *testing.T, sys *fakeSys) (*Env, string) {
	root := "testdata/roots/node-a"
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Sys = sys
	return env, root
}

func TestDiskUsageCheck(t *testing.T) {
	const root = "testdata/roots/node-a"
	for _, tc := range []struct {
		name       string
		statfs     map[string]unix.Statfs_t
		statErr    map[string]error
		wantStatus report.Status
		wantReason string
		wantMsg    string
	}{
		{name: "all fine",
			statfs:     map[string]unix.Statfs_t{root: st(1000, 50, 100, 10), root + "/var": st(1000, 89, 100, 10), root + "/mnt/with space": st(100, 1, 0, 0), root + "/var/lib/data": st(100, 1, 10, 1)},
			wantStatus: report.StatusFalse, wantReason: "DiskUsageOK", wantMsg: "4 filesystems below 90% space and 90% inodes"},
		{name: "var full, root inodes",
			statfs:     map[string]unix.Statfs_t{root: st(1000, 50, 100, 95), root + "/var": st(1000, 90, 100, 10), root + "/mnt/with space": st(100, 1, 0, 0), root + "/var/lib/data": st(100, 1, 10, 1)},
			wantStatus: report.StatusTrue, wantReason: "FilesystemSpaceHigh",
			wantMsg: "/var 90% of space used (threshold 90%), / 95% of inodes used (threshold 90%)"},
		{name: "inodes only, and a statfs error",
			statfs:     map[string]unix.Statfs_t{root: st(1000, 10, 100, 100), root + "/var": st(1000, 10, 100, 10), root + "/var/lib/data": st(100, 1, 10, 1)},
			statErr:    map[string]error{root + "/mnt/with space": unix.EIO},
			wantStatus: report.StatusTrue, wantReason: "FilesystemInodesHigh",
			wantMsg: "/ 100% of inodes used (threshold 90%); not checked: statfs /mnt/with space: input/output error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, _ := diskEnv(t, &fakeSys{statfs: tc.statfs, statErr: tc.statErr})
			c, err := newDiskUsageCheck(env)
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Probe(context.Background())
			if err != nil || res.Status != tc.wantStatus || res.Reason != tc.wantReason || res.Message != tc.wantMsg {
				t.Errorf("got %+v, %v\nwant %s/%s %q", res, err, tc.wantStatus, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

// Which mounts are watched: read-only, pseudo, overlay, excluded mount
// points and bind mounts of the same device are skipped.
func TestDiskUsageSelectsMounts(t *testing.T) {
	sys := &fakeSys{statfs: map[string]unix.Statfs_t{}}
	env, root := diskEnv(t, sys)
	for _, p := range []string{"/", "/var", "/mnt/with space", "/var/lib/data", "/var/lib/kubelet", "/boot", "/usr", "/run", "/proc", "/dev", "/sys"} {
		sys.statfs[filepath.Join(root, p)] = st(100, 1, 10, 1)
	}
	c, _ := newDiskUsageCheck(env)
	usage, errs, err := c.(*diskUsageCheck).Usage()
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	var got []string
	for _, u := range usage {
		got = append(got, u.MountPoint)
	}
	if want := "/ /var /mnt/with space /var/lib/data"; strings.Join(got, " ") != want {
		t.Errorf("watched %q, want %q", strings.Join(got, " "), want)
	}
}

func TestDiskUsageNoMountinfo(t *testing.T) {
	env := testEnv(t, func(c *config.Config) { c.HostRoot = t.TempDir() })
	c, _ := newDiskUsageCheck(env)
	if _, err := c.Probe(context.Background()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want not-exist", err)
	}
}

// The real statfs on this machine's own mounts.
func TestDiskUsageRealHost(t *testing.T) {
	env := testEnv(t, nil)
	c, _ := newDiskUsageCheck(env)
	usage, _, err := c.(*diskUsageCheck).Usage()
	if err != nil {
		t.Fatal(err)
	}
	if len(usage) == 0 {
		t.Fatal("no filesystem of this host is watched")
	}
	for _, u := range usage {
		if u.SizeBytes == 0 || u.UsedPercent < 0 || u.UsedPercent > 100 {
			t.Errorf("implausible usage %+v", u)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	ms, err := ParseMountinfo(strings.NewReader("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n" +
		"37 35 98:1 / /a\\134b\\011c rw - ext4 /dev/x\\040y ro\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{MountPoint: "/mnt2", FSType: "ext3", Source: "/dev/root", Device: "98:0"},
		{MountPoint: "/a\\b\tc", FSType: "ext4", Source: "/dev/x y", Device: "98:1", ReadOnly: true},
	}
	if len(ms) != 2 || ms[0] != want[0] || ms[1] != want[1] {
		t.Errorf("got %+v\nwant %+v", ms, want)
	}
	for _, bad := range []string{"1 2 3\n", "36 35 98:0 / /x rw shared:1 ext4 /dev/sda rw\n", "36 35 98:0 / /x rw - ext4\n"} {
		if _, err := ParseMountinfo(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "mountinfo line 1: malformed") {
			t.Errorf("ParseMountinfo(%q) err = %v", bad, err)
		}
	}
}

func FuzzParseMountinfo(f *testing.F) {
	b, _ := os.ReadFile("testdata/roots/node-a/proc/self/mountinfo")
	f.Add(string(b))
	f.Add("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n")
	f.Add("1 1 1:1 / /\\04 rw - x y\n")
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseMountinfo(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.FSType == "" || m.Device == "" {
				t.Fatalf("accepted mount with empty fields: %+v", m)
			}
		}
	})
}
