package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
)

// fakeControl answers each connection on sock with answer and records the
// requests.
func fakeControl(t *testing.T, sock string, answer daemon.ControlAnswer) <-chan daemon.ControlRequest {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	reqs := make(chan daemon.ControlRequest, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req daemon.ControlRequest
			json.NewDecoder(c).Decode(&req)
			reqs <- req
			json.NewEncoder(c).Encode(answer)
			c.Close()
		}
	}()
	return reqs
}

// reload's exit codes are what systemctl reload reports: 0 applied (what
// changed on stdout), 1 refused by the daemon (its reason on stderr, for
// the journal), 2 the daemon could not be asked.
func TestReloadCommand(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := run(t, "reload", "--socket", filepath.Join(dir, "none.sock"))
	if code != exitError || !strings.Contains(stderr, "the daemon is not running (no control socket at "+filepath.Join(dir, "none.sock")) {
		t.Errorf("without a daemon: %d %q", code, stderr)
	}

	ok := filepath.Join(dir, "ok.sock")
	reqs := fakeControl(t, ok, daemon.ControlAnswer{Reloaded: "1 key checks.DiskUsageHigh.space_percent changed; checks changed: DiskUsageHigh"})
	code, stdout, stderr := run(t, "reload", "--socket", ok)
	if code != exitOK || stdout != "reloaded: 1 key checks.DiskUsageHigh.space_percent changed; checks changed: DiskUsageHigh\n" || stderr != "" {
		t.Errorf("applied: %d %q %q", code, stdout, stderr)
	}
	if r := <-reqs; r.Op != daemon.OpReload {
		t.Errorf("request %+v", r)
	}

	bad := filepath.Join(dir, "bad.sock")
	why := "/etc/autopilot-health/config.toml:12: key checks.DiskUsageHigh.space_percnt: unknown key"
	fakeControl(t, bad, daemon.ControlAnswer{Error: why})
	code, stdout, stderr = run(t, "reload", "--socket", bad)
	if code != exitProblem || stdout != "" || stderr != "autopilot-health reload: refused: "+why+"\n" {
		t.Errorf("refused: %d %q %q", code, stdout, stderr)
	}
}

// Without --socket, reload asks the control socket the file names, even
// when the daemon would refuse the file (its refusal is the answer the
// operator needs); a file that is not TOML at all gives the default.
func TestReloadFindsTheControlSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "control.sock")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.toml", "control_socket = \""+sock+"\"\n")
	refused := write("refused.toml", "control_socket = \""+sock+"\"\n[checks.DiskUsageHigh]\nspace_percnt = 3\n")
	garbage := write("garbage.toml", "control_socket = \n[[[")
	for path, want := range map[string]string{good: sock, refused: sock, garbage: config.Default().ControlSocket} {
		if got := controlSocketOf(path, true); got != want {
			t.Errorf("%s: %q, want %q", filepath.Base(path), got, want)
		}
	}
	fakeControl(t, sock, daemon.ControlAnswer{Error: "refused.toml:3: key checks.DiskUsageHigh.space_percnt: unknown key"})
	if code, _, stderr := run(t, "reload", "--config", refused); code != exitProblem || !strings.Contains(stderr, "refused: refused.toml:3") {
		t.Errorf("reload --config refused.toml: %d %q", code, stderr)
	}
}
