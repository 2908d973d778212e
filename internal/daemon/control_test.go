package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	cfg := testConfig(t)
	prot := filepath.Join(cfg.HostRoot, "var/lib/kubelet/config.yaml")
	os.MkdirAll(filepath.Dir(prot), 0o755)
	os.WriteFile(prot, []byte("a\n"), 0o644)
	cfg.Checks.NodeTampered.Paths = []string{"/var/lib/kubelet/config.yaml"}
	cfg.Checks.NodeTampered.BaselineAfter = nil
	cfg.Checks.NodeTampered.Settle.Duration = 0
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
	conds, err := RequestTamperClear(sock, "reviewed: config push by ops", "tester")
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
		!strings.Contains(rec.events[0].Message, "cleared by tester (uid 0, pid ") || !strings.HasSuffix(rec.events[0].Message, ": reviewed: config push by ops") {
		t.Errorf("events %+v", rec.events)
	}
}

func TestTamperClearWithoutADaemon(t *testing.T) {
	_, err := RequestTamperClear(filepath.Join(t.TempDir(), "control.sock"), "r", "me")
	if err == nil || !strings.Contains(err.Error(), "the daemon is not running") {
		t.Errorf("err %v", err)
	}
}
