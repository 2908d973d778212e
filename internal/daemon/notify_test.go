package daemon

import (
	"errors"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The notifications reach the socket in NOTIFY_SOCKET, a path or a name in
// the abstract namespace, by the socket kept open (sendRaw), and follow a
// change of the variable; where the raw send cannot go (no listener),
// go-systemd's error is returned.
func TestNotifierSendsOnTheKeptSocket(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock"), "@autopilot-health-test-" + filepath.Base(dir)} {
		addr := &net.UnixAddr{Name: name, Net: "unixgram"}
		c, err := net.ListenUnixgram("unixgram", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", name)
		var n Notifier
		if err := n.Watchdog(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		made := notifySock.made
		if !sendRaw("STATUS=raw") || !sendRaw("STATUS=raw") || notifySock.made != made {
			t.Errorf("%s: not sent on the kept socket (%d sockets made for two sends)", name, notifySock.made-made)
		}
		for _, want := range []string{"WATCHDOG=1", "STATUS=raw", "STATUS=raw"} {
			buf := make([]byte, 64)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			k, err := c.Read(buf)
			if err != nil || string(buf[:k]) != want {
				t.Errorf("%s: read %q, %v; want %q", name, buf[:k], err, want)
			}
		}
		c.Close()
	}
	gone := filepath.Join(dir, "gone.sock")
	t.Setenv("NOTIFY_SOCKET", gone)
	if sendRaw("WATCHDOG=1") {
		t.Error("sent to a socket nobody listens on")
	}
	var n Notifier
	if err := n.Watchdog(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no listener: %v, want go-systemd's error (no such file)", err)
	}
}

// A notification longer than systemd reads (4096 bytes) would be ignored
// whole, READY=1 with it: its STATUS= is cut to fit, on a rune boundary.
func TestNotifierFitsSystemdsBuffer(t *testing.T) {
	sock := notifySocket(t)
	var n Notifier
	if err := n.Ready(strings.Repeat("é", 5000)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	sock.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := sock.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	m := string(buf[:k])
	if k > notifyMax || !strings.HasPrefix(m, "READY=1\nSTATUS=éé") || !strings.HasSuffix(m, "é...") || !utf8.ValidString(m) {
		t.Errorf("a notification of %d bytes: %.40q...%q", k, m, m[max(0, len(m)-10):])
	}
}
