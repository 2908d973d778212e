package checks

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// mount_points_exclude and fs_types_exclude match anywhere in the value
// unless anchored, as default.toml says: the default mount point pattern
// excludes everything below its directories (a CSI volume under
// /var/lib/kubelet/pods, or staged at .../plugins/kubernetes.io/csi/.../globalmount,
// is the pod's, not the node's), and an unanchored
// pattern of one's own matches a part of the mount point.
func TestDiskUsageExcludePatterns(t *testing.T) {
	c, err := newDiskUsageCheck(testEnv(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	d := c.(*diskUsageCheck)
	for mp, want := range map[string]bool{
		"/dev": true, "/dev/shm": true, "/proc/sys/fs/binfmt_misc": true, "/sys/fs/cgroup": true,
		"/run": true, "/run/user/0": true, "/run/containerd/io.containerd.runtime.v2.task/k8s.io/x/rootfs": true,
		"/var/lib/kubelet/pods/0b1c/volumes/kubernetes.io~csi/pvc-1/mount": true,
		"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/x/shm":    true,
		// A CSI driver's staging mount of a pod's volume, as kubelet names
		// it since 1.24 (driver, hash of the volume handle) and before.
		"/var/lib/kubelet/plugins/kubernetes.io/csi/driver.longhorn.io/3f2a9c/globalmount": true,
		"/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pvc-1/globalmount":                  true,
		"/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pvc-1/globalmount/sub":              true,
		// The pods directory itself: a disk mounted there (pods' emptyDirs)
		// is the node's; what lies below it is the pods'.
		"/var/lib/kubelet/pods": false, "/var/lib/kubelet/pods/0b1c": true,
		"/var/lib/kubelet/plugins": false, "/var/lib/kubelet/plugins/kubernetes.io/csi/globalmount": false,
		"/": false, "/var": false, "/var/lib/kubelet": false, "/var/lib/containerd": false,
		"/devices": false, "/srv/dev": false, "/var/lib/data": false, "/boot": false,
	} {
		if got := d.excludeMP.MatchString(mp); got != want {
			t.Errorf("default mount_points_exclude on %s: excluded %v, want %v", mp, got, want)
		}
	}
	for fs, want := range map[string]bool{
		"tmpfs": true, "cgroup2": true, "overlay": true, "squashfs": true,
		// Network and FUSE filesystems are not the node's disks (and a
		// hard NFS mount whose server is gone hangs statfs).
		"nfs": true, "nfs4": true, "cifs": true, "smb3": true, "fuse.sshfs": true, "fuse.lxcfs": true, "fuse.tmpfs": true,
		// The kernel's CephFS client (Rook's, a shared /mnt/cephfs) and
		// the parallel filesystems: statfs answers the whole cluster's use,
		// the same on every node that mounts it.
		"ceph": true, "lustre": true, "beegfs": true, "gpfs": true,
		"ext4": false, "xfs": false, "btrfs": false, "fuseblk": false, "fuse": false, "nfsd": false,
	} {
		if got := d.excludeType.MatchString(fs); got != want {
			t.Errorf("default fs_types_exclude on %s: excluded %v, want %v", fs, got, want)
		}
	}

	c, err = newDiskUsageCheck(testEnv(t, func(c *config.Config) {
		c.Checks.DiskUsageHigh.MountPointsExclude = "scratch"
		c.Checks.DiskUsageHigh.FSTypesExclude = "fuse"
	}))
	if err != nil {
		t.Fatal(err)
	}
	d = c.(*diskUsageCheck)
	if !d.excludeMP.MatchString("/mnt/scratch/a") || d.excludeMP.MatchString("/mnt/data") {
		t.Error(`mount_points_exclude = "scratch" does not match inside the mount point only`)
	}
	if !d.excludeType.MatchString("fuse.sshfs") || d.excludeType.MatchString("ext4") {
		t.Error(`fs_types_exclude = "fuse" does not match inside the type only`)
	}
}

// hangingSys: statfs of the paths hang blocks until release is closed (a
// hard NFS mount whose server is gone: every mount of it); calls counts the
// statfs of those paths begun so far.
type hangingSys struct {
	fakeSys
	hang    []string
	release chan struct{}
	calls   atomic.Int32
}

func (h *hangingSys) Statfs(path string, st *unix.Statfs_t) error {
	if slices.Contains(h.hang, path) {
		h.calls.Add(1)
		<-h.release
	}
	return h.fakeSys.Statfs(path, st)
}

// A mount whose statfs hangs does not hide the others: every run decides
// on / within the statfs deadline (5 s of the 30 s timeout) and names the
// hung mount as not checked; later runs do not ask it again while its
// statfs has not returned (one goroutine stuck, however many runs), and
// ask it again once it answers. Fails when the mounts' statfs run in the
// probe's goroutine (every run is Unknown/CheckTimeout after 30 s), or when
// a stuck mount is asked again each run (3 statfs calls hung, not 1).
func TestDiskUsageHungMountDoesNotHideTheOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		root := t.TempDir()
		writeFile(t, root+"/proc/self/mountinfo", `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:60 / /mnt/backup rw,relatime shared:20 - nfs4 10.0.0.9:/export rw,vers=4.2,hard
`)
		sys := &hangingSys{fakeSys: fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 95, 100, 5), root + "/mnt/backup": st(1000, 10, 100, 5)}},
			hang: []string{root + "/mnt/backup"}, release: make(chan struct{})}
		env := testEnv(t, func(c *config.Config) {
			c.HostRoot = root
			c.Checks.DiskUsageHigh.FSTypesExclude = "^tmpfs$" // NFS watched, as an operator may choose
		})
		env.Sys = sys
		store := report.NewStore("b")
		r, err := NewRunner(env, Options{Store: store, Only: []string{"DiskUsageHigh"}})
		if err != nil {
			t.Fatal(err)
		}
		const hung = "; not checked: /mnt/backup (statfs hung: no answer within 5s; asked again once it answers)"
		run := func(wantTook time.Duration, want report.Condition) {
			t.Helper()
			start := time.Now()
			c := r.RunOnce(t.Context())[0]
			if took := time.Since(start); took != wantTook || c.Status != want.Status || c.Reason != want.Reason || c.Message != want.Message {
				t.Errorf("run took %s: %s/%s %q\nwant %s: %s/%s %q", took, c.Status, c.Reason, c.Message, wantTook, want.Status, want.Reason, want.Message)
			}
		}
		full := report.Condition{Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh, Message: "/ 95% of space used (threshold 90%)" + hung}
		run(5*time.Second, full)
		run(0, full)
		run(0, full)
		if n := sys.calls.Load(); n != 1 {
			t.Errorf("the hung mount's statfs was called %d times over 3 runs, want once (a goroutine stuck per run)", n)
		}
		sys.statfs[root] = st(1000, 20, 100, 5)
		run(0, report.Condition{Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK, Message: "1 filesystem not over 90% space and 90% inodes" + hung})
		// The server is back: the stuck statfs returns, its goroutine ends,
		// and the next run measures the mount again.
		close(sys.release)
		synctest.Wait()
		run(0, report.Condition{Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK, Message: "2 filesystems not over 90% space and 90% inodes"})
		if n := sys.calls.Load(); n != 2 {
			t.Errorf("statfs of the recovered mount called %d times in all, want 2", n)
		}
	})
}

