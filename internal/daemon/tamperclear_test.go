package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// tamperClearConfig is a daemon protecting one file, with no gate and no
// settling: the baseline is taken at the first run.
func tamperClearConfig(t *testing.T) *config.Config {
	cfg := protectOneFile(t)
	cfg.Checks.SealedOSTampered.Enabled = false
	return cfg
}

// protectOneFile is the test configuration with NodeTampered protecting
// one file, /var/lib/kubelet/config.yaml ("a\n"), with no gate and no
// settling.
func protectOneFile(t *testing.T) *config.Config {
	cfg := testConfig(t)
	prot := filepath.Join(cfg.HostRoot, "var/lib/kubelet/config.yaml")
	os.MkdirAll(filepath.Dir(prot), 0o755)
	os.WriteFile(prot, []byte("a\n"), 0o644)
	cfg.Checks.NodeTampered.Paths = []string{"/var/lib/kubelet/config.yaml"}
	cfg.Checks.NodeTampered.BaselineAfter = nil
	cfg.Checks.NodeTampered.Settle.Duration = 0
	return cfg
}

// onDisk is what a daemon started now would compare: the baseline digest
// state.json keeps for this boot, and the baseline tamper.json holds.
func onDisk(t *testing.T, dir, boot string) (kept, baseline string) {
	t.Helper()
	s := report.NewStore(boot)
	if _, err := s.Load(dir); err != nil {
		t.Fatal(err)
	}
	s.Memo(checks.TamperMemoKey, &kept)
	st, err := tamper.LoadStateReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st != nil && st.Baseline != nil && st.Baseline.BootID == boot {
		baseline = st.Baseline.Digest
	}
	return kept, baseline
}

// crashPointDaemon runs a daemon whose every write of state.json and of
// tamper.json is checked as a crash point: after it, the digest state.json
// keeps must be none or the baseline tamper.json holds (else a restart
// there finds a false BaselineCorrupt). It returns once NodeTampered ran
// (False, NodeIntact); crashPoints lists the writes after which it did not.
func crashPointDaemon(t *testing.T) (d *Daemon, cfg *config.Config, k *tamper.Keeper, boot string, crashPoints func() []string) {
	t.Helper()
	cfg = tamperClearConfig(t)
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	k = d.currentEnv().Tamper
	boot = d.currentEnv().BootID
	var mu sync.Mutex
	var bad []string
	writeAndCheck := func(file string) func(string, []byte, os.FileMode) error {
		return func(path string, data []byte, perm os.FileMode) error {
			mu.Lock()
			defer mu.Unlock()
			err := report.WriteFileAtomic(path, data, perm)
			if kept, base := onDisk(t, cfg.StateDir, boot); kept != "" && kept != base {
				bad = append(bad, fmt.Sprintf("after a write of %s: state.json keeps %s, tamper.json holds %q", file, kept, base))
			}
			return err
		}
	}
	d.stateW.write = writeAndCheck(report.StateFileName)
	k.SetWrite(writeAndCheck(tamper.StateFileName))
	runDaemon(t, d)
	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)
	return d, cfg, k, boot, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), bad...)
	}
}

