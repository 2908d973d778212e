package daemon

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// A clear in flight as the daemon stops (SIGTERM before the tamper checks
// ran again) answered "cleared; the daemon is stopping before the tamper
// checks ran again: they run when it starts" (exit 1): the operator took
// the findings for cleared, and the next start brought NodeTampered back
// True (held, as saved: only a clear this process made, or one the Node
// shows, lowers it). The answer says so.
func TestTamperClearAtStopSaysTheStartBringsTheFindingsBack(t *testing.T) {
	cfg := tamperClearConfig(t)
	prot := filepath.Join(cfg.HostRoot, "var/lib/kubelet/config.yaml")
	first, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	waitCond(t, first.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)
	os.WriteFile(prot, []byte("b\n"), 0o644)
	first.currentRunner().Wake("NodeTampered")
	waitCond(t, first.Store(), "NodeTampered", report.StatusTrue, report.ReasonProtectedFileChanged)
	cancel()
	<-done

	// The clear as the daemon stops: its context is done before the
	// tamper checks ran again, then the final saves.
	stopping, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	_, clearErr := stopping.ClearTamper(stopped, "INC-9: reviewed", "uid 0 (uid 0, pid 1)")
	stopping.finalSave()
	stopping.finalTamperSave()

	second, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	runDaemon(t, second)
	await(t, second, "NodeTampered's first run", func() bool {
		c, ok := second.Store().Get("NodeTampered")
		return ok && c.LastUpdateTime.After(began)
	})
	c, _ := second.Store().Get("NodeTampered")
	const back = "the next start brings the findings back"
	if c.Status == report.StatusTrue && (clearErr == nil || !strings.Contains(clearErr.Error(), back)) {
		t.Errorf("the answer of a clear at stop: %v; NodeTampered after the next start: %s/%s; want the answer to say %q", clearErr, c.Status, c.Reason, back)
	}
}

// A clear that reaches the daemon once it stops (SIGTERM: its context is
// done before the request is read) is refused, not applied: applied, the
// tamper checks do not run again, the clear reaches no Node, and the next
// start holds the findings as saved, while the answer, "cleared; ...",
// had the operator take them for cleared.
func TestTamperClearReachingAStoppingDaemonIsNotApplied(t *testing.T) {
	cfg := tamperClearConfig(t)
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	rec := &eventRecorder{}
	d.Store().Observe(rec)
	ln, err := net.Listen("unix", t.TempDir()+"/control.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	json.NewEncoder(client).Encode(ControlRequest{Op: OpTamperClear, Reason: "INC-10: reviewed", By: "uid 0", Until: time.Now().Add(time.Minute)})
	stopped, stop := context.WithCancel(context.Background())
	stop()
	d.handleControl(stopped, server.(*net.UnixConn))
	var a ControlAnswer
	if err := json.NewDecoder(client).Decode(&a); err != nil {
		t.Fatal(err)
	}
	const want = "not applied: the daemon is stopping (SIGTERM); clear again once it runs (systemctl status autopilot-health)"
	if a.Error != want || len(a.Conditions) != 0 {
		t.Errorf("a clear reaching a stopping daemon: %+v; want %q and no conditions", a, want)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.events {
		if e.Reason == report.EventTamperCleared {
			t.Errorf("event %+v; want no clear", e)
		}
	}
}