// The stuck statfs is the filesystem's (its device), not the mount's: the
// NFS filesystem 0:60 is measured through /mnt/backup/sub (a bind of a
// subdirectory) until a mount of the whole of it appears at /mnt/backup,
// which the selection then prefers; the hung statfs of the first run is
// that filesystem's, and the second run does not start another through the
// new mount point. Fails when the key is device plus mount point (2 statfs
// calls hung on one filesystem).
func TestDiskUsageHungFilesystemStuckByDevice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		root := t.TempDir()
		const bind = "40 22 0:60 /sub /mnt/backup/sub rw,relatime shared:20 - nfs4 10.0.0.9:/export rw,vers=4.2,hard\n"
		writeFile(t, root+"/proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"+bind)
		sys := &hangingSys{fakeSys: fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 20, 100, 5)}},
			hang: []string{root + "/mnt/backup", root + "/mnt/backup/sub"}, release: make(chan struct{})}
		env := testEnv(t, func(c *config.Config) {
			c.HostRoot = root
			c.Checks.DiskUsageHigh.FSTypesExclude = "^tmpfs$"
		})
		env.Sys = sys
		c, err := newDiskUsageCheck(env)
		if err != nil {
			t.Fatal(err)
		}
		want := func(mp string) string {
			return "1 filesystem not over 90% space and 90% inodes; not checked: " + mp + " (statfs hung: no answer within 5s; asked again once it answers)"
		}
		if r := probe(t, c); r.Message != want("/mnt/backup/sub") {
			t.Errorf("first run: %s %q", r.Status, r.Message)
		}
		writeFile(t, root+"/proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"+bind+
			"41 22 0:60 / /mnt/backup rw,relatime shared:20 - nfs4 10.0.0.9:/export rw,vers=4.2,hard\n")
		start := time.Now()
		if r := probe(t, c); r.Message != want("/mnt/backup") || time.Since(start) != 0 {
			t.Errorf("second run, after %s: %s %q", time.Since(start), r.Status, r.Message)
		}
		if n := sys.calls.Load(); n != 1 {
			t.Errorf("the hung filesystem's statfs was called %d times (through its two mount points), want once", n)
		}
		close(sys.release)
		synctest.Wait()
	})
}