// A daemon killed (SIGKILL, a crash, a power loss) at any point of an
// operator's clear finds no false BaselineCorrupt at its start: after each
// write of state.json and of tamper.json, the digest state.json keeps is
// none or the baseline tamper.json holds. Before, the clear wrote
// tamper.json without the baseline while state.json kept the old digest
// (until the check's next run and the persister's save a second after
// it), and the check's next run wrote the new baseline with state.json
// still naming the old one: a restart in either window set NodeTampered
// True, BaselineCorrupt ("this boot's baseline ... is gone from the tamper
// state", "... was replaced by ..."), on a node the operator had just
// cleared. A tamper.json edited after the clear is still detected: the
// new baseline's digest is kept once it is written.
func TestTamperClearLeavesNoCrashPointWithAFalseBaselineCorrupt(t *testing.T) {
	d, cfg, k, boot, crashPoints := crashPointDaemon(t)
	if err := d.saveStateNow(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	first := k.State().Baseline.Digest
	if kept, _ := onDisk(t, cfg.StateDir, boot); kept != first {
		t.Fatalf("state.json keeps %q, want the baseline's digest %s", kept, first)
	}

	if _, err := d.ClearTamper(context.Background(), "INC-7: reviewed", "uid 0 (uid 0, pid 1)"); err != nil {
		t.Fatal(err)
	}
	second := k.State().Baseline
	if second == nil || second.Digest == first {
		t.Fatalf("no new baseline after the clear: %+v", second)
	}
	if err := d.saveStateNow(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if kept, base := onDisk(t, cfg.StateDir, boot); kept != second.Digest || base != second.Digest {
		t.Errorf("after the clear state.json keeps %q, tamper.json holds %q; want both the new baseline %s (an edited tamper.json stays detected)", kept, base, second.Digest)
	}
	for _, b := range crashPoints() {
		t.Error(b)
	}
}

// SIGTERM after an operator's clear, before NodeTampered ran again (here
// a daemon that had not run it yet): the stop's save of state.json named
// the baseline the clear had dropped from tamper.json, and the next start
// set NodeTampered True, BaselineCorrupt. It takes the new baseline
// instead.
func TestTamperClearThenStopBeforeTheCheckRan(t *testing.T) {
	cfg := tamperClearConfig(t)
	runIntactThenStop(t, newClearDaemon(t, cfg), nil)
	clearAsItStops(newClearDaemon(t, cfg), "INC-8: reviewed") // the stop comes before the check's run the clear woke
	if c := firstRunAfterTheStart(t, newClearDaemon(t, cfg)); c.Status != report.StatusFalse || c.Reason != report.ReasonNodeIntact {
		t.Errorf("after a clear and a stop: NodeTampered %s/%s %q, want False/NodeIntact", c.Status, c.Reason, c.Message)
	}
}

// A clear asked for as the daemon stops (SIGTERM while `autopilot-health
// tamper clear` waits for the re-evaluation) is applied, logged and
// evented all the same: the answer says so, with the conditions, and that
// the re-evaluation is the next start's. Before, it was `context
// canceled` alone, which the command printed as a clear that could not
// run (exit 2), on a node whose findings were gone.
func TestTamperClearAtStopSaysItIsCleared(t *testing.T) {
	cfg := tamperClearConfig(t)
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)
	stopping, stop := context.WithCancel(context.Background())
	stop()
	conds, err := d.ClearTamper(stopping, "INC-9: reviewed", "uid 0 (uid 0, pid 1)")
	if err == nil || !strings.Contains(err.Error(), "cleared; the daemon is stopping") {
		t.Errorf("a clear as the daemon stops: %v; want it said to be cleared", err)
	}
	if len(conds) != 1 || conds[0].Type != "NodeTampered" {
		t.Errorf("the answer's conditions: %+v; want NodeTampered", conds)
	}
}

// Two operators' clears at the same time: the second one's preparation
// (state.json saved without this boot's baseline digest) was undone by
// the first one's clear, so the baseline the check took after the first
// clear was kept in state.json while the second clear dropped it from
// tamper.json: a restart then set NodeTampered True, BaselineCorrupt, on a
// node two operators had just cleared. Here the second clear comes while
// the first one is prepared; whether it waits for the first one or runs
// beside it, no write of state.json or tamper.json leaves state.json
// naming a baseline tamper.json does not hold.
func TestTwoTamperClearsAtOnceLeaveNoFalseBaselineCorrupt(t *testing.T) {
	d, cfg, k, boot, crashPoints := crashPointDaemon(t)
	first := k.State().Baseline.Digest

	// The second clear is asked for once the first is prepared; the first
	// goes on once the second has either begun waiting for it or been
	// prepared itself. Once prepared, the second goes on after the check
	// took the baseline after the first clear and state.json was saved.
	secondArrived := make(chan struct{})
	var arrived sync.Once
	secondDone := make(chan error, 1)
	clearStepHook = func(step, reason string) {
		switch {
		case reason == "first" && step == "prepared":
			go func() {
				_, err := d.ClearTamper(context.Background(), "second", "uid 0 (uid 0, pid 2)")
				secondDone <- err
			}()
			<-secondArrived
		case reason == "second":
			arrived.Do(func() { close(secondArrived) })
			if step != "prepared" {
				return
			}
			await(t, d, "the baseline after the first clear, on disk", func() bool {
				_, base := onDisk(t, cfg.StateDir, boot)
				return base != "" && base != first
			})
			if err := d.saveStateNow(5 * time.Second); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() { clearStepHook = nil })
	if _, err := d.ClearTamper(context.Background(), "first", "uid 0 (uid 0, pid 1)"); err != nil {
		t.Fatal(err)
	}
	if err := <-secondDone; err != nil {
		t.Fatal(err)
	}
	await(t, d, "the baseline after both clears, on disk", func() bool { return k.KeptDigest() != "" })
	if err := d.saveStateNow(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	last := k.State().Baseline
	if kept, base := onDisk(t, cfg.StateDir, boot); last == nil || kept != last.Digest || base != last.Digest {
		t.Errorf("after both clears state.json keeps %q, tamper.json holds %q; want both the last baseline %+v", kept, base, last)
	}
	for _, b := range crashPoints() {
		t.Error(b)
	}
}

// newClearDaemon is a daemon of cfg (tamperClearConfig's) that serves no
// status socket.
func newClearDaemon(t *testing.T, cfg *config.Config) *Daemon {
	t.Helper()
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// runIntactThenStop runs d until NodeTampered is False (NodeIntact), then
// runs then (when not nil) while d still runs, and stops d: its Run has
// returned, its state saved.
func runIntactThenStop(t *testing.T, d *Daemon, then func(d *Daemon)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitCond(t, d.Store(), "NodeTampered", report.StatusFalse, report.ReasonNodeIntact)
	if then != nil {
		then(d)
	}
	cancel()
	<-done
}

// clearAsItStops asks d, a daemon not run, for a tamper clear with its
// context already done (the stop comes before the tamper checks run
// again), then makes d's final saves and releases the state directory, as
// its stop does. It returns the clear's answer.
func clearAsItStops(d *Daemon, ticket string) error {
	stopped, stop := context.WithCancel(context.Background())
	stop()
	_, err := d.ClearTamper(stopped, ticket, "uid 0 (uid 0, pid 1)")
	d.finalSaves()
	return err
}

// firstRunAfterTheStart runs d and returns NodeTampered as its first run
// in d set it (not the condition restored from state.json).
func firstRunAfterTheStart(t *testing.T, d *Daemon) report.Condition {
	t.Helper()
	began := time.Now()
	runDaemon(t, d)
	await(t, d, "NodeTampered's first run", func() bool {
		c, ok := d.Store().Get("NodeTampered")
		return ok && c.LastUpdateTime.After(began)
	})
	c, _ := d.Store().Get("NodeTampered")
	return c
}
