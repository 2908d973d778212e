package checks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// podsDiskHost is a host root whose mount table has the node's / (40 %
// used), a disk mounted at the kubelet's pods directory itself, pods (a
// dedicated disk for pods' emptyDirs, 95 % used), and below it a pod's
// CSI volume (an RBD ext4, 95 % used) and a subPath bind of the pods disk,
// as the kernel writes them with the pods directory at podsAt.
func podsDiskHost(t *testing.T, podsAt string) (root string, sys *fakeSys) {
	t.Helper()
	root = t.TempDir()
	vol := podsAt + "/0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/volumes/kubernetes.io~csi/pvc-2b7e41c3/mount"
	sub := podsAt + "/0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/volume-subpaths/cache/app/0"
	writeFile(t, filepath.Join(root, "proc/self/mountinfo"), strings.Join([]string{
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro",
		"23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
		"30 22 8:16 / " + podsAt + " rw,relatime shared:40 - ext4 /dev/sdb rw",
		"534 30 252:0 / " + vol + " rw,relatime shared:260 - ext4 /dev/rbd0 rw",
		"540 30 8:16 /0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0/volumes/kubernetes.io~empty-dir/cache/app " + sub + " rw,relatime shared:40 - ext4 /dev/sdb rw",
		"",
	}, "\n"))
	mkdir(t, filepath.Join(root, "var/lib/kubelet/plugins"))
	sys = &fakeSys{statfs: map[string]unix.Statfs_t{
		root: st(1000, 40, 100, 5), root + podsAt: st(1000, 95, 100, 5), root + vol: st(1000, 95, 100, 5), root + sub: st(1000, 95, 100, 5),
	}}
	return root, sys
}

// A disk mounted at the kubelet's pods directory itself (pods' emptyDirs
// on a disk of their own, common on nodes with a small root disk) is the
// node's: with the default mount_points_exclude it is measured and, full,
// sets DiskUsageHigh, while a pod's volume mounted below it, and a subPath
// bind of the pods disk, are the pods' and left out. The kubelet's own
// eviction watches its root directory's filesystem, not a mount at pods/,
// so before (the default left out pods($|/), the directory itself) a full
// pods disk was seen by no one.
//   - the disk mounted at /var/lib/kubelet/pods;
//   - the pods directory a link to where the disk is mounted
//     (/var/lib/kubelet/pods -> /mnt/podsdisk): the mount at the link's
//     target is the pods directory itself, measured; the mounts below it
//     are pods' volumes, left out through the link;
//   - an operator's file that copied the stock default pattern as it was
//     before (pods($|/)): taken for the default, the pods disk measured.
func TestDiskUsageMeasuresADiskMountedAtThePodsDir(t *testing.T) {
	for _, tc := range []struct {
		name, podsAt, file string
		link               bool
	}{
		{name: "mounted at the pods dir", podsAt: "/var/lib/kubelet/pods"},
		{name: "pods dir linked to the mount", podsAt: "/mnt/podsdisk", link: true},
		{name: "the old stock pattern copied", podsAt: "/var/lib/kubelet/pods",
			file: `mount_points_exclude = "^/(dev|proc|sys|run|var/lib/kubelet/pods|var/lib/kubelet/plugins/kubernetes\\.io/csi/.+/globalmount|var/lib/containerd/.+|run/containerd)($|/)"` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, sys := podsDiskHost(t, tc.podsAt)
			if tc.link {
				mkdir(t, filepath.Join(root, tc.podsAt))
				if err := os.Symlink(tc.podsAt, filepath.Join(root, "var/lib/kubelet/pods")); err != nil {
					t.Fatal(err)
				}
			}
			c := diskUsageCheckOf(t, "[checks.DiskUsageHigh]\nlvm_command = \"\"\n"+tc.file, root, sys)
			res, got := probeWatched(t, c)
			if want := "/ " + tc.podsAt; got != want || res.Status != report.StatusTrue || !strings.Contains(res.Message, tc.podsAt) || strings.Contains(res.Message, "volume") {
				t.Errorf("watched %q, %s/%s %q; want %q, True naming %s and no pod's volume", got, res.Status, res.Reason, res.Message, want, tc.podsAt)
			}
		})
	}
}

// An operator who copied the stock default pattern into the file (what
// `config default` prints, /var/lib/kubelet's form; now's or the one
// before) and sets kubelet_root_dir = "/data/kubelet" has the default
// derived for /data/kubelet: the pods' volumes and CSI staging mounts
// below it are left out, the node's /data and a plugin's own cache disk
// measured. Before, the copy was kept as written, naming /var/lib/kubelet
// only, and the pods' full volumes set the node's DiskUsageHigh.
func TestDiskUsageStockPatternCopiedWithKubeletRootDir(t *testing.T) {
	for _, stock := range []string{config.Default().Checks.DiskUsageHigh.MountPointsExclude, strings.Replace(config.Default().Checks.DiskUsageHigh.MountPointsExclude, "pods/.+|", "pods|", 1)} {
		root, sys := linkedKubeletHost(t)
		file := "kubelet_root_dir = \"/data/kubelet\"\n[checks.DiskUsageHigh]\nlvm_command = \"\"\nmount_points_exclude = \"" + strings.ReplaceAll(stock, `\`, `\\`) + "\"\n"
		c := diskUsageCheckOf(t, file, root, sys)
		res, got := probeWatched(t, c)
		if want := "/ /data /data/kubelet/plugins/example.com/cache"; got != want || res.Status != report.StatusFalse {
			t.Errorf("stock %q copied: watched %q, %s %q; want %q, False", stock, got, res.Status, res.Message, want)
		}
	}
}
