//go:build integration

package tests

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// A kubelet whose directory is a link to a data disk's (/var/lib/kubelet
// -> /data/kubelet, an absolute link, host_root "/"): a real ext4 on a
// loop device mounted (errors=remount-ro) through the link, below its
// pods directory, which the kernel writes in the mount table where the
// link leads, is remounted read-only by the kernel (trigger_fs_error):
// the monitor, reading the real /dev/kmsg, /sys/class/block and
// /proc/self/mountinfo, with the pod volume directories named through the
// link, emits a PodVolumeReadOnly event naming the mount as the kernel
// writes it, and ReadonlyFilesystem stays False. Before, the directories
// were matched only as named, and the line set ReadonlyFilesystem.
func TestKmsgPodVolumeReadOnlyThroughALinkedKubeletDirectory(t *testing.T) {
	requireLoopTools(t)
	harness.HoldExt4Errors(t) // the kernel's read-only remounts carry no token
	tok := harness.Token()
	tmp, err := os.MkdirTemp("", "autopilot-health-pvclink-"+tok+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	dir, err := filepath.EvalSymlinks(tmp)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data", "kubelet")
	if err := os.MkdirAll(filepath.Join(data, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	kubelet := filepath.Join(dir, "kubelet") // the host's /var/lib/kubelet
	if err := os.Symlink(data, kubelet); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join("pods", "6f1c5a8e-"+tok, "volumes", "kubernetes.io~csi", "pvc-"+tok, "mount")
	// Mounted through the link, as the kubelet mounts it.
	podDev := mountExt4Loop(t, filepath.Join(dir, "pod.img"), filepath.Join(kubelet, vol), "-o", "errors=remount-ro")
	podMount := filepath.Join(data, vol)
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || !strings.Contains(string(mi), " "+podMount+" ") {
		t.Fatalf("the kernel does not write the volume's mount at %s (%v)", podMount, err)
	}

	boot, _ := readBootID()
	store := report.NewStore(boot)
	ev := newEventLog(tok)
	store.Observe(ev)
	o := kmsgOpts(t, store)
	o.KernelOnly = true // the kernel's own lines: not another test's written ones
	o.PodVolumeDirs = []string{filepath.Join(kubelet, "pods"), filepath.Join(kubelet, "plugins")}
	mon := kmsg.NewMonitor(o)
	mon.Start(time.Now(), kmsg.BootWall())
	rd := &kmsg.Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: 200 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, store, nil, 10*time.Second, "the reader to read /dev/kmsg to its end", func() bool {
		c, ok := store.Get("ReadonlyFilesystem")
		return ok && c.Status == report.StatusFalse
	})

	if err := os.WriteFile("/sys/fs/ext4/"+podDev+"/trigger_fs_error", []byte("1"), 0); err != nil {
		t.Fatalf("trigger_fs_error: %v", err)
	}
	line := "EXT4-fs (" + podDev + "): Remounting filesystem read-only"
	waitFor(t, store, ev, 10*time.Second, "the PodVolumeReadOnly event", func() bool {
		if c, _ := store.Get("ReadonlyFilesystem"); c.Status == report.StatusTrue {
			return true // the line was taken for the node's: fail below, no wait
		}
		return ev.count() >= 1
	})
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Fatalf("ReadonlyFilesystem %+v after the pod volume's remount, want False", c)
	}
	ev.mu.Lock()
	got := ev.events[0]
	ev.mu.Unlock()
	if got.Reason != report.EventPodVolumeReadOnly || !strings.HasPrefix(got.Message, line+" (the device "+podDev+", ") ||
		!strings.Contains(got.Message, "directories: "+podMount+"; a pod's volume") {
		t.Errorf("event %+v, want PodVolumeReadOnly with %q, the device and its mount %s", got, line, podMount)
	}
}
