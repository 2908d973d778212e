package kmsg

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// bigMountTable is a node's mount table with n pods' mounts below pods/
// (each pod a projected token, an emptyDir's subPath of the root disk and
// a CSI volume with its staging mount), ~250 bytes a line, after the
// fixture's node mounts.
func bigMountTable(tb testing.TB, n int) []byte {
	tb.Helper()
	fixture, err := os.ReadFile(filepath.Join(podVolumeRoot, "proc", "self", "mountinfo"))
	if err != nil {
		tb.Fatal(err)
	}
	var b strings.Builder
	b.Write(fixture)
	for i := 0; i < n; i += 4 {
		uid := fmt.Sprintf("%08x-1b2d-4c3e-9f40-5a6b7c8d9e0f", i)
		fmt.Fprintf(&b, "%d 22 0:%d / /var/lib/kubelet/pods/%s/volumes/kubernetes.io~projected/kube-api-access-x7k2p rw,relatime shared:%d - tmpfs tmpfs rw,size=7949520k\n", 1000+i, 100+i, uid, 1000+i)
		fmt.Fprintf(&b, "%d 22 8:1 /var/lib/kubelet/pods/%s/volumes/kubernetes.io~empty-dir/cache/conf /var/lib/kubelet/pods/%s/volume-subpaths/cache/app/0 rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n", 1001+i, uid, uid)
		fmt.Fprintf(&b, "%d 22 252:%d / /var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/%s/globalmount rw,relatime shared:%d - ext4 /dev/rbd%d rw,stripe=16\n", 1002+i, 32+i, uid, 1002+i, 2+i)
		fmt.Fprintf(&b, "%d 22 252:%d / /var/lib/kubelet/pods/%s/volumes/kubernetes.io~csi/pvc-%s/mount rw,relatime shared:%d - ext4 /dev/rbd%d rw,stripe=16\n", 1003+i, 32+i, uid, uid, 1002+i, 2+i)
	}
	return []byte(b.String())
}

// BenchmarkPodVolumeLookup is what one ReadonlyFilesystem line costs the
// reader on a node with 10,000 pod mounts: the device's number read, the
// mount table read (from memory here, not the kernel) and scanned.
func BenchmarkPodVolumeLookup(b *testing.B) {
	mi := bigMountTable(b, 10000)
	store := report.NewStore("b")
	o := opts(b, store)
	o.Sysfs, o.Proc = filepath.Join(podVolumeRoot, "sys"), filepath.Join(podVolumeRoot, "proc")
	mon := NewMonitor(o)
	mon.volumes.now = func() uint64 { return nowUsec }
	read := mon.volumes.read
	mon.volumes.read = func(path string, max int) ([]byte, error) {
		if filepath.Base(path) == "mountinfo" {
			return mi, nil
		}
		return read(path, max)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := mon.volumes.podVolume("rbd0", nowUsec-1); !ok {
			b.Fatal("rbd0 not a pod's volume")
		}
	}
	b.ReportMetric(float64(len(mi)), "table-bytes")
}
