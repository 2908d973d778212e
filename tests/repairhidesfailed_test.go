//go:build integration

package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// A failed kubelet stand-in whose restart systemd refuses
// (RefuseManualStart=yes: "may be requested by dependency only"), against
// systemd 252: the repairer's reset-failed before the refused request
// leaves the unit inactive, not failed, and ServiceNotRecovering must still
// name it failed (UnitFailed) at its next run, not wait for
// RepairNotHelping's three repairs in a row; a daemon restarted since (its
// repairer read back from the state file) too. Once the unit runs again
// (a new invocation), it is no longer failed.
func TestRefusedRestartOfAFailedUnitStaysFailed(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const kl, node = "hide-kubelet.service", "hide-node.target"
	if err := s.AddUnit(ctx, kl, "[Unit]\nDefaultDependencies=no\nRefuseManualStart=yes\n[Service]\nExecStart=/bin/false\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, node, "[Unit]\nDefaultDependencies=no\nWants="+kl+"\n"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, node)
	if err := s.StartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	failed := waitUnit(t, s, kl, "the kubelet stand-in failed", func(u systemd.Unit) bool { return u.ActiveState == "failed" && u.Job == 0 })
	stateDir := t.TempDir()
	daemon := func() (*checks.Env, *report.Store, checks.Check) {
		env, store := sdEnvFromState(t, s, stateDir, kl)
		env.Repair.KeepIn(store)
		c, err := checks.NewForTest("ServiceNotRecovering", env)
		if err != nil {
			t.Fatal(err)
		}
		return env, store, c
	}
	env, store, c := daemon()
	want := kl + " is failed (exit-code)"
	if r := snrProbe(t, c); r.Reason != report.ReasonUnitFailed || !strings.HasPrefix(r.Message, want) {
		t.Fatalf("before the repair: %s %q, want %s %q", r.Reason, r.Message, report.ReasonUnitFailed, want)
	}
	if res, msg := env.Repair.Repair(ctx, kl, time.Millisecond, "healthz failed"); res != checks.RepairRestarted {
		t.Fatalf("the repair: %s %q, want %s (requested)", res, msg, checks.RepairRestarted)
	}
	env.Repair.Wait()
	if st := env.Repair.Status(kl); !strings.Contains(st.LastResult, systemd.ErrJobRefused.Error()) {
		t.Fatalf("the restart's result: %q, want systemd's refusal", st.LastResult)
	}
	u := waitUnit(t, s, kl, "the unit", func(systemd.Unit) bool { return true })
	t.Logf("the unit after the refused restart: %s/%s result %s, invocation %s (before %s)", u.ActiveState, u.SubState, u.Result, u.Invocation, failed.Invocation)
	r := snrProbe(t, c)
	if r.Status != report.StatusTrue || r.Reason != report.ReasonUnitFailed || !strings.HasPrefix(r.Message, want) {
		t.Errorf("after the refused restart: %s %s %q, want True %s %q...", r.Status, r.Reason, r.Message, report.ReasonUnitFailed, want)
	}
	if err := store.Save(stateDir, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, _, c2 := daemon()
	if r2 := snrProbe(t, c2); r2.Reason != report.ReasonUnitFailed || r2.Message != r.Message {
		t.Errorf("a daemon restarted since: %s %q, want %s %q", r2.Reason, r2.Message, report.ReasonUnitFailed, r.Message)
	}
	// Started by a dependency again, it runs (and fails) at a new
	// invocation: failed as systemd says, in its own words.
	if err := s.RestartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, kl, "the unit failed again, at a new invocation", func(u systemd.Unit) bool {
		return u.ActiveState == "failed" && u.Job == 0 && u.Invocation != failed.Invocation
	})
	if r := snrProbe(t, c); r.Reason != report.ReasonUnitFailed || r.Message != want {
		t.Errorf("failed again at a new invocation: %s %q, want %s %q", r.Reason, r.Message, report.ReasonUnitFailed, want)
	}
}
