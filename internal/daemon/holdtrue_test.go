package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/report"
)

// Through the daemon: a True whose check then fails (nodes.json replaced by
// a directory) stays True with its transition time, and the status document
// says it is held and what the failed run found; once the check decides
// again nothing is held.
func TestStatusShowsATrueHeldThroughAFailedRun(t *testing.T) {
	cfg := testConfig(t)
	cfg.Metrics.ListenAddress = "127.0.0.1:0"
	stat := fmt.Sprintf("cpu 0 0 0 0\nbtime %d\n", time.Now().Add(-time.Hour).Unix())
	if err := os.WriteFile(filepath.Join(cfg.HostRoot, checks.ProcStat), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.HostRoot, cfg.Checks.NodeInfoStale.Path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	nodeInfo := func() ConditionStatus {
		for _, c := range d.Status(time.Now()).Conditions {
			if c.Type == "NodeInfoStale" {
				return c
			}
		}
		return ConditionStatus{}
	}
	await(t, d, "NodeInfoStale True", func() bool { return nodeInfo().Status == report.StatusTrue })
	was := nodeInfo()
	if was.Held != nil {
		t.Errorf("held after a run that decided: %+v", was.Held)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	d.currentRunner().Wake("NodeInfoStale")
	await(t, d, "the failed run held", func() bool { return nodeInfo().Held != nil })
	c := nodeInfo()
	if c.Status != report.StatusTrue || c.Reason != report.ReasonNodeInfoInvalid || !c.LastTransitionTime.Equal(was.LastTransitionTime) ||
		c.Held.Runs != 1 || c.Held.Reason != report.ReasonCheckFailed || !strings.HasSuffix(c.Held.Message, "nodes.json is a directory") {
		t.Errorf("after one failed run: %+v held %+v; want True since %v, held through 1 CheckFailed", c.Condition, c.Held, was.LastTransitionTime)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{torn again"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.currentRunner().Wake("NodeInfoStale")
	await(t, d, "the check deciding again", func() bool { return nodeInfo().Held == nil })
	if c := nodeInfo(); c.Status != report.StatusTrue || !c.LastTransitionTime.Equal(was.LastTransitionTime) {
		t.Errorf("after the check decided again: %+v, want True since %v", c.Condition, was.LastTransitionTime)
	}
}
