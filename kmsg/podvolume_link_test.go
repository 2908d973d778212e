package kmsg

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// linkedKubeletMonitor is a monitor whose pod volume directories are
// dirs under root, with the fixture host's sysfs and the mount table mi
// (written to a proc of its own), the log read to its end, with the events
// it emits in got.
func linkedKubeletMonitor(t *testing.T, root string, dirs []string, mi string) (*Monitor, *report.Store, *[]report.Event) {
	t.Helper()
	proc := filepath.Join(t.TempDir(), "proc")
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(mi), 0o644); err != nil {
		t.Fatal(err)
	}
	store := report.NewStore("b")
	var got []report.Event
	store.Observe(events{&got})
	o := opts(t, store)
	o.Sysfs, o.Proc = filepath.Join(podVolumeRoot, "sys"), proc
	o.HostRoot, o.PodVolumeDirs = root, dirs
	mon := NewMonitor(o)
	mon.volumes.now = func() uint64 { return nowUsec }
	mon.pods.now = mon.volumes.now
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	return mon, store, &got
}

// mkdirs makes the directories ds under root.
func mkdirs(t *testing.T, root string, ds ...string) {
	t.Helper()
	for _, d := range ds {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// A kubelet moved to a data disk by a link (/var/lib/kubelet ->
// /data/kubelet) mounts its pods' volumes where the link leads, and the
// kernel writes that path in the mount table (/data/kubelet/pods/...): the
// pod volume directories are resolved as the host resolves them, at each
// lookup, and a read-only line of a volume mounted there is the pod's
// (PodVolumeReadOnly), not ReadonlyFilesystem.
//   - host_root "/": the directories as configured, the link absolute.
//     Before, they were matched as configured only, and every pod
//     volume's line set ReadonlyFilesystem.
//   - another host_root, the link made after the daemon started (the data
//     disk set up later, or the kubelet moved): before, the directories
//     were resolved once, at the start, and the link made later was not
//     followed.
//
// A disk mounted at the linked directory itself (the data disk at
// /data/kubelet, not below pods/) stays the node's.
func TestPodVolumeReadOnlyWhereTheKubeletsDirectoryIsALink(t *testing.T) {
	const sec = uint64(time.Second / time.Microsecond)
	const line = "EXT4-fs (rbd0): Remounting filesystem read-only"
	const vol = "/pods/6f1c5a8e-1b2d-4c3e-9f40-5a6b7c8d9e0f/volumes/kubernetes.io~csi/pvc-2b7e41c3/mount"
	const global = "/plugins/kubernetes.io/csi/rbd.csi.ceph.com/0d9a3c4b/globalmount"
	mounts := func(kubelet string) string {
		return "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" +
			"520 22 252:0 / " + kubelet + global + " rw,relatime shared:260 - ext4 /dev/rbd0 rw\n" +
			"534 22 252:0 / " + kubelet + vol + " rw,relatime shared:260 - ext4 /dev/rbd0 rw\n" +
			"590 22 8:64 / " + kubelet + " rw,relatime shared:320 - ext4 /dev/sde rw\n"
	}
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		mon   *Monitor
		store *report.Store
		got   *[]report.Event
		data  string // the kubelet's directory as the kernel names it
	}
	check := func(t *testing.T, s step) {
		t.Helper()
		s.mon.Handle(rec(nowUsec-sec, line), t0)
		if c, _ := s.store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
			t.Errorf("ReadonlyFilesystem %+v, want False: rbd0 is a pod's volume", c)
		}
		want := line + " (the device rbd0, 252:0, is mounted only under the kubelet's pod volume directories: " +
			s.data + global + ", " + s.data + vol + "; a pod's volume, not the node's filesystem, so not ReadonlyFilesystem)"
		if len(*s.got) != 1 || (*s.got)[0].Reason != report.EventPodVolumeReadOnly || (*s.got)[0].Message != want {
			t.Fatalf("events %+v, want one PodVolumeReadOnly:\n%s", *s.got, want)
		}
		// The data disk at the kubelet's directory itself is the node's.
		node := "EXT4-fs (sde): Remounting filesystem read-only"
		s.mon.Handle(rec(nowUsec-sec, node), t0)
		if c, _ := s.store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue || c.Message != node {
			t.Errorf("ReadonlyFilesystem %+v, want True with %q", c, node)
		}
	}

	t.Run("host_root /", func(t *testing.T) {
		top := filepath.Join(tmp, "slash")
		data := filepath.Join(top, "data", "kubelet")
		mkdirs(t, data, "pods", "plugins")
		mkdirs(t, top, "var/lib")
		if err := os.Symlink(data, filepath.Join(top, "var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		dirs := []string{filepath.Join(top, "var/lib/kubelet/pods"), filepath.Join(top, "var/lib/kubelet/plugins")}
		mon, store, got := linkedKubeletMonitor(t, "/", dirs, mounts(data))
		check(t, step{mon, store, got, data})
	})
	t.Run("host_root elsewhere, the link made after the start", func(t *testing.T) {
		root := filepath.Join(tmp, "host")
		mkdirs(t, root, "var/lib/kubelet/pods", "data/kubelet/pods", "data/kubelet/plugins")
		data := filepath.Join(root, "data", "kubelet")
		mon, store, got := linkedKubeletMonitor(t, root, nil, mounts(data))
		// The kubelet moved to the data disk after the daemon started.
		if err := os.RemoveAll(filepath.Join(root, "var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		check(t, step{mon, store, got, data})
	})
	t.Run("a link to nowhere: the path as configured", func(t *testing.T) {
		root := filepath.Join(tmp, "dangling")
		mkdirs(t, root, "var/lib")
		if err := os.Symlink("/nowhere", filepath.Join(root, "var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(root, "var/lib/kubelet")
		mon, store, got := linkedKubeletMonitor(t, root, nil, mounts(data))
		check(t, step{mon, store, got, data})
	})
}

// BenchmarkPodVolumeDirsResolved is what resolving the pod volume
// directories costs a lookup (mountDirs), host_root "/", with
// /var/lib/kubelet a link to the data disk's directory.
func BenchmarkPodVolumeDirsResolved(b *testing.B) {
	top := b.TempDir()
	data := filepath.Join(top, "data", "kubelet")
	for _, d := range []string{"pods", "plugins"} {
		if err := os.MkdirAll(filepath.Join(data, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(top, "var/lib"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(data, filepath.Join(top, "var/lib/kubelet")); err != nil {
		b.Fatal(err)
	}
	dirs := []string{filepath.Join(top, "var/lib/kubelet/pods"), filepath.Join(top, "var/lib/kubelet/plugins")}
	b.ReportAllocs()
	for b.Loop() {
		if len(mountDirs("/", dirs)) != 4 {
			b.Fatal("not resolved")
		}
	}
}
