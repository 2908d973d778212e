package checks

import (
	"testing"

	"github.com/syself/autopilot-health/internal/config"
)

// mount_points_exclude and fs_types_exclude match anywhere in the value
// unless anchored, as default.toml says: the default mount point pattern
// excludes everything below its directories (a CSI volume under
// /var/lib/kubelet/pods is the pod's, not the node's), and an unanchored
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
		"/": false, "/var": false, "/var/lib/kubelet": false, "/var/lib/containerd": false,
		"/devices": false, "/srv/dev": false, "/var/lib/data": false, "/boot": false,
	} {
		if got := d.excludeMP.MatchString(mp); got != want {
			t.Errorf("default mount_points_exclude on %s: excluded %v, want %v", mp, got, want)
		}
	}
	for fs, want := range map[string]bool{
		"tmpfs": true, "cgroup2": true, "overlay": true, "squashfs": true,
		"ext4": false, "xfs": false, "btrfs": false, "fuse.tmpfs": false,
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
