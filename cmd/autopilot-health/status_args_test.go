package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
)

// status refuses a stray argument as bad usage (exit 2), as reload does,
// before it asks the daemon anything: `status --config cfg.toml garbage`
// does not pass for `status --config cfg.toml`.
func TestStatusRefusesExtraArguments(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "status.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte("[status]\nsocket = \""+sock+"\"\n"), 0o644)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "n1", Summary: "0 conditions: 0 ok, 0 problems"})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Write(body)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	if code, _, errs := run(t, "status", "--config", cfg); code != exitOK {
		t.Fatalf("status --config: exit %d, %q", code, errs)
	}
	asked.Store(0)
	for _, args := range [][]string{
		{"status", "--config", cfg, "garbage"},
		{"status", "garbage"},
		{"status", "--json", "--socket", sock, "garbage", "more"},
	} {
		code, out, errs := run(t, args...)
		if code != exitError || out != "" || errs != "autopilot-health status: unexpected argument \"garbage\"\n" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the daemon was asked %d times on bad usage", n)
	}
}

// A daemon that found no file at the configuration path runs on the
// embedded defaults: status says so rather than name the path as in effect.
func TestStatusShowsAnAbsentConfigFile(t *testing.T) {
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	var b strings.Builder
	printStatus(&b, daemon.StatusReport{Now: now, Config: daemon.ConfigStatus{File: "/etc/autopilot-health/config.toml", Absent: true, Since: now.Add(-time.Hour)}})
	if want := "Configuration: embedded defaults (/etc/autopilot-health/config.toml absent), in effect since "; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}

// tamper status, tamper layers and catalog refuse a stray argument as bad
// usage (exit 2, nothing on stdout), as status and tamper clear do:
// `tamper status /etc/autopilot-health/other.toml` (--config forgotten)
// does not pass for a read of the default configuration's state.
func TestTamperAndCatalogRefuseExtraArguments(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte("state_dir = \""+dir+"\"\n[status]\nsocket = \""+filepath.Join(dir, "status.sock")+"\"\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tamper", "status", "--config", cfg, "garbage"}, "autopilot-health tamper status: unexpected argument \"garbage\"\n"},
		{[]string{"tamper", "layers", "--config", cfg, "garbage"}, "autopilot-health tamper layers: unexpected argument \"garbage\"\n"},
		{[]string{"catalog", "garbage"}, "autopilot-health catalog: unexpected argument \"garbage\"\n"},
	} {
		code, out, errs := run(t, tc.args...)
		if code != exitError || out != "" || errs != tc.want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", tc.args, code, out, errs, tc.want)
		}
	}
}
