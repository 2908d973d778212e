package daemon

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// sendAndLeave writes req on the control socket and closes the connection
// without reading the answer: a client that stopped waiting (its timeout
// passed while the daemon was starting, or frozen) before the daemon
// accepted the connection from its backlog.
func sendAndLeave(t *testing.T, sock string, req any) {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := json.NewEncoder(c).Encode(req); err != nil {
		t.Fatal(err)
	}
}

// A `tamper clear` sent while the daemon starts waits in the control
// socket's backlog (bound in New, served once Run begins; a start whose
// state file's disk is blocked in I/O takes up to TimeoutStartSec=3min).
// Its client waits 45 s and fails (exit 2, "could not run"). The daemon
// then got to the request and applied it all the same: the findings
// dropped, logged and evented behind the back of an operator told that
// the clear had not run. A request carries the time its client waits
// until; one the daemon gets to after that is not applied, and is logged.
func TestControlRequestWhoseClientGaveUpIsNotApplied(t *testing.T) {
	cfg := tamperClearConfig(t)
	sock := t.TempDir() + "/control.sock"
	logs := &syncBuffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: newIdleListener(), ControlSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	rec := &eventRecorder{}
	d.Store().Observe(rec)
	// During the start (New done, Run not begun): the client's wait is
	// over before the daemon serves the socket.
	sendAndLeave(t, sock, map[string]any{"op": OpTamperClear, "reason": "INC-7: reviewed", "by": "uid 0",
		"until": time.Now().Add(-time.Second)})
	sendAndLeave(t, sock, map[string]any{"op": OpReload, "until": time.Now().Add(-time.Second)})
	// One whose client still waits, but less than a clear takes to be
	// applied (two saves on a hung disk) and answered.
	sendAndLeave(t, sock, map[string]any{"op": OpTamperClear, "reason": "INC-7: reviewed", "by": "uid 0",
		"until": time.Now().Add(clearApply / 2)})
	runDaemon(t, d)
	await(t, d, "both requests handled", func() bool {
		return strings.Count(logs.String(), "control request") >= 3 || strings.Contains(logs.String(), "cleared by an operator")
	})
	if strings.Contains(logs.String(), "cleared by an operator") {
		t.Fatalf("a clear whose client had stopped waiting was applied:\n%s", grepLines(logs.String(), "level=WARN"))
	}
	for want, n := range map[string]int{`op=tamper-clear`: 2, `op=reload`: 1} {
		if l := grepLines(logs.String(), want); strings.Count(l, "control request not applied: its client stopped waiting") != n {
			t.Errorf("the log of the %s requests: %q; want %d said not applied", want, l, n)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.events {
		if e.Reason == report.EventTamperCleared {
			t.Errorf("event %+v; want no clear", e)
		}
	}
}

// A request whose client still waits is applied, during the start too:
// sent before Run begins (it waits in the backlog), answered once it does.
func TestControlRequestDuringTheStartIsAppliedOnceTheDaemonRuns(t *testing.T) {
	cfg := tamperClearConfig(t)
	sock := t.TempDir() + "/control.sock"
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener(), ControlSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := json.NewEncoder(c).Encode(ControlRequest{Op: OpTamperClear, Reason: "INC-8: reviewed", By: "uid 0", Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	var a ControlAnswer
	if err := json.NewDecoder(c).Decode(&a); err != nil {
		t.Fatalf("the clear sent during the start: %v; want an answer once the daemon runs", err)
	}
	if a.Error != "" || len(a.Conditions) != 1 || a.Conditions[0].Type != "NodeTampered" {
		t.Errorf("the clear sent during the start: %+v; want applied, NodeTampered", a)
	}
}

// A daemon that holds the control socket but does not answer (still
// starting: the socket is bound at the start's beginning; or frozen): the
// command says what it may be and that the request is not applied later,
// not "reading the daemon's answer: ... i/o timeout".
func TestControlClientOfADaemonThatDoesNotAnswer(t *testing.T) {
	rw, cw := reloadClientWait, clearClientWait
	t.Cleanup(func() { reloadClientWait, clearClientWait = rw, cw })
	reloadClientWait, clearClientWait = 200*time.Millisecond, 200*time.Millisecond
	sock := t.TempDir() + "/control.sock"
	ln, err := net.Listen("unix", sock) // never accepts: the connections wait in its backlog
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := "the daemon on " + sock + " did not answer within 200ms: it may be still starting (it answers once the start is done; systemctl status autopilot-health says activating meanwhile) or hung (journalctl -u autopilot-health); a request the daemon has not got to by now is not applied: ask again"
	if _, err := RequestReload(sock); err == nil || err.Error() != want {
		t.Errorf("reload: %v\nwant %s", err, want)
	}
	if _, err := RequestTamperClear(sock, "INC-1: reviewed", "uid 0"); err == nil || err.Error() != want {
		t.Errorf("tamper clear: %v\nwant %s", err, want)
	}
}

// A frozen daemon whose control socket's backlog is full: the connect
// fails at once (EAGAIN), named for what it is, as `status` names it.
func TestControlClientOfADaemonThatTakesNoConnection(t *testing.T) {
	sock := t.TempDir() + "/control.sock"
	testenv.FullBacklogSocket(t, sock)
	want := "the daemon on " + sock + " takes no connection (its listen backlog is full): it may be hung (systemctl status autopilot-health; journalctl -u autopilot-health); nothing was sent"
	if _, err := RequestReload(sock); err == nil || err.Error() != want {
		t.Errorf("reload: %v\nwant %s", err, want)
	}
	if _, err := RequestTamperClear(sock, "INC-1: reviewed", "uid 0"); err == nil || err.Error() != want {
		t.Errorf("tamper clear: %v\nwant %s", err, want)
	}
}

// A daemon that closes the connection without an answer: at its stop the
// listener is closed with the requests in its backlog unread (the client
// reads ECONNRESET), or a request in flight is given up on after
// controlStopWait (EOF). The command says the daemon stops, not "reading
// the daemon's answer: read unix ...: connection reset by peer".
func TestControlClientOfADaemonThatClosesWithoutAnswer(t *testing.T) {
	for _, unread := range []bool{true, false} {
		sock := t.TempDir() + "/control.sock"
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if !unread {
				c.Read(make([]byte, 4096))
				return
			}
			// The request arrived, unread: the close resets the
			// connection, as a listener's close does to its backlog.
			raw, _ := c.(*net.UnixConn).SyscallConn()
			raw.Read(func(fd uintptr) bool {
				_, _, err := syscall.Recvfrom(int(fd), make([]byte, 1), syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
				return err != syscall.EAGAIN
			})
		}()
		_, err = RequestTamperClear(sock, "INC-1: reviewed", "uid 0")
		ln.Close()
		want := "the daemon on " + sock + " closed the connection without an answer: it stopped, or is stopping (systemctl status autopilot-health); a request it had not read is not applied, one it had is in journalctl -u autopilot-health: ask again once it runs"
		if err == nil || err.Error() != want {
			t.Errorf("request unread %v: %v\nwant %s", unread, err, want)
		}
	}
}

// No control socket: the daemon is not running, or it is starting (the
// socket is bound once the configuration is read, which retries for up to
// a minute on an I/O error) or stopping (the socket is removed as the stop
// begins, before the final saves). The command says so, as `status` does,
// not "not running: start it" to an operator whose unit is activating.
func TestControlClientWithNoSocketMayBeStartingOrStopping(t *testing.T) {
	sock := t.TempDir() + "/control.sock"
	_, err := RequestTamperClear(sock, "INC-1: reviewed", "uid 0")
	want := "the daemon is not running, or still starting or stopping (no control socket at " + sock + "; systemctl status autopilot-health says which: activating or deactivating while it does): if it is inactive, start it (systemctl start autopilot-health) and clear again"
	if err == nil || err.Error() != want {
		t.Errorf("tamper clear: %v\nwant %s", err, want)
	}
}

// What is at the control socket's path instead of a socket (a file, a
// directory, a symlink, one that loops, ELOOP, or runs through a file,
// ENOTDIR): `reload` and `tamper clear` name it, as `status` does for its
// socket, and as the daemon, which does not start with it there, does.
// Before, a file read as "not running, or still starting or stopping (no
// control socket at ...)", and a symlink that loops or runs through a file
// as the raw "dial unix ...: connect: too many levels of symbolic links".
// A path under a file, nothing there, keeps the connect's own error.
func TestControlClientNamesWhatIsThereInsteadOfASocket(t *testing.T) {
	dir := t.TempDir()
	file, sub, link := dir+"/file.sock", dir+"/dir.sock", dir+"/link.sock"
	loop, through := dir+"/loop.sock", dir+"/through.sock"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for l, target := range map[string]string{link: dir + "/gone", loop: loop, through: file + "/x.sock"} {
		if err := os.Symlink(target, l); err != nil {
			t.Fatal(err)
		}
	}
	for path, what := range map[string]string{file: "a regular file", sub: "a directory", link: "a symlink", loop: "a symlink", through: "a symlink"} {
		want := "the daemon is not running: " + path + " is not a socket but " + what + ", which a daemon whose control_socket names it leaves as it is, and does not start (journalctl -u autopilot-health says so)"
		_, err := RequestReload(path)
		if err == nil || err.Error() != want || !errors.Is(err, ErrNotRunning) {
			t.Errorf("reload %s: %v\nwant %s", path, err, want)
		}
		_, err = RequestTamperClear(path, "INC-1: reviewed", "uid 0")
		if err == nil || err.Error() != want {
			t.Errorf("tamper clear %s: %v\nwant %s", path, err, want)
		}
	}
	under := file + "/x.sock"
	if _, err := RequestReload(under); err == nil || !strings.Contains(err.Error(), "not a directory") || errors.Is(err, ErrNotRunning) {
		t.Errorf("reload %s: %v; want the connect's own error", under, err)
	}
}
