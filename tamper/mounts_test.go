package tamper

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"golang.org/x/sys/unix"
)

// A mount over a protected file, and its unmount, are reported by their
// mount point (a host path under the root), once each; a mount elsewhere
// (a pod's volume) is not. A mount sends inotify nothing: before, a bind
// mount over a protected file waited for the interval's scan.
func TestMountWatcherReportsMountsOverProtectedPaths(t *testing.T) {
	root := tree(t, map[string]string{"/etc/kubernetes/kubelet.conf": "apiVersion: v1\n", "/srv/evil": "evil\n"})
	if err := os.MkdirAll(filepath.Join(root, "/var/lib/kubelet/pods/volume"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf"}}
	m, err := NewMountWatcher(root, s)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func(p string) { events <- p }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	conf, vol := filepath.Join(root, "/etc/kubernetes/kubelet.conf"), filepath.Join(root, "/var/lib/kubelet/pods/volume")
	if err := unix.Mount("tmpfs", vol, "tmpfs", 0, ""); err != nil {
		testenv.Skip(t, "cannot mount a tmpfs (root in a mount namespace that allows it): "+err.Error())
	}
	mounted := map[string]bool{vol: true}
	t.Cleanup(func() { // before t.TempDir's removal, which a mount keeps busy
		for p := range mounted {
			unix.Unmount(p, unix.MNT_DETACH)
		}
	})
	if err := unix.Mount(filepath.Join(root, "/srv/evil"), conf, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounted[conf] = true
	next := func(what string) string {
		t.Helper()
		select {
		case p := <-events:
			return p
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not reported within 10s", what)
			return ""
		}
	}
	if p := next("the bind mount over the protected file"); p != "/etc/kubernetes/kubelet.conf" {
		t.Fatalf("reported %q first, want /etc/kubernetes/kubelet.conf", p)
	}
	for _, p := range []string{vol, conf} {
		if err := unix.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
		delete(mounted, p)
	}
	if p := next("its unmount"); p != "/etc/kubernetes/kubelet.conf" {
		t.Fatalf("reported %q after the unmounts, want /etc/kubernetes/kubelet.conf (the volume's mount is no protected path)", p)
	}
}

// The cost of one reading of this process's mount table with the default
// protected paths (README: measured in a mount namespace of 2,000 tmpfs
// mounts, as a node with many pods holds).
func BenchmarkMountWatcherReading(b *testing.B) {
	s := Spec{Patterns: []string{"/var/lib/kubelet/config.yaml", "/var/lib/kubelet/kubeadm-flags.env", "/etc/kubernetes/kubelet.conf",
		"/etc/kubernetes/manifests", "/etc/containerd", "/etc/cni/net.d", "/etc/systemd/system", "/var/lib/syself/sealed-os"}}
	m, err := NewMountWatcher("/", s)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(m.fd)
	for b.Loop() {
		if _, err := m.read(); err != nil {
			b.Fatal(err)
		}
	}
}

// A watcher stopped (a reload, a re-detect, the daemon's stop) leaves no
// goroutine and no descriptor behind: twenty watchers started and stopped
// hold as many of each as before.
func TestMountWatcherStopLeavesNothing(t *testing.T) {
	s := Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf"}}
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	cycle := func() {
		m, err := NewMountWatcher("/", s)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx, func(string) {}) }()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	cycle() // the runtime's own first-use goroutines and descriptors
	g0, f0 := runtime.NumGoroutine(), fds()
	for range 20 {
		cycle()
	}
	// Run's helper goroutine ends after Run returns: awaited, not slept on.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if g, f := runtime.NumGoroutine(), fds(); g > g0 || f != f0 {
		t.Fatalf("after 20 watchers stopped: %d goroutines (before %d), %d descriptors (before %d)", g, g0, f, f0)
	}
}
