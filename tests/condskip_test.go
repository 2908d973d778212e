//go:build integration

package tests

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// A kubelet stand-in whose ConditionPathExists= is no longer met (its
// binary gone after a botched upgrade), against systemd 252: the
// repairer's restart is a job that ends "done" though systemd skipped the
// start (the stop half stopped the unit, which stays inactive/dead at the
// invocation it had, ConditionResult no, the condition's state -1 in
// Conditions). The repairer must say so: the restart's result "skipped"
// naming the condition, a warning, counted failed; the message of the
// probes after it names the condition, the same at each; the unit stays
// its own, restarted again only at the cooldown, and started once the file
// is back; ServiceNotRecovering names it RepairNotHelping at the third
// restart in a row. Before, the restart was logged and kept as one that
// worked ("done"), and the next probe took the unit for one someone stopped
// (unit-stopped): never restarted again, ServiceNotRecovering False. An
// Assert…= not met fails the job instead (result "assert"): its words are
// in the restart's result.
func TestRepairOfAUnitWhoseConditionIsNotMet(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const kl, asrt, node = "condskip-kubelet.service", "condskip-assert.service", "condskip-node.target"
	const flag = "/run/condskip-kubelet"
	if err := os.WriteFile(s.Root(flag), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(s.Root(flag)) })
	unit := func(check string) string {
		return "[Unit]\nDefaultDependencies=no\n" + check + "=" + flag + "\n[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=100ms\n"
	}
	if err := s.AddUnit(ctx, kl, unit("ConditionPathExists")); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, asrt, unit("AssertPathExists")); err != nil {
		t.Fatal(err)
	}
	// Wanted by a target, as kubelet.service is by multi-user.target: a
	// unit nothing refers to is unloaded once inactive, and its
	// ResetFailedUnit then fails ("not loaded").
	if err := s.AddUnit(ctx, node, "[Unit]\nDefaultDependencies=no\nWants="+kl+" "+asrt+"\n"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, asrt)
	defer s.StopUnit(ctx, kl)
	defer s.StopUnit(ctx, node)
	if err := s.StartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	before := waitUnit(t, s, kl, "the kubelet stand-in up", active)
	waitUnit(t, s, asrt, "the assert stand-in up", active)

	var logs lockedBuf
	reg := prometheus.NewRegistry()
	env, _ := sdEnv(t, s, func(c *config.Config) { c.Checks.ServiceNotRecovering.WorkerUnits = []string{kl} })
	r := checks.NewRepairer(s.Bus, slog.New(slog.NewTextHandler(&logs, nil)), time.Now, reg)
	env.Repair = r
	snr, err := checks.NewForTest("ServiceNotRecovering", env)
	if err != nil {
		t.Fatal(err)
	}
	const cooldown = 2 * time.Second
	os.Remove(s.Root(flag))
	time.Sleep(time.Until(before.MainStart.Add(cooldown))) // the cooldown counts from the unit's start

	want := "skipped: ConditionPathExists=" + flag + " not met"
	skipMsg := "systemd skipped the start of " + kl + ": ConditionPathExists=" + flag + " not met; restarting it at most once per " + cooldown.String()
	for i := range 3 {
		if res, msg := r.Repair(ctx, kl, cooldown, "healthz failed"); res != checks.RepairRestarted {
			t.Fatalf("restart %d: %s %q, want %s (a unit whose start systemd skipped is the repairer's)", i+1, res, msg, checks.RepairRestarted)
		}
		r.Wait()
		if st := r.Status(kl); st.LastResult != want {
			t.Errorf("restart %d: result %q, want %q", i+1, st.LastResult, want)
		}
		u := waitUnit(t, s, kl, "the unit", func(systemd.Unit) bool { return true })
		if i == 0 {
			props, _ := s.Properties(ctx, kl, "Unit")
			t.Logf("after the skipped restart: %s/%s result %s, invocation %s (before %s), ConditionResult %v, ConditionTimestampMonotonic %v, Conditions %v",
				u.ActiveState, u.SubState, u.Result, u.Invocation, before.Invocation, props["ConditionResult"], props["ConditionTimestampMonotonic"], props["Conditions"])
		}
		if u.ActiveState != "inactive" || u.Invocation != before.Invocation || u.Skipped != "ConditionPathExists="+flag {
			t.Errorf("restart %d: the unit %s/%s at %s (before %s), skipped for %q", i+1, u.ActiveState, u.SubState, u.Invocation, before.Invocation, u.Skipped)
		}
		// Within the cooldown: not restarted, the condition named.
		if res, msg := r.Repair(ctx, kl, cooldown, "healthz failed"); res != checks.RepairCooldown || msg != skipMsg {
			t.Errorf("a probe within the cooldown after restart %d: %s %q, want %s %q", i+1, res, msg, checks.RepairCooldown, skipMsg)
		}
		// The cooldown counts from the repairer's request, made after its
		// read of the unit.
		time.Sleep(time.Until(r.Status(kl).LastRepair.Add(cooldown)))
	}
	if got := repairsCounted(t, reg, kl, checks.RepairFailed); got != 3 {
		t.Errorf("repairs_total{result=failed}: %v, want 3", got)
	}
	if got := repairsCounted(t, reg, kl, checks.RepairRestarted); got != 3 {
		t.Errorf("repairs_total{result=restarted}: %v, want 3 (systemd took each job)", got)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="repair: systemd skipped the start of the unit`); n != 3 || strings.Contains(logs.String(), "repair: restarted unit") {
		t.Errorf("log: %d skip warnings, want 3, and no restart:\n%s", n, logs.String())
	}
	res := snrProbe(t, snr)
	wantSNR := kl + " was repaired 3+ times in a row and is still unhealthy (systemd skipped the start of " + kl + ": ConditionPathExists=" + flag + " not met)"
	if res.Status != report.StatusTrue || res.Reason != report.ReasonRepairNotHelping || res.Message != wantSNR {
		t.Errorf("ServiceNotRecovering: %s %s %q, want True %s %q", res.Status, res.Reason, res.Message, report.ReasonRepairNotHelping, wantSNR)
	}

	// The file back, the next restart starts it.
	if err := os.WriteFile(s.Root(flag), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if res, msg := r.Repair(ctx, kl, cooldown, "healthz failed"); res != checks.RepairRestarted {
		t.Fatalf("the condition met again: %s %q, want %s", res, msg, checks.RepairRestarted)
	}
	r.Wait()
	if st := r.Status(kl); st.LastResult != "done" {
		t.Errorf("the condition met again: result %q, want done", st.LastResult)
	}
	waitUnit(t, s, kl, "the unit started at a new invocation", func(u systemd.Unit) bool { return active(u) && u.Invocation != before.Invocation })

	// An Assert…= not met fails the job, result "assert", named.
	os.Remove(s.Root(flag))
	abefore := waitUnit(t, s, asrt, "the assert stand-in up", active)
	time.Sleep(time.Until(abefore.MainStart.Add(cooldown)))
	if res, msg := r.Repair(ctx, asrt, cooldown, "healthz failed"); res != checks.RepairRestarted {
		t.Fatalf("the assert stand-in: %s %q", res, msg)
	}
	r.Wait()
	wantA := `failed: restart ` + asrt + `: ` + asrt + `: job result "assert": systemd job did not succeed: AssertPathExists=` + flag + ` failed`
	if st := r.Status(asrt); st.LastResult != wantA {
		t.Errorf("the assert stand-in's result %q, want %q", st.LastResult, wantA)
	}
	if _, msg := r.Repair(ctx, asrt, cooldown, "healthz failed"); msg != "systemd did not start "+asrt+": AssertPathExists="+flag+" failed; restarting it at most once per "+cooldown.String() {
		t.Errorf("the assert stand-in's message within the cooldown: %q", msg)
	}
}
