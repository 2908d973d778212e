//go:build integration

package tests

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// A real ext4 on a loop device, mounted (errors=remount-ro) below a
// directory standing for the kubelet's pods directory, that the kernel
// remounts read-only after an error (ext4's trigger_fs_error, the kernel's
// own "EXT4-fs (loopN): Remounting filesystem read-only"): the monitor,
// reading the real /dev/kmsg, /sys/class/block and /proc/self/mountinfo,
// emits a PodVolumeReadOnly event naming the device and its mount, and
// ReadonlyFilesystem stays False. The same on a loop device mounted
// outside that directory sets ReadonlyFilesystem True with the kernel's
// line, as before.
func TestKmsgPodVolumeReadOnlyOnARealLoopDevice(t *testing.T) {
	for _, p := range []string{"/usr/sbin/losetup", "/usr/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing (apt install mount e2fsprogs)", p)
		}
	}
	tok := harness.Token()
	dir, err := os.MkdirTemp("", "autopilot-health-pvc-"+tok+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	// An ext4 on a fresh loop device, mounted at mp; its device's name.
	mountExt4 := func(name, mp string) string {
		t.Helper()
		img := filepath.Join(dir, name+".img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 16<<20); err != nil {
			t.Fatal(err)
		}
		run("mkfs.ext4", "-q", img)
		loop := run("losetup", "--find", "--show", img)
		t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		run("mount", "-o", "errors=remount-ro", loop, mp)
		t.Cleanup(func() { exec.Command("umount", mp).Run() })
		return filepath.Base(loop)
	}
	pods, plugins := filepath.Join(dir, "kubelet", "pods"), filepath.Join(dir, "kubelet", "plugins")
	podMount := filepath.Join(pods, "6f1c5a8e-"+tok, "volumes", "kubernetes.io~csi", "pvc-"+tok, "mount")
	podDev := mountExt4("pod", podMount)
	nodeMount := filepath.Join(dir, "node-"+tok)
	nodeDev := mountExt4("node", nodeMount)
	trigger := func(dev string) {
		t.Helper()
		if err := os.WriteFile("/sys/fs/ext4/"+dev+"/trigger_fs_error", []byte("1"), 0); err != nil {
			t.Fatalf("trigger_fs_error: %v", err)
		}
	}

	boot, _ := readBootID()
	store := report.NewStore(boot)
	ev := newEventLog(tok)
	store.Observe(ev)
	o := kmsgOpts(t, store)
	o.KernelOnly = true // the kernel's own lines: not another test's written ones
	o.PodVolumeDirs = []string{pods, plugins}
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

	// The pod's volume: an event, no condition.
	trigger(podDev)
	waitFor(t, store, ev, 10*time.Second, "the PodVolumeReadOnly event", func() bool { return ev.count() >= 1 })
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Errorf("ReadonlyFilesystem %+v after the pod volume's remount, want False", c)
	}
	ev.mu.Lock()
	got := ev.events[0]
	ev.mu.Unlock()
	line := "EXT4-fs (" + podDev + "): Remounting filesystem read-only"
	if got.Reason != report.EventPodVolumeReadOnly || !strings.HasPrefix(got.Message, line+" (the device "+podDev+", ") ||
		!strings.Contains(got.Message, "directories: "+podMount+"; a pod's volume") {
		t.Errorf("event %+v, want PodVolumeReadOnly with %q, the device and its mount %s", got, line, podMount)
	}

	// The node's filesystem: the condition, with the kernel's line.
	trigger(nodeDev)
	want := "EXT4-fs (" + nodeDev + "): Remounting filesystem read-only"
	waitFor(t, store, nil, 10*time.Second, "ReadonlyFilesystem True", func() bool {
		c, _ := store.Get("ReadonlyFilesystem")
		return c.Status == report.StatusTrue
	})
	if c, _ := store.Get("ReadonlyFilesystem"); c.Message != want {
		t.Errorf("ReadonlyFilesystem %+v, want True with %q", c, want)
	}
	if n := ev.count(); n != 1 {
		t.Errorf("%d events naming the test's mounts, want 1", n)
	}
}
