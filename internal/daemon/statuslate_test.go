package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A regular file at the status socket's path at the daemon's start is left
// there and no status is served (logged), and once it goes, moved away or
// deleted, the socket watch binds the status socket as it binds one whose
// file was removed while the daemon ran: status answers, without a
// restart. That first bind is logged, and not counted in
// autopilot_health_socket_rebinds_total (bound again after a removal: it
// was never bound); the watch's tries while the file is there (its start,
// the control socket's removal) log nothing more than the start did. A
// removal of its file after that is an ordinary rebind, counted. Before,
// the daemon served no status until it restarted. A stop while the file is
// still there leaves it as it is.
func TestStatusSocketNotBoundAtStartIsBoundOnceThePathIsFree(t *testing.T) {
	for _, how := range []string{"moved away", "deleted", "left there"} {
		t.Run(how, func(t *testing.T) {
			d, dir, control, status, logs, stop, events := startSockDaemon(t, func(dir, status string) {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(status, []byte("not a socket\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			})
			awaitLog(t, logs, "status socket not served", 1)
			awaitControl(t, control)
			if _, err := getStatus(t, status); err == nil {
				t.Fatal("status answers on a regular file")
			}
			// The watch reads its events: the control socket's
			// removal is handled (it is bound again).
			if err := os.Remove(control); err != nil {
				t.Fatal(err)
			}
			awaitWatchEvent(t, events, 0, "the control socket's removal")
			awaitControl(t, control)
			if how == "left there" {
				stop()
				if b, err := os.ReadFile(status); err != nil || string(b) != "not a socket\n" {
					t.Errorf("the file at the status socket's path after the stop: %q %v, want it as it was", b, err)
				}
				return
			}
			if how == "moved away" {
				if err := os.Rename(status, filepath.Join(dir, "moved-away")); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Remove(status); err != nil {
				t.Fatal(err)
			}
			awaitStatus(t, status, "status answering once the file is "+how)
			awaitLog(t, logs, "the status socket's path is free, what was there at the start gone; bound it", 1)
			if fi, err := os.Lstat(status); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %v %v, want a socket of mode 0600", status, fi.Mode(), err)
			}
			for s, want := range map[string]float64{listenerControl: 1, listenerStatus: 0} {
				if n := testutil.ToFloat64(d.rebinds.WithLabelValues(s)); n != want {
					t.Errorf("rebinds of the %s socket: %v, want %v", s, n, want)
				}
			}
			for _, not := range []string{"status socket's file was removed while the daemon ran, and is not bound again", "is not bound yet"} {
				if strings.Contains(logs.String(), not) {
					t.Errorf("the log says %q:\n%s", not, logs.String())
				}
			}
			// From now on an ordinary rebind, counted.
			if err := os.Remove(status); err != nil {
				t.Fatal(err)
			}
			awaitStatus(t, status, "status answering after its file was removed")
			awaitLog(t, logs, "status socket's file was removed while the daemon ran; bound it again", 1)
			if n := testutil.ToFloat64(d.rebinds.WithLabelValues(listenerStatus)); n != 1 {
				t.Errorf("rebinds of the status socket after its file was removed: %v, want 1", n)
			}
			stop()
			if _, err := os.Lstat(status); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the status socket's file after the stop: %v, want it removed", err)
			}
		})
	}
}

// awaitControl waits (10 s at most) until the control socket answers.
func awaitControl(t *testing.T, control string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := controlAnswers(control)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the control socket does not answer within 10s: %v", err)
		}
	}
}

// awaitStatus waits (10 s at most) until the status socket answers.
func awaitStatus(t *testing.T, status, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		err := statusAnswersOnce(status)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s: %v", what, err)
		}
	}
}
