package main

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// An answer that is JSON but not a status document (null, an empty
// object, a document without the daemon's pid and time: another program on
// the socket, or a daemon's answer cut to a valid prefix) is refused as
// such, exit 2, nothing on stdout: it is not read as a daemon with no
// condition True (exit 0, an empty screen or `null` on stdout, which a
// script takes for a healthy node). Garbage and a truncated document are
// refused the same way; with --json too.
func TestStatusOfAnAnswerThatIsNotAStatusDocument(t *testing.T) {
	for name, body := range map[string]string{
		"null":       "null",
		"empty":      "{}",
		"array":      "[]",
		"string":     `"ok"`,
		"other":      `{"status":"ok"}`,
		"truncated":  `{"version":"v1","pid":42,"conditions":[{"type":"DiskUsageHigh","status":"True"`,
		"garbage":    "\x1b[2Jhello",
		"conditions": `{"conditions":[]}`,
		"no pid":     `{"version":"v1","now":"2026-12-02T19:00:00Z","conditions":[]}`,
		"no now":     `{"version":"v1","pid":42,"conditions":[]}`,
	} {
		sock := filepath.Join(t.TempDir(), "status.sock")
		serveStatusBody(t, sock, []byte(body))
		for _, args := range [][]string{{"status", "--socket", sock}, {"status", "--json", "--socket", sock}} {
			code, out, errs := run(t, args...)
			want := "autopilot-health status: the daemon's answer on " + sock + " is not a status document"
			if code != exitError || out != "" || !strings.HasPrefix(errs, want) || len(rawControls(errs)) > 0 {
				t.Errorf("%s, %q: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout, %q", name, args, code, out, errs, want)
			}
		}
	}
	// A daemon's document, even before its first pass (no condition yet):
	// taken.
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Started: now, Now: now})
	serveStatusBody(t, sock, body)
	if code, out, errs := run(t, "status", "--socket", sock); code != exitOK || errs != "" || !strings.Contains(out, "starting (first pass of the checks not done)") {
		t.Errorf("a starting daemon's document: exit %d, stderr %q, stdout %q", code, errs, out)
	}
}

// An error answer's body (whatever answers on the socket words it) is
// written with its control characters as \xNN and cut short: not a
// terminal escape sequence on stderr, nor megabytes of it.
func TestStatusOfAnErrorAnswerIsPrintableAndShort(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("\x1b]0;pwn\x07\u009b2J\u202e" + strings.Repeat("x", 1<<20)))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	code, out, errs := run(t, "status", "--socket", sock)
	want := "autopilot-health status: the daemon on " + sock + ` answered 500 Internal Server Error: \x1b]0;pwn\x07\xc2\x9b2J\xe2\x80\xaexxx`
	if code != exitError || out != "" || !strings.HasPrefix(errs, want) || len(rawControls(errs)) > 0 || len(errs) > 1024 {
		t.Errorf("exit %d, stdout %q, stderr (%d bytes) %.300q; want exit 2 and %q, under 1 KiB", code, out, len(errs), errs, want)
	}
}

// The screen's other texts (a condition's type, reason and message, the
// summary, the node's name, the stuck loop, the configuration file, a
// reload's change, a held failure's reason) are written with \xNN escapes
// too, also from a daemon that sends them raw (one started before an
// upgrade, which took over a Node's raw message): none reaches the
// terminal as an escape sequence.
func TestStatusScreenIsPrintableFromADaemonThatSendsRawText(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	bad := "\x1b]0;pwn\x07\u009b2J\u202e"
	st := daemon.StatusReport{Version: "v1" + bad, Node: "node-1" + bad, Role: "worker" + bad, PID: 42, Started: now, Now: now, Ready: true,
		Unhealthy: "loop checks" + bad, Summary: "1 conditions: 1 problem (X" + bad + ")",
		Conditions: []daemon.ConditionStatus{{Condition: report.Condition{Type: "KernelDeadlock" + bad, Status: report.StatusTrue, Reason: report.Reason("TaskHung" + bad),
			Message: "INFO: task runc:" + bad + ":4242 blocked", LastTransitionTime: now, LastUpdateTime: now}, Source: "kmsg"}},
		Kmsg:    &daemon.KmsgStatus{Device: "/dev/kmsg" + bad, Reading: true},
		Config:  daemon.ConfigStatus{File: "/etc/autopilot-health/config" + bad + ".toml", Since: now, LastReload: &daemon.ReloadOutcome{At: now, Result: "applied", Changed: "checks.X" + bad}},
		Metrics: daemon.MetricsStatus{Address: ":20257" + bad, Serving: true},
	}
	body, _ := json.Marshal(st)
	// encoding/json writes C1 controls and bidi overrides raw; ESC and BEL
	// as \u escapes, which decode to them.
	serveStatusBody(t, sock, body)
	code, out, errs := run(t, "status", "--socket", sock)
	if raw := rawControls(out); len(raw) > 0 || code != exitProblem || errs != "" {
		t.Errorf("exit %d, stderr %q; status holds %s raw:\n%q", code, errs, strings.Join(raw, ", "), out)
	}
	if !strings.Contains(out, `INFO: task runc:\x1b]0;pwn\x07\xc2\x9b2J\xe2\x80\xae:4242 blocked`) {
		t.Errorf("the message is not written escaped:\n%s", out)
	}
}

