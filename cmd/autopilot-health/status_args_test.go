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

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report"
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
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "n1", PID: 42, Now: time.Now(), Summary: "0 conditions: 0 ok, 0 problems"})
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

// A True held through failed runs of its check says so beside its
// message, with the failure the check would have set: the operator is not
// told the check found it True a minute ago when its last runs failed. The
// evidence beside the message is the run's that decided the True; what the
// failed run collected (a certificate file "not a regular file") is under
// the line that says it failed, labelled so: before, it was shown as the
// condition's evidence, read as the reason for the True.
func TestStatusShowsATrueHeldThroughAFailedRun(t *testing.T) {
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	c := daemon.ConditionStatus{Condition: report.Condition{Type: "ServiceNotRecovering", Status: report.StatusTrue, Reason: report.ReasonUnitFailed,
		Message: "kubelet.service failed", LastTransitionTime: now.Add(-time.Hour), LastUpdateTime: now.Add(-2 * time.Minute)}, Source: "check",
		Held: &daemon.HeldStatus{HeldFailure: checks.HeldFailure{Runs: 2, Since: now.Add(-time.Minute - 30*time.Second), Reason: report.ReasonCheckFailed, Message: "Message recipient disconnected from message bus without replying"}}}
	var b strings.Builder
	printStatus(&b, daemon.StatusReport{Now: now, Conditions: []daemon.ConditionStatus{c}})
	held := "  held through 2 failed runs of its check in a row since " + now.Add(-time.Minute-30*time.Second).Local().Format("2006-01-02 15:04:05") +
		" (1m30s ago) (CheckFailed: Message recipient disconnected from message bus without replying); a 3rd makes what its check found Unknown\n"
	if want := "  kubelet.service failed\n" + held; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}

	// With evidence: the deciding run's under the message, the failed
	// run's under the held line, labelled.
	c = daemon.ConditionStatus{Condition: report.Condition{Type: "CertificateExpiringSoon", Status: report.StatusTrue, Reason: report.ReasonCertificateExpiringSoon,
		Message: "kubelet-client-current.pem expires in 48h: not renewed within 168h", LastTransitionTime: now.Add(-time.Hour), LastUpdateTime: now.Add(-2 * time.Minute)}, Source: "check",
		Evidence: map[string]any{"certs.certs": []any{map[string]any{"file": "/k.pem", "notAfter": "2026-12-04T19:00:00Z"}}},
		Held: &daemon.HeldStatus{HeldFailure: checks.HeldFailure{Runs: 1, Since: now.Add(-time.Minute), Reason: report.ReasonCheckFailed, Message: "/k.pem: not a regular file"},
			Evidence: map[string]any{"certs.certs": []any{map[string]any{"file": "/k.pem", "error": "not a regular file"}}}}}
	b.Reset()
	printStatus(&b, daemon.StatusReport{Now: now, Conditions: []daemon.ConditionStatus{c}})
	want := "  kubelet-client-current.pem expires in 48h: not renewed within 168h\n" +
		"  evidence certs.certs: [{\"file\":\"/k.pem\",\"notAfter\":\"2026-12-04T19:00:00Z\"}]\n" +
		"  held through 1 failed run of its check in a row since " + now.Add(-time.Minute).Local().Format("2006-01-02 15:04:05") +
		" (1m0s ago) (CheckFailed: /k.pem: not a regular file); a 3rd makes what its check found Unknown\n" +
		"  the last failed run's evidence (not what decided True) certs.certs: [{\"error\":\"not a regular file\",\"file\":\"/k.pem\"}]\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("status lacks\n%s\nin\n%s", want, b.String())
	}
	if n := strings.Count(b.String(), "evidence certs.certs:"); n != 1 {
		t.Errorf("%d lines of unlabelled evidence, want 1 (the deciding run's):\n%s", n, b.String())
	}

	c.Held = nil
	b.Reset()
	printStatus(&b, daemon.StatusReport{Now: now, Conditions: []daemon.ConditionStatus{c}})
	if strings.Contains(b.String(), "held through") || strings.Contains(b.String(), "failed run") {
		t.Errorf("a True not held says it is:\n%s", b.String())
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

// An empty value given to a flag is bad usage (exit 2, the flag named,
// nothing on stdout, nothing asked or run), not its default taken
// silently: `status --socket ""` asked the default socket, `check --only
// ""` ran every check, `run --privileged-helper=$UNSET` ran without the
// helper, `man --date "$(date ... failed)"` printed an undated page.
func TestEmptyFlagValuesAreBadUsage(t *testing.T) {
	dir := t.TempDir()
	var asked atomic.Int32
	listen := func(name string) string {
		p := filepath.Join(dir, name)
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Add(1) })}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return p
	}
	status, control := listen("status.sock"), listen("control.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte("state_dir = \""+dir+"\"\ncontrol_socket = \""+control+"\"\n[status]\nsocket = \""+status+"\"\n"), 0o644)
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("role = \"master\"\n"), 0o644)
	empty := func(cmd, flag string) string {
		return "autopilot-health " + cmd + ": --" + flag + " is empty: give it a value, or leave the flag out for its default\n"
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--config", cfg, "--socket", ""}, empty("status", "socket")},
		{[]string{"status", "--config", cfg, "--socket="}, empty("status", "socket")},
		{[]string{"status", "--config", ""}, empty("status", "config")},
		{[]string{"reload", "--config", cfg, "--socket", ""}, empty("reload", "socket")},
		{[]string{"reload", "--config", ""}, empty("reload", "config")},
		{[]string{"check", "--config", cfg, "--only", ""}, empty("check", "only")},
		{[]string{"check", "--config", cfg, "--only", " , "}, "autopilot-health check: --only \" , \" names no condition: name one, or leave the flag out for every check\n"},
		{[]string{"check", "--config", ""}, empty("check", "config")},
		{[]string{"run", "--config", bad, "--privileged-helper", ""}, empty("run", "privileged-helper")},
		{[]string{"run", "--config", ""}, empty("run", "config")},
		{[]string{"kmsg", "rules", "--config", ""}, empty("kmsg rules", "config")},
		{[]string{"kmsg", "replay", "--config", "", "-"}, empty("kmsg replay", "config")},
		{[]string{"tamper", "status", "--config", ""}, empty("tamper status", "config")},
		{[]string{"tamper", "layers", "--config", ""}, empty("tamper layers", "config")},
		{[]string{"tamper", "clear", "--config", "", "--reason", "x"}, empty("tamper clear", "config")},
		{[]string{"man", "--date", ""}, empty("man", "date")},
	} {
		code, out, errs := run(t, tc.args...)
		if code != exitError || out != "" || errs != tc.want {
			t.Errorf("%q: exit %d, stdout %.80q, stderr %q; want exit 2, stderr %q", tc.args, code, out, errs, tc.want)
		}
	}
	// tamper clear's --reason keeps its own word: a clear is deliberate.
	if code, out, errs := run(t, "tamper", "clear", "--config", cfg, "--reason", ""); code != exitError || out != "" || !strings.Contains(errs, "--reason is required") {
		t.Errorf("tamper clear --reason \"\": exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the daemon was asked %d times on bad usage", n)
	}
}

// A --config that is not there (a typo) names no socket: status and reload
// ask the default one alone, and where nothing answers there they say the
// file is not there and its socket not known, exit 2, not "not running":
// the daemon may run on the socket the meant file names (tamper clear
// refuses such a file at once). Before, both said "the daemon is not
// running" (found against a standalone daemon, opsaudit).
func TestStatusAndReloadOfAConfigFileNotThere(t *testing.T) {
	needNoDefaultSocketDir(t)
	absent := filepath.Join(t.TempDir(), "conifg.toml")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--config", absent}, "autopilot-health status: " + absent + ": no such file: the status socket it names is not known; nothing answers on " + config.Default().Status.Socket + "\n"},
		{[]string{"status", "--json", "--config=" + absent}, "autopilot-health status: " + absent + ": no such file: the status socket it names is not known; nothing answers on " + config.Default().Status.Socket + "\n"},
		{[]string{"reload", "--config", absent}, "autopilot-health reload: " + absent + ": no such file: the control socket it names is not known; nothing answers on " + config.Default().ControlSocket + "\n"},
	} {
		code, out, errs := run(t, tc.args...)
		if code != exitError || out != "" || errs != tc.want {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
}
