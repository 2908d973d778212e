//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
)

// A daemon SIGSTOPped (frozen: a debugger, a stuck cgroup freeze) sends no
// WATCHDOG=1: systemd's watchdog aborts it and Restart=always starts it
// again: systemd sends SIGCONT after the watchdog's SIGABRT, and the
// unit is active at a new invocation.
func TestWatchdogRestartsAStoppedDaemon(t *testing.T) {
	const unit = "autopilot-health.service"
	s := daemonNamespace(t, "wdstop", map[string]string{unit + ".d/50-watchdog.conf": watchdogDropIn}, fmt.Sprintf(goodConfig, freeTCPPort(t)), unit)
	ctx := context.Background()
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	up := waitUnitFor(t, s, unit, time.Minute, "active", active)
	stopped := time.Now()
	if err := s.KillMain(ctx, unit, int32(syscall.SIGSTOP)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "started again after the watchdog", func() (bool, string) {
		u, err := s.Bus.Unit(ctx, unit)
		if err != nil {
			return false, err.Error()
		}
		code, status := mainExit(ctx, s, unit)
		return active(u) && u.Invocation != up.Invocation,
			fmt.Sprintf("%s/%s result %s NRestarts=%d, last exit code %d status %d", u.ActiveState, u.SubState, u.Result, u.NRestarts, code, status)
	})
	t.Logf("restarted %s after SIGSTOP", time.Since(stopped))
}

// systemctl daemon-reload while the repairer's restart job runs (its stop,
// 2 s): systemd keeps the job and its subscriber across the reload, the
// JobRemoved comes, and the restart ends "done" with a new invocation.
func TestRepairAcrossDaemonReload(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	if err := s.AddUnit(ctx, "reload.service", "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\nExecStop=/bin/sleep 2\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "reload.service"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, "reload.service")
	before := waitUnit(t, s, "reload.service", "up", active)
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	if res, msg := r.Repair(ctx, "reload.service", 0, "probe failed"); res != checks.RepairRestarted {
		t.Fatalf("repair: %s %q", res, msg)
	}
	waitUnit(t, s, "reload.service", "its restart job stopping it", func(u systemd.Unit) bool { return u.JobType == "restart" && u.ActiveState == "deactivating" })
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { r.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the restart has not ended 20 s after the reload: %+v", r.Status("reload.service"))
	}
	if st := r.Status("reload.service"); st.LastResult != "done" {
		t.Errorf("restart across the reload: %+v, want done", st)
	}
	if u, err := s.Bus.Unit(ctx, "reload.service"); err != nil || !active(u) || u.Invocation == before.Invocation {
		t.Errorf("after the restart: %+v, %v; want a new invocation, running", u, err)
	}
}

// A daemon restarted (SIGKILL) right after its repair, before it saved the
// repair (a fresh repairer, nothing in its state): the cooldown still counts
// from the unit's last start, systemd's ExecMainStartTimestampMonotonic, and
// the unit is not restarted again at once.
func TestRepairCooldownForAFreshDaemon(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const u = "cool.service"
	if err := s.AddUnit(ctx, u, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, u); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, u)
	waitUnit(t, s, u, "up", active)
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	if res, msg := r.Repair(ctx, u, 0, "probe failed"); res != checks.RepairRestarted {
		t.Fatalf("repair: %s %q", res, msg)
	}
	r.Wait()
	r2 := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	if res, msg := r2.Repair(ctx, u, time.Minute, "probe failed"); res != checks.RepairCooldown {
		t.Errorf("fresh daemon's repair: %s %q, want cooldown", res, msg)
	}
	r2.Wait()
}

// kubelet masked, or its unit file removed, while it runs, then
// daemon-reload: not repaired (systemd would refuse the start), the message
// says why, and the running unit is left running.
func TestRepairOfAUnitMaskedOrRemovedWhileItRuns(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	for _, how := range []string{"mask", "remove"} {
		u := how + "-kl.service"
		if err := s.AddUnit(ctx, u, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
			t.Fatal(err)
		}
		if err := s.StartUnit(ctx, u); err != nil {
			t.Fatal(err)
		}
		defer s.StopUnit(ctx, u)
		waitUnit(t, s, u, "up", active)
		p := s.Root("/etc/systemd/system/" + u)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if how == "mask" {
			if err := os.Symlink("/dev/null", p); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
		res, msg := r.Repair(ctx, u, 0, "probe failed")
		r.Wait()
		want := map[string]string{"mask": "is masked", "remove": "is not installed"}[how]
		if res != checks.RepairNotLoaded || !strings.Contains(msg, want) {
			t.Errorf("%s: repair %s %q, want %s, %q", how, res, msg, checks.RepairNotLoaded, want)
		}
		if u, err := s.Bus.Unit(ctx, u); err != nil || !active(u) {
			t.Errorf("%s: the running unit after the repair: %+v, %v; want it left running", how, u, err)
		}
	}
}
