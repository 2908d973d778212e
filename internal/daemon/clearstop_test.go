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
	runIntactThenStop(t, newClearDaemon(t, cfg), func(first *Daemon) {
		os.WriteFile(prot, []byte("b\n"), 0o644)
		first.currentRunner().Wake("NodeTampered")
		waitCond(t, first.Store(), "NodeTampered", report.StatusTrue, report.ReasonProtectedFileChanged)
	})

	// The clear as the daemon stops: its context is done before the
	// tamper checks ran again, then the final saves.
	clearErr := clearAsItStops(newClearDaemon(t, cfg), "INC-9: reviewed")

	c := firstRunAfterTheStart(t, newClearDaemon(t, cfg))
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
