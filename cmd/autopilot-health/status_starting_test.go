package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Until daemon.New is done (the node detected, the state file and
// tamper.json read: milliseconds, or as long as a read of a disk blocked in
// I/O takes, up to the unit's TimeoutStartSec=) and Run has bound the status
// socket, nothing answers on it while systemd shows the unit activating;
// before that, the configuration file's read may retry for a minute. Before,
// status said "the daemon is not running" then, a false answer to whoever
// asks during a start: it says it may be starting, and how to tell. The line
// is README's, word for word (its socket the one asked).
func TestStatusOfADaemonNotAnsweringMayBeStarting(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	code, out, errs := run(t, "status", "--socket", sock)
	if code != exitError || out != "" {
		t.Fatalf("nothing on the socket: exit %d, stdout %q", code, out)
	}
	if !strings.Contains(errs, "not running, or still starting") {
		t.Errorf("nothing on the socket: %q; want it to say the daemon may still be starting", errs)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// README's quoted line, wrapped across its lines.
	m := regexp.MustCompile("`(autopilot-health status: the daemon is not running[^`]*)`").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README quotes no line of status for a daemon that does not answer")
	}
	quoted := strings.Join(strings.Fields(string(m[1])), " ")
	want := strings.ReplaceAll(quoted, "/run/autopilot-health/status.sock", sock)
	if got := strings.Join(strings.Fields(errs), " "); got != want {
		t.Errorf("status says\n  %s\nREADME says\n  %s", got, quoted)
	}
}
