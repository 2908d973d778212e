package daemon

import (
	"context"
	"fmt"
	"github.com/syself/autopilot-health/internal/testenv"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

type eventRecorder struct {
	mu     sync.Mutex
	events []report.Event
}

func (r *eventRecorder) ConditionChanged(*report.Condition, report.Condition) {}
func (r *eventRecorder) ConditionRestored(report.Condition)                   {}
func (r *eventRecorder) EventEmitted(e report.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func waitCond(t *testing.T, s *report.Store, typ string, want report.Status, reason report.Reason) report.Condition {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		ch := s.Changed()
		if c, ok := s.Get(typ); ok && c.Status == want && c.Reason == reason {
			return c
		}
		select {
		case <-ch:
		case <-deadline:
			c, _ := s.Get(typ)
			t.Fatalf("%s: %+v, want %s/%s", typ, c, want, reason)
		}
	}
}

// A protected file changed sets NodeTampered within seconds (file
// notifications, the interval is 5 min); it stays set after a revert; only
// the operator's clear over the control socket (root only) drops it, and
// the clear is evented.
func TestTamperClearOverTheControlSocket(t *testing.T) {
	cfg := protectOneFile(t)
	prot := filepath.Join(cfg.HostRoot, "var/lib/kubelet/config.yaml")
	sock := filepath.Join(t.TempDir(), "run", "control.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, ControlSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	rec := &eventRecorder{}
	d.Store().Observe(rec)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v %v, want mode 0600", fi, err)
	}
	if fi, _ := os.Stat(filepath.Dir(sock)); fi.Mode().Perm() != 0o700 {
		t.Errorf("control socket directory mode %o, want 0700", fi.Mode().Perm())
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	defer func() { cancel(); <-runErr }()

	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)
	// Wait for the watcher to have its directories (set after the run):
	// rewrite until the condition turns.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		os.WriteFile(prot, []byte("b\n"), 0o644)
		if c, _ := d.Store().Get("NodeTampered"); c.Status == report.StatusTrue {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("NodeTampered not set within 20s of a change (interval 5m: file notifications did not wake the check)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	os.WriteFile(prot, []byte("a\n"), 0o644) // revert
	waitCond(t, d.Store(), "NodeTampered", report.StatusTrue, report.ReasonProtectedFileChanged)

	if _, err := RequestTamperClear(sock, "", "test"); err == nil || !strings.Contains(err.Error(), "a reason is required") {
		t.Errorf("clear without a reason: %v", err)
	}
	conds, err := RequestTamperClear(sock, "reviewed: config push by ops", "sudo user alice, login user alice, uid 0")
	if os.Getuid() != 0 {
		if err == nil || !strings.Contains(err.Error(), "only root may tamper-clear") {
			t.Fatalf("clear as uid %d: %v, want refused", os.Getuid(), err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(conds) != 2 || conds[0].Type != "NodeTampered" || conds[0].Status != report.StatusFalse {
		t.Errorf("after the clear: %+v", conds)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.events) != 1 || rec.events[0].Reason != report.EventTamperCleared ||
		!strings.Contains(rec.events[0].Message, "cleared by sudo user alice, login user alice, uid 0 (uid 0, pid ") || !strings.HasSuffix(rec.events[0].Message, ": reviewed: config push by ops") {
		t.Errorf("events %+v", rec.events)
	}
}

func TestTamperClearWithoutADaemon(t *testing.T) {
	_, err := RequestTamperClear(filepath.Join(t.TempDir(), "control.sock"), "r", "me")
	if err == nil || !strings.Contains(err.Error(), "the daemon is not running") {
		t.Errorf("err %v", err)
	}
}

// Only root may clear: a peer of another uid that reaches the socket (here
// made world-writable for the test; the daemon makes it 0600) is refused
// by its kernel-given credentials (SO_PEERCRED), and the refusal is logged.
// Run as root (as the integration tier and CI do); as another user
// TestTamperClearOverTheControlSocket asserts the refusal itself.
func TestControlRefusesANonRootPeer(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "needs root to run a client as another uid; TestTamperClearOverTheControlSocket covers the refusal as this user")
	}
	if sock := os.Getenv("AUTOPILOT_HEALTH_CONTROL_HELPER"); sock != "" {
		return
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, "control.sock")
	ln, err := listenControl(sock, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	d := &Daemon{log: slog.New(slog.NewTextHandler(logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.serveControl(ctx, ln) }()
	defer func() { cancel(); <-done }()
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	// The test binary, copied where uid 65534 may run it.
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "daemon.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestControlClientAsNobody$", "-test.v")
	cmd.Env = append(os.Environ(), "AUTOPILOT_HEALTH_CONTROL_HELPER="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "refused: only root may tamper-clear (you are uid 65534)") {
		t.Fatalf("client as uid 65534 got:\n%s", out)
	}
	if !strings.Contains(logs.String(), `msg="control request refused: not root" op=tamper-clear uid=65534`) {
		t.Errorf("the refusal is not logged: %s", logs.String())
	}
}

// TestControlClientAsNobody is the client TestControlRefusesANonRootPeer
// runs as uid 65534; on its own it does nothing.
func TestControlClientAsNobody(t *testing.T) {
	sock := os.Getenv("AUTOPILOT_HEALTH_CONTROL_HELPER")
	if sock == "" {
		return
	}
	_, err := RequestTamperClear(sock, "not root", "nobody")
	fmt.Printf("answer: %v\n", err)
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer = testenv.SyncBuffer

// Who cleared is published on the Node: only the form the command states
// (names and a uid) is kept, any other text a client sends is not.
func TestStatedBy(t *testing.T) {
	for by, want := range map[string]string{
		"uid 0":                 "uid 0",
		"login user bob, uid 0": "login user bob, uid 0",
		"sudo user alice, login user alice, uid 0": "sudo user alice, login user alice, uid 0",
		"":                       "operator not stated",
		"token=eyJhbGciOi uid 0": "operator not stated",
		"uid 0\nAWS_SECRET=x":    "operator not stated",
		"sudo user " + strings.Repeat("a", 65) + ", uid 0": "operator not stated",
		"login user bob (admin), uid 0":                    "operator not stated",
	} {
		if got := statedBy(by); got != want {
			t.Errorf("statedBy(%q) = %q, want %q", by, got, want)
		}
	}
}

// A second `autopilot-health run` on a node whose daemon runs (an operator
// trying it by hand with the default configuration) refuses at once, before
// it touches the running daemon's files: the temp files of a save in flight
// are not taken for a crash's leftovers and removed, and the state file is
// not read as its own. Before, the control socket was tried after the
// state directory was cleaned, the tamper state loaded, and the metrics
// port tried.
func TestSecondDaemonRefusesBeforeTouchingTheFirstsFiles(t *testing.T) {
	cfg := testConfig(t)
	sock := filepath.Join(t.TempDir(), "run", "control.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	first, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, ControlSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, first)
	await(t, first, "the first daemon's first pass", first.readyNow)
	inFlight := filepath.Join(cfg.StateDir, "state.json.tmp4242")
	if err := os.WriteFile(inFlight, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = New(cfg, quietLog(), Options{Version: "test", ControlSocket: sock})
	if err == nil || !strings.Contains(err.Error(), "another daemon is listening") {
		t.Fatalf("a second daemon: %v, want a refusal naming the running one", err)
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("the second daemon removed the first's temp file: %v", err)
	}
}

// A clear whose write of tamper.json fails (a read-only or full state_dir)
// is applied all the same, and `autopilot-health tamper clear` prints the
// conditions it re-evaluated before it fails with "cleared, but not saved"
// (README, "Tamper conditions"): the answer over the control socket carries
// them with the error. Before, the socket's answer dropped them on any
// error, so the operator saw only the failure and not whether a layer that
// still mismatches was True again.
func TestTamperClearAnswerKeepsTheConditionsWithTheError(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skip(t, "needs root: only root may clear (TestTamperClearOverTheControlSocket asserts the refusal)")
	}
	cfg := protectOneFile(t)
	sock := filepath.Join(t.TempDir(), "run", "control.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, ControlSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	defer func() { cancel(); <-runErr }()
	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)

	k := d.currentEnv().Tamper
	k.SetWrite(func(string, []byte, os.FileMode) error {
		return &os.PathError{Op: "open", Path: k.Path() + ".tmp1", Err: syscall.EROFS}
	})
	conds, err := RequestTamperClear(sock, "INC-3: reviewed", "uid 0")
	if err == nil || !strings.Contains(err.Error(), "cleared, but not saved") {
		t.Fatalf("clear with tamper.json not writable: %v; want cleared but not saved", err)
	}
	if len(conds) != 2 || conds[0].Type != "NodeTampered" || conds[1].Type != "SealedOSTampered" {
		t.Errorf("the answer's conditions: %+v; want NodeTampered and SealedOSTampered, printed before the error", conds)
	}
}
