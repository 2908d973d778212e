package checks

import (
	"testing"

	"github.com/syself/autopilot-health/internal/config"
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
