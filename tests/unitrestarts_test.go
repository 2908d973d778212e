//go:build integration

package tests

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// unitRestartsMetric reads syself_node_unit_restarts{unit} (a counter) from
// reg; -1 when there is no such series.
func unitRestartsMetric(t *testing.T, reg *prometheus.Registry, unit string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "syself_node_unit_restarts" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "unit" && l.GetValue() == unit {
					if m.GetCounter() == nil {
						t.Fatalf("syself_node_unit_restarts is a %s, not a counter", mf.GetType())
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// TestUnitRestartsOverRealSystemd: systemd's automatic restarts (a killed
// main process, Restart=always), a manual RestartUnit over D-Bus and the
// daemon's own repair are each counted once in syself_node_unit_restarts;
// three automatic restarts between two runs make ServiceNotRecovering True
// (UnitFlapping); and the baseline is kept in the state file, so a daemon
// restarted within the boot sees the restarts that happened while it was
// down.
func TestUnitRestartsOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const unit = "unitrestarts-flappy.service"
	if err := s.AddUnit(ctx, unit, "[Unit]\nDescription=stand-in critical unit that crashes\nDefaultDependencies=no\nStartLimitIntervalSec=0\n\n[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=100ms\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, unit)
	stateDir := t.TempDir()
	// daemon builds what internal/daemon builds for the checks: a store
	// loaded from the state directory, a unit watch kept in it, fed by the
	// repairer too.
	daemon := func(load bool) (*checks.Env, *report.Store, *prometheus.Registry) {
		env, store := sdEnv(t, s, func(c *config.Config) {
			c.StateDir = stateDir
			c.Checks.ServiceNotRecovering.WorkerUnits = []string{unit}
		})
		if load {
			if _, err := store.Load(stateDir); err != nil {
				t.Fatal(err)
			}
		}
		reg := prometheus.NewRegistry()
		env.Units = checks.NewUnitWatch(store, reg)
		env.Repair.SetUnitWatch(env.Units)
		return env, store, reg
	}

	env, store, reg := daemon(true)
	c, err := checks.NewForTest("ServiceNotRecovering", env)
	if err != nil {
		t.Fatal(err)
	}
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Fatalf("baseline: %+v", r)
	}
	if got := unitRestartsMetric(t, reg, unit); got != 0 {
		t.Fatalf("counter after the first read: %v", got)
	}
	for range 3 {
		kill(t, s, unit)
	}
	r := snrProbe(t, c)
	if r.Status != report.StatusTrue || r.Reason != "UnitFlapping" || r.Message != unit+" restarted 3 times since the last check" {
		t.Errorf("after 3 crashes: %+v", r)
	}
	// A manual restart (ResetFailedUnit, RestartUnit over D-Bus): systemd
	// resets NRestarts to 0; the new invocation is one restart.
	if err := s.Bus.Restart(ctx, unit); err != nil {
		t.Fatal(err)
	}
	if u := waitUnit(t, s, unit, "up after RestartUnit", active); u.NRestarts != 0 {
		t.Errorf("NRestarts after RestartUnit: %d (systemd should reset it)", u.NRestarts)
	}
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Errorf("after a manual restart: %+v", r)
	}
	if got := unitRestartsMetric(t, reg, unit); got != 4 {
		t.Errorf("syself_node_unit_restarts after 3 crashes and 1 RestartUnit: %v, want 4", got)
	}
	// The daemon's own repair: read before and after by the repairer, read
	// again by the check; counted once.
	before := waitUnit(t, s, unit, "up", active)
	if res, msg := env.Repair.Repair(ctx, unit, 0, "test"); res != checks.RepairRestarted {
		t.Fatalf("repair: %s %s", res, msg)
	}
	env.Repair.Wait()
	waitUnit(t, s, unit, "a new invocation after the repair", func(u systemd.Unit) bool { return active(u) && u.Invocation != before.Invocation })
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Errorf("after our repair: %+v", r)
	}
	if auto, manual := env.Units.Restarts(unit); auto != 3 || manual != 2 || unitRestartsMetric(t, reg, unit) != 5 {
		t.Errorf("after our repair: %d automatic, %d manual, counter %v; want 3, 2, 5", auto, manual, unitRestartsMetric(t, reg, unit))
	}
	// The daemon stops: the state is saved.
	if err := store.Save(stateDir, time.Now()); err != nil {
		t.Fatal(err)
	}

	// While it is down, the unit crashes 3 times.
	for range 3 {
		kill(t, s, unit)
	}
	// A daemon that lost its state would take the present as its baseline.
	fresh, _, _ := daemon(false)
	fc, _ := checks.NewForTest("ServiceNotRecovering", fresh)
	if r := snrProbe(t, fc); r.Status != report.StatusFalse {
		t.Errorf("without the saved baseline: %+v", r)
	}
	// The restarted daemon, from the saved state: its first run sees them.
	env2, store2, reg2 := daemon(true)
	stop := runChecks(t, env2, store2, "ServiceNotRecovering")
	defer stop()
	waitFor(t, store2, nil, 15*time.Second, "ServiceNotRecovering=True after the daemon restart", condIs(store2, "ServiceNotRecovering", report.StatusTrue))
	if cond, _ := store2.Get("ServiceNotRecovering"); cond.Reason != "UnitFlapping" || cond.Message != unit+" restarted 3 times since the last check" {
		t.Errorf("after the daemon restart: %+v", cond)
	}
	if got := unitRestartsMetric(t, reg2, unit); got != 8 {
		t.Errorf("counter after the daemon restart: %v, want 5 before + 3 while down", got)
	}
}
