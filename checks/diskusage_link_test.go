package checks

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// diskUsageCheckOf is DiskUsageHigh as the configuration file text file
// makes it (config.Parse over the defaults, as the daemon reads it) on the
// fixture host at root with sys.
func diskUsageCheckOf(t *testing.T, file, root string, sys *fakeSys) Check {
	t.Helper()
	cfg, err := config.Parse("config.toml", []byte(file), config.Default())
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRoot = root
	env := testEnv(t, nil)
	env.Config, env.Sys = cfg, sys
	c, err := newDiskUsageCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// linkedKubeletHost is a host root whose mount table is
// testdata/mountinfo-linked-kubelet/mountinfo: the node's / and its data
// disk at /data, below which a kubelet moved there by a link mounts two
// pods' volumes (an RBD ext4 staged by CSI and mounted in its pod, an EBS
// xfs) and a plugin's own cache disk, as the kernel writes them
// (/data/kubelet/...). The pods' volumes are 95 % used, the rest not over
// the threshold. /var/lib/kubelet is made by the caller.
func linkedKubeletHost(t *testing.T) (root string, sys *fakeSys) {
	t.Helper()
	root = t.TempDir()
	mi, err := os.ReadFile("testdata/mountinfo-linked-kubelet/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "proc/self/mountinfo"), string(mi))
	for _, d := range []string{"var/lib", "data/kubelet/pods", "data/kubelet/plugins"} {
		mkdir(t, filepath.Join(root, d))
	}
	const pod1 = "/data/kubelet/pods/6f1c5a8e-1b2d-4c3e-9f40-5a6b7c8d9e0f/volumes/kubernetes.io~csi/pvc-2b7e41c3/mount"
	const pod2 = "/data/kubelet/pods/7a2d6b9f-2c3e-4d4f-8a51-6b7c8d9e0f1a/volumes/kubernetes.io~aws-ebs/vol-0c1d/mount"
	const global = "/data/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/0d9a3c4b/globalmount"
	sys = &fakeSys{statfs: map[string]unix.Statfs_t{
		root: st(1000, 40, 100, 5), root + "/data": st(1000, 50, 100, 5),
		root + global: st(1000, 95, 100, 5), root + pod1: st(1000, 95, 100, 5), root + pod2: st(1000, 95, 100, 5),
		root + "/data/kubelet/plugins/example.com/cache": st(1000, 30, 100, 5),
	}}
	return root, sys
}

// linkKubelet makes the host's /var/lib/kubelet an absolute link to
// /data/kubelet, a directory before.
func linkKubelet(t *testing.T, root string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
}

// probeWatched runs the check once and returns its result and the mount
// points of its storage report.
func probeWatched(t *testing.T, c Check) (Result, string) {
	t.Helper()
	res, err := c.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, d := range res.Details {
		if fss, ok := d.Value.([]FSUsage); ok {
			for _, u := range fss {
				mps = append(mps, u.MountPoint)
			}
		}
	}
	return res, strings.Join(mps, " ")
}

// A kubelet moved to a data disk by a link (/var/lib/kubelet ->
// /data/kubelet) mounts its pods' volumes where the link leads, and the
// kernel writes that path in the mount table: with the default
// mount_points_exclude the pod volume directories are resolved under the
// host root as the host follows links, at each run, and what the default
// leaves out below them (the pods' volumes, CSI staging mounts) is left
// out there too: the pods' full volumes are not measured and the node is
// DiskUsageOK; the node's own /data, and a plugin's cache disk below
// plugins/ that is no CSI staging mount (measured below
// /var/lib/kubelet/plugins as well), still are. Before, the pods'
// volumes were measured and set FilesystemSpaceHigh on a healthy node.
//   - the link there at the first run;
//   - the link made after the check started (the kubelet moved to the
//     data disk later): followed at the next run, where the run before
//     measured the volumes (the directory then was no link);
//   - a mount_points_exclude the file sets is the operator's, matched as
//     the mount table names the mount points only: the volumes measured.
func TestDiskUsageLeavesOutPodVolumesThroughALinkedKubeletDir(t *testing.T) {
	const wantWatched = "/ /data /data/kubelet/plugins/example.com/cache"
	t.Run("linked at the start", func(t *testing.T) {
		root, sys := linkedKubeletHost(t)
		linkKubelet(t, root)
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root; c.Checks.DiskUsageHigh.LVMCommand = "" })
		env.Sys = sys
		c, err := newDiskUsageCheck(env)
		if err != nil {
			t.Fatal(err)
		}
		res, got := probeWatched(t, c)
		if got != wantWatched || res.Status != report.StatusFalse || res.Reason != report.ReasonDiskUsageOK ||
			res.Message != "3 filesystems not over 90% space and 90% inodes" {
			t.Errorf("watched %q, %s/%s %q; want %q, False/DiskUsageOK", got, res.Status, res.Reason, res.Message, wantWatched)
		}
	})
	t.Run("linked after the start", func(t *testing.T) {
		root, sys := linkedKubeletHost(t)
		mkdir(t, filepath.Join(root, "var/lib/kubelet/pods"))
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root; c.Checks.DiskUsageHigh.LVMCommand = "" })
		env.Sys = sys
		c, err := newDiskUsageCheck(env)
		if err != nil {
			t.Fatal(err)
		}
		// /var/lib/kubelet a directory of its own: /data/kubelet is
		// nothing of the kubelet's, and its mounts are the node's.
		res, got := probeWatched(t, c)
		if res.Status != report.StatusTrue || !strings.Contains(got, "/data/kubelet/pods/") {
			t.Fatalf("before the link: watched %q, %s %q; want the volumes measured, True", got, res.Status, res.Message)
		}
		linkKubelet(t, root)
		res, got = probeWatched(t, c)
		if got != wantWatched || res.Status != report.StatusFalse {
			t.Errorf("after the link: watched %q, %s %q; want %q, False", got, res.Status, res.Message, wantWatched)
		}
	})
	t.Run("mount_points_exclude set by the operator", func(t *testing.T) {
		root, sys := linkedKubeletHost(t)
		linkKubelet(t, root)
		c := diskUsageCheckOf(t, "[checks.DiskUsageHigh]\nlvm_command = \"\"\nmount_points_exclude = \"^/(proc|run|var/lib/kubelet/pods)($|/)\"\n", root, sys)
		res, got := probeWatched(t, c)
		if !strings.Contains(got, "/data/kubelet/pods/") || res.Status != report.StatusTrue {
			t.Errorf("watched %q, %s; want the operator's pattern as written: the volumes measured", got, res.Status)
		}
	})
}