// A daemon that does not even take the connection (its listen backlog
// full: its accepting goroutine stopped, the process frozen, while status
// was asked again and again) is named as one that may be hung, exit 2, as
// one that takes it and does not answer is: not an HTTP client's
// "connect: resource temporarily unavailable", nor "not running".
func TestStatusOfADaemonThatAcceptsNoConnection(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	testenv.FullBacklogSocket(t, sock)
	code, out, errs := run(t, "status", "--socket", sock)
	want := "autopilot-health status: the daemon on " + sock + " takes no connection (its listen backlog is full): it may be hung (systemctl status autopilot-health; journalctl -u autopilot-health)\n"
	if code != exitError || out != "" || errs != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2, %q", code, out, errs, want)
	}
}

// A text cut short on the screen is cut between characters: a body (or a
// message, an evidence, an error) in another script than Latin, cut in the
// middle of a character, left half of its UTF-8 bytes on the terminal, a
// byte that is not text (Printable writes such a byte \xNN), shown as a
// replacement glyph or taken by the terminal with what follows.
func TestStatusCutsATextBetweenCharacters(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		w.Write([]byte("a" + strings.Repeat("ü", 1000)))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	code, out, errs := run(t, "status", "--socket", sock)
	if code != exitError || out != "" || !utf8.ValidString(errs) || !strings.Contains(errs, "aüüü") || !strings.HasSuffix(errs, "ü...\n") {
		t.Errorf("exit %d, stdout %q, stderr %q: want exit 2, valid UTF-8 cut after a whole ü", code, out, errs)
	}
	for n := 0; n <= 12; n++ {
		for _, s := range []string{"ab€€€€€", "é\x1bé", "€\u202e€€"} {
			if got := shorten(s, n); !utf8.ValidString(got) || report.Printable(got) != got {
				t.Errorf("shorten(%q, %d) = %q: not printable text", s, n, got)
			}
		}
	}
}

// An answer that is not HTTP at all (another program's socket: the
// daemon's control socket, which answers a line of JSON, given for its
// status socket) is not a status document either, and is said so, with its
// first bytes printable; exit 2, nothing on stdout. Before, it was
// `asking the daemon on <socket>: Get "http://autopilot-health/v1/status":
// net/http: HTTP/1.x transport connection broken: malformed HTTP status
// code ...`, found against the shipped unit in a real systemd 252.
func TestStatusOfAnAnswerThatIsNotHTTP(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	serveControlLines(t, sock, "{\"error\":\"bad request: invalid character 'G' looking for beginning of value\x1b[2J\"}\n")
	for _, args := range [][]string{{"status", "--socket", sock}, {"status", "--json", "--socket", sock}} {
		code, out, errs := run(t, args...)
		want := "autopilot-health status: the daemon's answer on " + sock + ` is not a status document: not HTTP: {"error":"bad request: invalid character 'G'`
		if code != exitError || out != "" || !strings.HasPrefix(errs, want) || len(rawControls(errs)) > 0 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout, %q", args, code, out, errs, want)
		}
	}
}

// The daemon's failing saves of its state file (a full or read-only
// state_dir) are in the header, as a write blocked in I/O is.
func TestStatusShowsFailingStateSaves(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	body, _ := json.Marshal(daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Started: now, Now: now, Ready: true,
		StateSaveFailing: &daemon.FailingSave{Path: "/var/lib/autopilot-health/state.json", Since: now.Add(-time.Minute),
			Error: "write /var/lib/autopilot-health/state.json.tmp1: no space left on device"}})
	serveStatusBody(t, sock, body)
	code, out, errs := run(t, "status", "--socket", sock)
	want := "STATE NOT SAVED: the saves of /var/lib/autopilot-health/state.json have failed since "
	if code != exitOK || errs != "" || !strings.Contains(out, want) || !strings.Contains(out, "(1m0s ago): write /var/lib/autopilot-health/state.json.tmp1: no space left on device") {
		t.Errorf("exit %d, stderr %q, stdout %q; want %q with the error", code, errs, out, want)
	}
}

// serveControlLines serves answer on a unix socket at sock as the daemon's
// control socket answers what is not a control request: the request's
// first line read first (handleControl), then one line of JSON, and the
// connection closed. An answer written and closed before the client's
// write failed it with EPIPE, "asking the daemon on ...: broken pipe", in
// 2 of 200 runs of TestStatusOfAnAnswerThatIsNotHTTP.
func serveControlLines(t *testing.T, sock, answer string) {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			bufio.NewReader(c).ReadBytes('\n')
			c.Write([]byte(answer))
			c.Close()
		}
	}()
}
