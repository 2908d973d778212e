//go:build integration

package tests

import (
	"context"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// ServiceNotRecovering against systemd 252, the cases no other test covers
// as one: a unit failed with Restart=no; a unit flapping (3 automatic
// restarts within a window); an operator's `systemctl restart` (plain
// RestartUnit, no reset-failed) between crashes, which resets NRestarts and
// is not taken for flapping; and a daemon SIGKILLed mid-window (restarted
// from the state file as last saved) over a failed unit: the condition
// stays True, its lastTransitionTime kept, no flap to False.
func TestServiceNotRecoveringCasesOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const flappy, once = "snrc-flappy.service", "snrc-once.service"
	if err := s.AddUnit(ctx, flappy, "[Unit]\nDefaultDependencies=no\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=100ms\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, once, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/false\nRestart=no\n"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, flappy)
	if err := s.StartUnit(ctx, flappy); err != nil {
		t.Fatal(err)
	}
	check := func(units ...string) checks.Check {
		env, _ := sdEnv(t, s, func(c *config.Config) { c.Checks.ServiceNotRecovering.WorkerUnits = units })
		c, err := checks.NewForTest("ServiceNotRecovering", env)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T) (checks.Result, report.Reason, string)
	}{
		{"failed with Restart=no", func(t *testing.T) (checks.Result, report.Reason, string) {
			c := check(once)
			s.StartUnit(ctx, once) // the job fails: the unit ends failed
			waitUnit(t, s, once, "failed", func(u systemd.Unit) bool { return u.ActiveState == "failed" && u.Job == 0 })
			return snrProbe(t, c), report.ReasonUnitFailed, once + " is failed (exit-code)"
		}},
		{"flapping", func(t *testing.T) (checks.Result, report.Reason, string) {
			c := check(flappy)
			snrProbe(t, c)
			for range 3 {
				kill(t, s, flappy)
			}
			return snrProbe(t, c), report.ReasonUnitFlapping, flappy + " restarted 3 times since the last check"
		}},
		{"an operator's systemctl restart between crashes", func(t *testing.T) (checks.Result, report.Reason, string) {
			c := check(flappy)
			snrProbe(t, c)
			kill(t, s, flappy)
			kill(t, s, flappy)
			if err := s.RestartUnit(ctx, flappy); err != nil {
				t.Fatal(err)
			}
			u := waitUnit(t, s, flappy, "up after systemctl restart", active)
			t.Logf("NRestarts after 2 crashes and a plain RestartUnit: %d", u.NRestarts)
			if u.NRestarts != 0 {
				t.Errorf("NRestarts after a plain RestartUnit: %d, want 0 (systemd resets it)", u.NRestarts)
			}
			kill(t, s, flappy)
			return snrProbe(t, c), report.ReasonCriticalUnitsRecovering, ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, reason, msg := tc.run(t)
			if r.Reason != reason || msg != "" && r.Message != msg {
				t.Errorf("%s %q, want %s %q", r.Reason, r.Message, reason, msg)
			}
		})
	}

	t.Run("daemon SIGKILLed mid-window over a failed unit", func(t *testing.T) {
		stateDir := t.TempDir()
		start := func() (*report.Store, func()) {
			env, store := sdEnvFromState(t, s, stateDir, once)
			env.Units = checks.NewUnitWatch(store, nil)
			return store, runChecks(t, env, store, "ServiceNotRecovering")
		}
		store, stop := start()
		waitFor(t, store, nil, 15*time.Second, "ServiceNotRecovering=True", condIs(store, "ServiceNotRecovering", report.StatusTrue))
		first, _ := store.Get("ServiceNotRecovering")
		// The persister's save within a second of the change; then the
		// kill: no clean stop, no later save.
		if err := store.Save(stateDir, time.Now()); err != nil {
			t.Fatal(err)
		}
		stop()
		store2, stop2 := start()
		defer stop2()
		c, ok := store2.Get("ServiceNotRecovering")
		if !ok || c.Status != report.StatusTrue || !c.LastTransitionTime.Equal(first.LastTransitionTime) {
			t.Fatalf("read back after the kill: %+v, want True since %v", c, first.LastTransitionTime)
		}
		// Its first run (spread 0): still True, the same transition time.
		waitFor(t, store2, nil, 15*time.Second, "the restarted daemon's first run", func() bool {
			c, _ := store2.Get("ServiceNotRecovering")
			return c.LastUpdateTime.After(first.LastUpdateTime)
		})
		c, _ = store2.Get("ServiceNotRecovering")
		if c.Status != report.StatusTrue || c.Reason != report.ReasonUnitFailed || !c.LastTransitionTime.Equal(first.LastTransitionTime) {
			t.Errorf("after the restarted daemon's first run: %s %s since %v, want True UnitFailed since %v", c.Status, c.Reason, c.LastTransitionTime, first.LastTransitionTime)
		}
	})
}