// hangingLVM: the first report blocks until release is closed, whatever
// its context says (an lvm in D state on a dead physical volume, which
// SIGKILL does not end and exec.Cmd.Wait waits for); later ones answer
// "no volume groups".
type hangingLVM struct {
	release chan struct{}
	calls   atomic.Int32
}

func (h *hangingLVM) Report(ctx context.Context, command string, args ...string) ([]byte, error) {
	if h.calls.Add(1) == 1 {
		<-h.release
	}
	return []byte(`{"report":[{"vg":[]}]}`), nil
}

// LVM that does not answer costs its own part only: the run returns after
// the LVM wait (20 s of the 30 s timeout) with the filesystems measured
// and "LVM not checked"; the next run does not start another lvm while the
// first has not returned, and asks again once it has. Fails when the probe
// waits for readLVM itself (Unknown/CheckTimeout after 30 s, the statfs
// results lost).
func TestDiskUsageHungLVMKeepsTheFilesystems(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		root := t.TempDir()
		writeFile(t, root+"/proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.Sys = &fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 97, 100, 5)}}
		l := &hangingLVM{release: make(chan struct{})}
		env.LVM = l
		r, err := NewRunner(env, Options{Store: report.NewStore("b"), Only: []string{"DiskUsageHigh"}})
		if err != nil {
			t.Fatal(err)
		}
		const want = "/ 97% of space used (threshold 90%); not checked: LVM (no report within 20s: lvm hung; asked again once it returns)"
		for i, wantTook := range []time.Duration{20 * time.Second, 0} {
			start := time.Now()
			c := r.RunOnce(t.Context())[0]
			if took := time.Since(start); took != wantTook || c.Status != report.StatusTrue || c.Message != want {
				t.Errorf("run %d took %s: %s/%s %q\nwant %s: True %q", i+1, took, c.Status, c.Reason, c.Message, wantTook, want)
			}
		}
		if n := l.calls.Load(); n != 1 {
			t.Errorf("lvm asked %d times while the first has not returned, want once", n)
		}
		close(l.release)
		synctest.Wait()
		if c := r.RunOnce(t.Context())[0]; c.Status != report.StatusTrue || c.Message != "/ 97% of space used (threshold 90%)" {
			t.Errorf("LVM answering again: %s/%s %q", c.Status, c.Reason, c.Message)
		}
		if n := l.calls.Load(); n != 2 {
			t.Errorf("lvm asked %d times in all, want 2", n)
		}
	})
}