// Nothing left to measure: the pods' volumes left out through the link
// are counted among mount_points_exclude's, and said to be.
func TestDiskUsageNothingToMeasureCountsTheLinkedPodVolumes(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "proc/self/mountinfo"),
		"20 1 0:20 / / rw - tmpfs rootfs rw\n"+
			"21 20 0:21 / /proc rw - proc proc rw\n"+
			"22 20 252:0 / /data/kubelet/pods/6f1c/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/rbd0 rw\n")
	mkdir(t, filepath.Join(root, "data/kubelet/pods"))
	mkdir(t, filepath.Join(root, "var/lib"))
	linkKubelet(t, root)
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root; c.Checks.DiskUsageHigh.LVMCommand = "" })
	env.Sys = &fakeSys{}
	c, err := newDiskUsageCheck(env)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Probe(context.Background())
	const want = "no writable filesystem to measure in /proc/self/mountinfo: 3 mounts, 2 excluded by fs_types_exclude, 1 by mount_points_exclude (1 of them below where a link leads the kubelet's pod volume directories, matched as named there), 0 of read-only filesystems"
	if err != nil || res.Status != report.StatusUnknown || res.Message != want {
		t.Errorf("got %+v, %v; want Unknown %q", res, err, want)
	}
}

// BenchmarkDiskUsageLinkedPodDirs is what resolving the pod volume
// directories adds to a run of the check (linkedPodDirs, both
// directories), /var/lib/kubelet a link to the data disk's directory: at
// host_root "/" (the kubelet_root_dir a link in a temporary directory) and
// under another host root.
func BenchmarkDiskUsageLinkedPodDirs(b *testing.B) {
	tmp, err := filepath.EvalSymlinks(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range []string{"host/data/kubelet/pods", "host/data/kubelet/plugins", "host/var/lib"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	root := filepath.Join(tmp, "host")
	if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "data/kubelet"), filepath.Join(tmp, "kubelet")); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, hostRoot, kubelet string }{
		{"host_root=/", "/", filepath.Join(tmp, "kubelet")},
		{"host_root=elsewhere", root, "/var/lib/kubelet"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			env := testEnv(b, nil)
			// The derived default, as Parse makes it for kubelet_root_dir.
			cfg, err := config.Parse("config.toml", []byte("kubelet_root_dir = "+`"`+tc.kubelet+`"`+"\n"), config.Default())
			if err != nil {
				b.Fatal(err)
			}
			cfg.HostRoot = tc.hostRoot
			env.Config = cfg
			c, err := newDiskUsageCheck(env)
			if err != nil {
				b.Fatal(err)
			}
			d := c.(*diskUsageCheck)
			if l := d.linkedPodDirs(); len(l) != 2 {
				b.Fatalf("linked %+v, want both directories", l)
			}
			b.ReportAllocs()
			for b.Loop() {
				d.linkedPodDirs()
			}
		})
	}
}
