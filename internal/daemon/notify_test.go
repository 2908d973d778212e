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

// systemdSplit splits a notification into its lines as systemd does
// (strv_split_newlines: extract_first_word with no flags): a backslash
// escapes the next character, and one at the very end is an error (ok
// false: systemd drops the notification).
func systemdSplit(m string) (lines []string, ok bool) {
	var cur strings.Builder
	for i := 0; i < len(m); i++ {
		switch c := m[i]; {
		case c == '\\':
			if i+1 == len(m) {
				return nil, false
			}
			i++
			cur.WriteByte(m[i])
		case c == '\n':
			lines = append(lines, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(c)
		}
	}
	return append(lines, cur.String()), true
}

// The status line's backslashes (a control character made printable,
// `\x01`; a regular expression in a refused reload's error) reach
// `systemctl status` as the daemon wrote them: sent doubled, which
// systemd's split undoes (seen in a real systemd 252:
// TestRefusedReloadsBackslashesInSystemctlStatus). Cut to the buffer, the
// line still splits, its end the backslashes and the "...": never a lone backslash.
func TestNotifiedBackslashesSurviveSystemdsSplit(t *testing.T) {
	line := `configuration reload refused (running on the previous one): config.toml:9: key kmsg.rules[0].pattern: error parsing regexp: missing closing ): ` + "`EXT4-fs \\(\\d+`" + `, got "\x01\\"; 1 condition: 1 ok`
	m := "READY=1\nSTATUS=" + fitNotify(line)
	if l, ok := systemdSplit(m); !ok || len(l) != 2 || l[1] != "STATUS="+line {
		t.Errorf("systemd reads %q (ok %v); want STATUS=%s", l, ok, line)
	}
	for pad := range 4 {
		long := "STATUS=" + strings.Repeat("x", pad) + strings.Repeat(`\`, notifyMax)
		f := fitNotify(long)
		if len(f) > notifyMax {
			t.Errorf("pad %d: %d bytes", pad, len(f))
		}
		l, ok := systemdSplit(f)
		if !ok || len(l) != 1 || !strings.HasSuffix(l[0], `\...`) || strings.Count(l[0], `\`) < notifyMax/2-8 {
			t.Errorf("pad %d: systemd reads %.40q...%q (ok %v)", pad, l, f[max(0, len(f)-10):], ok)
		}
	}
}
