package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// tamperFindingSet runs until NodeTampered's baseline is taken, then changes
// the protected file and reverts it, and returns the finding's condition:
// nothing differs from the baseline any more, so a finding seen later comes
// from tamper.json, not from a change found again.
func tamperFindingSet(t *testing.T, d *Daemon, prot string) report.Condition {
	t.Helper()
	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)
	if err := os.WriteFile(prot, []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set := waitCond(t, d.Store(), "NodeTampered", report.StatusTrue, report.ReasonProtectedFileChanged)
	if err := os.WriteFile(prot, []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return set
}

// firstRunAfter waits for NodeTampered's first evaluation after since.
func firstRunAfter(t *testing.T, d *Daemon, since time.Time) report.Condition {
	t.Helper()
	await(t, d, "NodeTampered's first run", func() bool {
		c, ok := d.Store().Get("NodeTampered")
		return ok && c.LastUpdateTime.After(since)
	})
	c, _ := d.Store().Get("NodeTampered")
	return c
}

// A tamper finding whose check is disabled (a reload) and enabled again (a
// reload) is True again at the check's first run, from the findings kept in
// tamper.json, though nothing changed again: the same reason and message,
// and the lastTransitionTime of that run (the condition was off the Node).
// The warning logged when it is taken off says so. Before, it said the
// finding "comes back if the check is enabled and finds it again".
func TestATamperFindingDisabledThenEnabledByAReloadIsTrueAtTheFirstRun(t *testing.T) {
	f := newFileDaemon(t, "", Options{})
	prot := filepath.Join(f.base.HostRoot, "var/lib/kubelet/config.yaml")
	os.MkdirAll(filepath.Dir(prot), 0o755)
	os.WriteFile(prot, []byte("a\n"), 0o644)
	protect := "[checks.SealedOSTampered]\nenabled = false\n[checks.NodeTampered]\npaths = [\"/var/lib/kubelet/config.yaml\"]\nbaseline_after = []\nsettle = \"0s\"\n"
	f.write(t, protect)
	if _, err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	f.start(t)
	set := tamperFindingSet(t, f.Daemon, prot)

	f.write(t, strings.Replace(protect, "[checks.NodeTampered]\n", "[checks.NodeTampered]\nenabled = false\n", 1))
	if _, err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	if c, ok := f.Store().Get("NodeTampered"); ok {
		t.Fatalf("NodeTampered still held after its check was disabled: %+v", c)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, report.TamperFindingRemovedLog) {
		t.Errorf("the removed finding is not logged with %q:\n%s", report.TamperFindingRemovedLog, grepLines(logs, "tamper finding removed"))
	}

	enabled := time.Now()
	f.write(t, protect)
	if _, err := f.Reload(); err != nil {
		t.Fatal(err)
	}
	again := firstRunAfter(t, f.Daemon, enabled)
	if again.Status != report.StatusTrue || again.Reason != set.Reason || again.Message != set.Message {
		t.Errorf("the first run after the check is enabled again: %s/%s %q, want True/%s %q (the kept finding)",
			again.Status, again.Reason, again.Message, set.Reason, set.Message)
	}
	if !again.LastTransitionTime.After(enabled) {
		t.Errorf("lastTransitionTime %s, want that of the first run after the check was enabled again (after %s)", again.LastTransitionTime, enabled)
	}
}

// The same across restarts: a start with the check disabled drops the
// finding's condition, a start with it enabled again has it True at the
// check's first run, from tamper.json.
func TestATamperFindingDisabledThenEnabledAcrossRestartsIsTrueAtTheFirstRun(t *testing.T) {
	cfg := tamperClearConfig(t)
	prot := filepath.Join(cfg.HostRoot, "var/lib/kubelet/config.yaml")
	first, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, first)
	set := tamperFindingSet(t, first, prot)
	stop()

	cfg.Checks.NodeTampered.Enabled = false
	disabled, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := disabled.Store().Get("NodeTampered"); ok {
		t.Fatalf("a start with the check disabled holds NodeTampered: %+v", c)
	}
	stop = startDaemon(t, disabled)
	await(t, disabled, "the first pass", disabled.readyNow)
	stop()

	cfg.Checks.NodeTampered.Enabled = true
	enabled, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := enabled.Store().Get("NodeTampered"); ok {
		t.Fatalf("restored from the state file of a start with the check disabled: %+v", c)
	}
	began := time.Now()
	runDaemon(t, enabled)
	again := firstRunAfter(t, enabled, began)
	if again.Status != report.StatusTrue || again.Reason != set.Reason || again.Message != set.Message {
		t.Errorf("the first run after a start with the check enabled again: %s/%s %q, want True/%s %q (the kept finding)",
			again.Status, again.Reason, again.Message, set.Reason, set.Message)
	}
	if !again.LastTransitionTime.After(began) {
		t.Errorf("lastTransitionTime %s, want that of the first run after the start (after %s)", again.LastTransitionTime, began)
	}
}
