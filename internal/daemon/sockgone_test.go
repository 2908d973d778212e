package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// sockDaemon runs a daemon with its control socket and its status socket
// in a directory of their own (as /run/autopilot-health), until the test
// ends or stop is called; it returns once both answer.
func sockDaemon(t *testing.T) (d *Daemon, dir, control, status string, logs *syncBuffer, stop func()) {
	d, dir, control, status, logs, stop, _ = sockDaemonEvents(t)
	return
}

// sockDaemonEvents is sockDaemon, with the count of the socket watch's
// events handled.
func sockDaemonEvents(t *testing.T) (d *Daemon, dir, control, status string, logs *syncBuffer, stop func(), events *atomic.Int32) {
	t.Helper()
	if os.Getuid() != 0 {
		testenv.Skip(t, "the control socket answers root only (TestControlRefusesANonRootPeer)")
	}
	dir = filepath.Join(t.TempDir(), "run")
	control, status = filepath.Join(dir, "control.sock"), filepath.Join(dir, "status.sock")
	cfg := testConfig(t)
	cfg.Status.Socket = status
	logs = &syncBuffer{}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: ln, ControlSocket: control})
	if err != nil {
		t.Fatal(err)
	}
	events = &atomic.Int32{}
	d.socketEvent = func() { events.Add(1) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	awaitAnswers(t, control, status, "both sockets answering at the start")
	return d, dir, control, status, logs, stop, events
}

// controlAnswers: a daemon answers on the control socket (its answer to
// an operation it does not know: nothing is done).
func controlAnswers(control string) error {
	a, err := askControl(control, "ask again", 5*time.Second, ControlRequest{Op: "test-ping"})
	if err == nil && !strings.Contains(a.Error, `unknown operation "test-ping"`) {
		err = fmt.Errorf("answer %+v", a)
	}
	return err
}

func awaitAnswers(t *testing.T, control, status, what string) {
	t.Helper()
	var cerr, serr error
	deadline := time.Now().Add(10 * time.Second)
	for {
		cerr = controlAnswers(control)
		_, serr = getStatus(t, status)
		if cerr == nil && serr == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: control socket: %v; status socket: %v", what, cerr, serr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func awaitLog(t *testing.T, logs *syncBuffer, what string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(logs.String(), what) < n {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d log lines with %q; the log:\n%s", n, what, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockDir takes the exclusive flock of dir, as a daemon starting holds it
// (listenControl), until the returned release.
func lockDir(t *testing.T, dir string) func() {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	return func() { f.Close() }
}

// The control socket's and the status socket's files removed while the
// daemon runs (rm /run/autopilot-health/*) are bound again: `reload` (the
// unit's ExecReload=), `tamper clear` and `status` find the daemon, not
// "not running"; each is logged once, the sockets root's (0600). Before,
// both stayed gone until a restart.
func TestRemovedSocketsAreBoundAgain(t *testing.T) {
	_, _, control, status, logs, _ := sockDaemon(t)
	for round := 1; round <= 2; round++ {
		for _, p := range []string{control, status} {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		}
		awaitAnswers(t, control, status, "both sockets answering again after their files were removed")
		awaitLog(t, logs, "control socket's file was removed while the daemon ran; bound it again", round)
		awaitLog(t, logs, "status socket's file was removed while the daemon ran; bound it again", round)
	}
	for _, p := range []string{control, status} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want a socket of mode 0600", p, fi.Mode(), err)
		}
	}
	if n := strings.Count(logs.String(), "bound it again"); n != 4 {
		t.Errorf("%d lines say a socket was bound again, want 4 (one per removal):\n%s", n, logs.String())
	}
}

// The sockets' directory itself removed (rm -rf /run/autopilot-health) or
// renamed: it is made again (0700) and both sockets are bound in it. A
// daemon starting holds the directory's lock (listenControl): nothing is
// bound while it does, which is logged.
func TestRemovedSocketDirectoryIsMadeAgain(t *testing.T) {
	_, dir, control, status, logs, _, events := sockDaemonEvents(t)
	unlock := lockDir(t, dir)
	for _, p := range []string{control, status} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	awaitLog(t, logs, "is not bound again", 2)
	if !strings.Contains(logs.String(), "another daemon is starting on it") {
		t.Errorf("the log does not say why:\n%s", logs.String())
	}
	// Each removal tried both again; each socket's failure is logged
	// once for its reason: a file removed there once more adds none.
	handled := events.Load()
	os.WriteFile(control, nil, 0o600)
	os.Remove(control)
	deadline := time.Now().Add(10 * time.Second)
	for events.Load() == handled {
		if time.Now().After(deadline) {
			t.Fatal("the removal's event not handled within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, what := range []string{"control socket's file was removed while the daemon ran, and is not bound again", "status socket's file was removed while the daemon ran, and is not bound again"} {
		if n := strings.Count(logs.String(), what); n != 1 {
			t.Errorf("%d lines say %q, want 1 (once per reason):\n%s", n, what, logs.String())
		}
	}
	for _, p := range []string{control, status} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s bound while the directory's lock was held: %v", p, err)
		}
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	unlock()
	awaitAnswers(t, control, status, "both sockets answering in the directory made again")
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the directory made again: %v %v, want mode 0700", fi.Mode(), err)
	}

	// Renamed, with the sockets in it: bound again at their paths.
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	awaitAnswers(t, control, status, "both sockets answering after their directory was renamed")
	// And removed once more: the watch is on the directory made again.
	for _, p := range []string{control, status} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	awaitAnswers(t, control, status, "both sockets answering after a removal in the directory made again")
}

// Another daemon's socket at the path, bound once this one's file was
// removed, is left as it is: not replaced when this daemon binds again
// (something answers there: logged), and not removed when this daemon
// stops (Go's listener removed whatever file was at its path on Close).
func TestAnotherDaemonsSocketIsLeft(t *testing.T) {
	_, dir, control, status, logs, stop := sockDaemon(t)
	unlock := lockDir(t, dir)
	if err := os.Remove(status); err != nil {
		t.Fatal(err)
	}
	awaitLog(t, logs, "status socket's file was removed while the daemon ran, and is not bound again", 1)
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: status, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	other.SetUnlinkOnClose(false)
	defer other.Close()
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	unlock()
	// Another removal there makes the daemon look again: the control
	// socket is bound again, the other's status socket is left.
	if err := os.Remove(control); err != nil {
		t.Fatal(err)
	}
	awaitLog(t, logs, "control socket's file was removed while the daemon ran; bound it again", 1)
	awaitLog(t, logs, "another daemon answers on it", 1)
	if err := controlAnswers(control); err != nil {
		t.Errorf("the control socket bound again: %v", err)
	}
	stop()
	c, err := net.Dial("unix", status)
	if err != nil {
		t.Fatalf("the other daemon's status socket after this daemon stopped: %v", err)
	}
	c.Close()
	if _, err := os.Lstat(control); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the daemon's own control socket after its stop: %v, want it removed", err)
	}
}
