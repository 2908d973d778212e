package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/testenv"
)

// An operator sets status.socket = "" in the file of a running daemon
// (the key needs a restart to change: a reload refuses it) and asks
// `status`: the daemon, started on the default socket, still answers there
// and is shown; "the daemon serves no status" only once nothing answers
// (README: "the default one is asked too"). Before, status said the daemon
// served no status without asking it. The default socket is the real path
// (/run/autopilot-health/status.sock): the test binary re-executes itself
// under unshare(1) (needs root) and serves it on a tmpfs over /run of its
// own mount namespace, never the host's.
func TestStatusOfAFileThatEmptiedTheSocketAsksTheDaemon(t *testing.T) {
	if !testenv.InMountNamespace(t, "mounting a tmpfs over /run") {
		return
	}

	if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs over /run: %v", err)
	}
	def := config.Default().Status.Socket
	if err := os.MkdirAll(filepath.Dir(def), 0o750); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[status]\nsocket = \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", def)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "n1", PID: 42, Now: time.Now(), Summary: "0 conditions: 0 ok, 0 problems"})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) })}
	go srv.Serve(ln)
	if code, out, errs := run(t, "status", "--config", cfg); code != exitOK || !strings.Contains(out, "autopilot-health v1 on node n1") {
		t.Errorf("status of a daemon still serving the default socket, the file emptying status.socket: exit %d %q %q", code, out, errs)
	}
	srv.Close()
	os.Remove(def)
	want := "autopilot-health status: status.socket is empty in the configuration: the daemon serves no status\n"
	if code, out, errs := run(t, "status", "--config", cfg); code != exitError || out != "" || errs != want {
		t.Errorf("status with nothing on the default socket: exit %d %q %q, want exit 2 %q", code, out, errs, want)
	}
}
