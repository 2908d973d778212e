package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// A reload in flight when SIGTERM arrives (a SIGHUP's, or the control
// socket's: `systemctl reload`, `autopilot-health reload`) sends nothing
// after STOPPING=1: its READY=1 would tell systemd that a unit it was told
// stops is reloaded and running. The reload is held past its RELOADING=1
// (the re-plan's lock) until the daemon said STOPPING=1.
func TestReloadInFlightAtStopNotifiesNothingAfterStopping(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "the control socket answers root only (TestControlRefusesANonRootPeer)")
	}
	for _, via := range []string{"SIGHUP", "control socket"} {
		t.Run(via, func(t *testing.T) {
			sock := notifySocket(t)
			hup := make(chan os.Signal, 1)
			control := filepath.Join(t.TempDir(), "control.sock")
			f := newFileDaemon(t, "", Options{Reload: hup, ControlSocket: control})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- f.Run(ctx) }()
			next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })

			f.planMu.Lock() // the reload stops before it applies
			answered := make(chan error, 1)
			if via == "SIGHUP" {
				hup <- syscall.SIGHUP
				answered <- nil
			} else {
				go func() { _, err := RequestReload(control); answered <- err }()
			}
			next(t, sock, "the reload's RELOADING=1", func(m string) bool { return strings.HasPrefix(m, "RELOADING=1") })
			cancel() // SIGTERM
			next(t, sock, "STOPPING=1", func(m string) bool { return m == "STOPPING=1" })
			f.planMu.Unlock()
			if err := <-runErr; err != nil {
				t.Fatal(err)
			}
			if err := <-answered; err != nil {
				t.Errorf("the reload in flight: %v", err)
			}
			// Every notification sent is queued on the socket by now
			// (a datagram is in the receiver's queue once sendto
			// returns): read what is there.
			if m, ok := queued(t, sock); ok {
				t.Errorf("after STOPPING=1 the daemon notified %q", m)
			}
		})
	}
}

// queued reads the next datagram already queued on c, without waiting:
// false when none is.
func queued(t *testing.T, c *net.UnixConn) (string, bool) {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n := -1
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if rerr == unix.EAGAIN {
		return "", false
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	return string(buf[:n]), true
}
