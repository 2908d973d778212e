//go:build integration

package tests

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
)

// waitFile waits for a file a unit writes once it is ready.
func waitFile(t *testing.T, p, what string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; {
		if _, err := os.Stat(p); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: no %s", what, p)
		}
		time.Sleep(20 * time.Millisecond) // polling a file the unit writes
	}
}

// An operator's `systemctl stop` that ends the unit failed before any
// probe saw its stop job: a service that exits non-zero on SIGTERM (result
// exit-code, at once), or one killed at a TimeoutStopSec shorter than the
// probe interval (result timeout). systemd does not restart a stopped unit,
// whatever its Restart=; the repairer must not either, though no read of
// it saw the stop (43e5da1 relied on that). Before, the next failed probe
// restarted it: the daemon fought the operator. A unit that crashed on its
// own (killed, Restart=no) and sits failed is still restarted.
func TestRepairLeavesAStopNoProbeSawAlone(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	units := map[string]string{
		// exits 1 on SIGTERM: the stop ends failed at once.
		"stopexit.service": "ExecStart=/bin/sh -c 'trap \"exit 1\" TERM; touch /run/stopexit-ready; while :; do sleep 0.2; done'\nRestart=always\nRestartSec=100ms\n",
		// ignores SIGTERM: killed at its TimeoutStopSec, 1 s (< 10 s).
		"stoptimeout.service": "ExecStart=/bin/sh -c 'trap \"\" TERM; touch /run/stoptimeout-ready; while :; do sleep 0.2; done'\nTimeoutStopSec=1\nRestart=always\nRestartSec=100ms\n",
	}
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	for unit, svc := range units {
		ready := "/run/" + strings.TrimSuffix(unit, ".service") + "-ready"
		if err := s.AddUnit(ctx, unit, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStartPre=/bin/rm -f "+ready+"\n"+svc); err != nil {
			t.Fatal(err)
		}
		if err := s.StartUnit(ctx, unit); err != nil {
			t.Fatal(err)
		}
		defer s.StopUnit(ctx, unit)
		waitUnit(t, s, unit, "up", active)
		waitFile(t, s.Root(ready), unit+"'s trap")
		// A read of the unit while it runs (a probe that failed earlier,
		// ServiceNotRecovering's minute): the repairer knows it.
		r.Repair(ctx, unit, time.Hour, "probe failed")
		if err := s.StopUnit(ctx, unit); err != nil {
			t.Fatal(err)
		}
		u := waitUnit(t, s, unit, "the operator's stop ended", func(u systemd.Unit) bool { return u.Job == 0 && u.ActiveState == "failed" })
		res, msg := r.Repair(ctx, unit, 0, "probe failed")
		r.Wait()
		if res != checks.RepairStopped || !strings.Contains(msg, "was stopped") {
			t.Errorf("repair of %s, stopped by the operator, ended failed (result %s): %s %q, want %s", unit, u.Result, res, msg, checks.RepairStopped)
		}
		if after, err := s.Bus.Unit(ctx, unit); err != nil || after.Invocation != u.Invocation || after.ActiveState != "failed" {
			t.Errorf("%s after the repair: %+v, %v; want it left failed at %s", unit, after, err, u.Invocation)
		}
	}
	// A crash (killed, Restart=no) is no stop: restarted.
	const crash = "crashes.service"
	if err := s.AddUnit(ctx, crash, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, crash); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, crash)
	waitUnit(t, s, crash, "up", active)
	if err := s.KillMain(ctx, crash, int32(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	u := waitUnit(t, s, crash, "failed", func(u systemd.Unit) bool { return u.ActiveState == "failed" })
	if res, msg := r.Repair(ctx, crash, 0, "probe failed"); res != checks.RepairRestarted {
		t.Errorf("repair of a unit that crashed (failed, result %s): %s %q, want %s", u.Result, res, msg, checks.RepairRestarted)
	}
	r.Wait()
	waitUnit(t, s, crash, "restarted", func(n systemd.Unit) bool { return active(n) && n.Invocation != u.Invocation })
}

// A Type=notify service (containerd) that ends a run on its own: it tells
// systemd STOPPING=1 (containerd does on a signal it was sent, then shuts
// down), which takes the unit out of the active state before its process
// exits, as a stop's SIGTERM does, and then exits 1. With no stop job:
// systemd restarts it (Restart=always) until its start limit, and leaves
// it failed, result exit-code (systemd 252 keeps the last run's result, not
// start-limit-hit). It is down for good unless someone restarts it: the
// repairer must. Before, its timestamps read as an operator's stop that
// ended failed, and it was left down ("was stopped"): the node NotReady.
func TestRepairRestartsAServiceThatStoppedItselfAndFailed(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const unit = "selfstop.service"
	flag := "/run/selfstop-fails"
	if err := writeFile(s.Root(flag), nil); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(s.Root(flag))
	svc := "[Unit]\nDefaultDependencies=no\nStartLimitBurst=3\nStartLimitIntervalSec=60\n[Service]\nType=notify\nNotifyAccess=all\n" +
		"ExecStart=/bin/sh -c 'systemd-notify --ready; if test -e " + flag + "; then sleep 0.3; systemd-notify STOPPING=1; sleep 0.3; exit 1; fi; exec sleep infinity'\n" +
		"Restart=always\nRestartSec=100ms\n"
	if err := s.AddUnit(ctx, unit, svc); err != nil {
		t.Fatal(err)
	}
	s.StartUnit(ctx, unit) // it stops itself: the job may end either way
	defer s.StopUnit(ctx, unit)
	// Failed, and no more restarts to come: the restart its third run's
	// failure asked for (NRestarts 3) was refused at its start limit.
	u := waitUnit(t, s, unit, "its own stops ended failed at its start limit", func(u systemd.Unit) bool { return u.Job == 0 && u.ActiveState == "failed" && u.NRestarts >= 3 })
	if u.Result != "exit-code" || u.ActiveExitMono < u.MainStartMono || u.MainExitMono <= u.ActiveExitMono {
		t.Fatalf("%s is not as a stop that ended failed leaves a unit (result exit-code, left active before its process exited): %+v", unit, u)
	}
	if err := os.Remove(s.Root(flag)); err != nil {
		t.Fatal(err)
	}
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	res, msg := r.Repair(ctx, unit, 0, "probe failed")
	r.Wait()
	if res != checks.RepairRestarted {
		t.Fatalf("repair of %s, failed by its own STOPPING=1 and exit 1 (result %s, no stop job): %s %q, want %s", unit, u.Result, res, msg, checks.RepairRestarted)
	}
	waitUnit(t, s, unit, "restarted", func(n systemd.Unit) bool { return active(n) && n.Invocation != u.Invocation })
}

// A service whose RuntimeMaxSec= ran out: systemd takes it out of the
// active state (SIGTERM) before its process exits, as a stop does, and it
// ends failed, result timeout, with no stop job; systemd restarts it only
// if its Restart= says so (here no). It ended on its own, as a crash does:
// the repairer restarts it. Before, it was read as an operator's stop that
// ended failed and left down.
func TestRepairRestartsAServiceWhoseRuntimeMaxRanOut(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const unit = "runtimemax.service"
	if err := s.AddUnit(ctx, unit, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\nRuntimeMaxSec=1\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, unit)
	u := waitUnit(t, s, unit, "its RuntimeMaxSec ran out", func(u systemd.Unit) bool { return u.Job == 0 && u.ActiveState == "failed" })
	if u.Result != "timeout" || u.ActiveExitMono < u.MainStartMono || u.MainExitMono <= u.ActiveExitMono {
		t.Fatalf("%s is not as a stop killed at its timeout leaves a unit (result timeout, left active before its process exited): %+v", unit, u)
	}
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	res, msg := r.Repair(ctx, unit, 0, "probe failed")
	r.Wait()
	if res != checks.RepairRestarted {
		t.Fatalf("repair of %s, failed at its RuntimeMaxSec (no stop job): %s %q, want %s", unit, res, msg, checks.RepairRestarted)
	}
	waitUnit(t, s, unit, "restarted", func(n systemd.Unit) bool { return n.Invocation != u.Invocation && n.MainStartMono > u.MainExitMono })
}