// writeFile writes a fixture file, making its directories.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// DiskUsageHigh is True over a threshold, as the spec's catalog says ("over
// the space or inode threshold"), not at it: with the default 90 a
// filesystem, a volume group or a thin pool exactly 90 % used is not a
// problem (kubelet evicts below 10 % free, that is over 90 % used), and one
// just over it is. Each part's percent is read as it is computed: space and
// inodes as df's rounded-up percent (900 of 1000 blocks is 90, 901 is 91),
// extents the same, a thin pool's use as LVM reports it (two decimals).
// Fails when a part compares at or over (>=): the "exactly at" cases True.
func TestDiskUsageFiresOverTheThresholdNotAt(t *testing.T) {
	const root = "testdata/roots/node-a"
	fine := map[string]unix.Statfs_t{root: st(1000, 50, 100, 10), root + "/var": st(1000, 10, 100, 10),
		root + "/mnt/with space": st(100, 1, 0, 0), root + "/boot": st(100, 1, 10, 1), root + "/var/lib/data": st(100, 1, 10, 1)}
	vg := func(extents, free int) []byte {
		return fmt.Appendf(nil, `{"report": [{"vg": [{"vg_name":"vgvm", "vg_size":"%d", "vg_free":"%d", "vg_extent_count":"%d", "vg_free_count":"%d"}]}]}`,
			extents*4<<20, free*4<<20, extents, free)
	}
	pool := func(data, meta string) []byte {
		return fmt.Appendf(nil, `{"report": [{"lv": [{"vg_name":"vgvm", "lv_name":"pool", "lv_attr":"twi-aotz--", "segtype":"thin-pool", "lv_size":"16777216", "data_percent":%q, "metadata_percent":%q}]}]}`, data, meta)
	}
	const okVG, noPools = 50, `{"report": [{"lv": []}]}`
	for _, tc := range []struct {
		name       string
		var_       unix.Statfs_t // the /var filesystem
		vgs, lvs   []byte
		wantReason report.Reason
		wantMsg    string // of a True result; "" for False
	}{
		{name: "space exactly at 90%", var_: unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bfree: 100, Bavail: 100, Files: 100, Ffree: 90},
			wantReason: report.ReasonDiskUsageOK},
		{name: "space just over 90%", var_: unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bfree: 99, Bavail: 99, Files: 100, Ffree: 90},
			wantReason: report.ReasonFilesystemSpaceHigh, wantMsg: "/var 91% of space used (threshold 90%)"},
		// Reserved blocks count as df counts them: 890 used of 990
		// (used + available to unprivileged users) is 89.9 %, rounded up 90.
		{name: "space at 90% of what users may use", var_: unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bfree: 110, Bavail: 100, Files: 100, Ffree: 90},
			wantReason: report.ReasonDiskUsageOK},
		{name: "inodes exactly at 90%", var_: unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bfree: 900, Bavail: 900, Files: 1000, Ffree: 100},
			wantReason: report.ReasonDiskUsageOK},
		{name: "inodes just over 90%", var_: unix.Statfs_t{Bsize: 4096, Blocks: 1000, Bfree: 900, Bavail: 900, Files: 1000, Ffree: 99},
			wantReason: report.ReasonFilesystemInodesHigh, wantMsg: "/var 91% of inodes used (threshold 90%)"},
		{name: "volume group exactly at 90%", var_: st(1000, 10, 100, 10), vgs: vg(100, 10), lvs: []byte(noPools),
			wantReason: report.ReasonDiskUsageOK},
		{name: "volume group just over 90%", var_: st(1000, 10, 100, 10), vgs: vg(1000, 99), lvs: []byte(noPools),
			wantReason: report.ReasonVolumeGroupSpaceHigh, wantMsg: "volume group vgvm 91% of extents allocated (threshold 90%)"},
		{name: "thin pool data exactly at 90%", var_: st(1000, 10, 100, 10), vgs: vg(100, okVG), lvs: pool("90.00", "10.00"),
			wantReason: report.ReasonDiskUsageOK},
		{name: "thin pool data just over 90%", var_: st(1000, 10, 100, 10), vgs: vg(100, okVG), lvs: pool("90.01", "10.00"),
			wantReason: report.ReasonThinPoolSpaceHigh, wantMsg: "thin pool vgvm/pool 90.01% of data used (threshold 90%)"},
		{name: "thin pool metadata exactly at 90%", var_: st(1000, 10, 100, 10), vgs: vg(100, okVG), lvs: pool("10.00", "90.00"),
			wantReason: report.ReasonDiskUsageOK},
		{name: "thin pool metadata just over 90%", var_: st(1000, 10, 100, 10), vgs: vg(100, okVG), lvs: pool("10.00", "90.01"),
			wantReason: report.ReasonThinPoolSpaceHigh, wantMsg: "thin pool vgvm/pool 90.01% of metadata used (threshold 90%)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			statfs := maps.Clone(fine)
			statfs[root+"/var"] = tc.var_
			env, _ := diskEnv(t, &fakeSys{statfs: statfs})
			env.LVM = &fakeLVM{err: ErrNoLVM}
			if tc.vgs != nil {
				env.LVM = &fakeLVM{vgs: tc.vgs, lvs: tc.lvs}
			}
			c, err := newDiskUsageCheck(env)
			if err != nil {
				t.Fatal(err)
			}
			res, err := c.Probe(context.Background())
			if err != nil || res.Reason != tc.wantReason || (tc.wantMsg != "") != (res.Status == report.StatusTrue) || tc.wantMsg != "" && res.Message != tc.wantMsg {
				t.Errorf("got %s/%s %q, %v\nwant reason %s, message %q", res.Status, res.Reason, res.Message, err, tc.wantReason, tc.wantMsg)
			}
		})
	}
}

// diskUsageRunner is a runner of DiskUsageHigh alone on env, with the store
// and the details it writes.
func diskUsageRunner(t *testing.T, env *Env) (*Runner, *report.Store, *report.Details) {
	t.Helper()
	store, det := report.NewStore("b"), report.NewDetails()
	r, err := NewRunner(env, Options{Store: store, Details: det, Only: []string{"DiskUsageHigh"}})
	if err != nil {
		t.Fatal(err)
	}
	return r, store, det
}
