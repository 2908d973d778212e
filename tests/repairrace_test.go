//go:build integration

package tests

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
)

// racingStop is the daemon's Manager, with an operator's stop of a unit
// queued right before each restart request: `systemctl stop` typed between
// the repairer's read of the unit (active, no job) and its RestartUnit.
type racingStop struct {
	*systemd.DBus
	once   *sync.Once
	before func()
}

func (m racingStop) Restart(ctx context.Context, name string) error {
	m.once.Do(m.before)
	return m.DBus.Restart(ctx, name)
}

// An operator's `systemctl stop kubelet` queued (kubelet's stop waits for a
// unit ordered after it to stop first) when the repairer's restart request
// reaches systemd, read by the repairer before that stop was queued: the
// restart does not replace (cancel) the operator's stop, and kubelet ends
// stopped, not started again.
func TestRepairDoesNotCancelAnOperatorsQueuedStop(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const kl, blk, node = "race-kubelet.service", "race-after.service", "race-node.target"
	if err := s.AddUnit(ctx, kl, "[Unit]\nDefaultDependencies=no\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=100ms\n"); err != nil {
		t.Fatal(err)
	}
	// Ordered after kubelet, it stops first, in 2 s: kubelet's stop job
	// waits for it.
	if err := s.AddUnit(ctx, blk, "[Unit]\nDefaultDependencies=no\nAfter="+kl+"\n[Service]\nExecStart=/bin/sleep infinity\nExecStop=/bin/sleep 2\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, node, "[Unit]\nDefaultDependencies=no\nWants="+kl+" "+blk+"\n"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, node)
	defer s.StopUnit(ctx, blk)
	defer s.StopUnit(ctx, kl)
	if err := s.StartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{kl, blk} {
		if err := s.StartUnit(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	waitUnit(t, s, kl, "kubelet up", active)
	before, err := s.Bus.Unit(ctx, kl)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 2)
	m := racingStop{DBus: s.Bus, once: new(sync.Once), before: func() {
		go func() { stopped <- s.StopUnit(ctx, blk) }()
		waitUnit(t, s, blk, "the unit after kubelet stopping", func(u systemd.Unit) bool { return u.ActiveState == "deactivating" })
		go func() { stopped <- s.StopUnit(ctx, kl) }()
		waitUnit(t, s, kl, "the operator's stop of kubelet queued", func(u systemd.Unit) bool { return u.Job != 0 && u.JobType == "stop" })
	}}
	r := checks.NewRepairer(m, quiet(), time.Now, nil)
	res, msg := r.Repair(ctx, kl, time.Millisecond, "healthz failed")
	r.Wait()
	if res != checks.RepairRestarted {
		t.Fatalf("the repair: %s %q, want %s (requested)", res, msg, checks.RepairRestarted)
	}
	if st := r.Status(kl); !strings.Contains(st.LastResult, systemd.ErrJobRefused.Error()) {
		t.Errorf("the restart's result: %q, want systemd's refusal (%v)", st.LastResult, systemd.ErrJobRefused)
	}
	for range 2 {
		if err := <-stopped; err != nil {
			t.Errorf("the operator's stop: %v", err)
		}
	}
	u := waitUnit(t, s, kl, "kubelet settled", func(u systemd.Unit) bool { return u.Job == 0 && (active(u) || u.ActiveState == "inactive") })
	if u.ActiveState != "inactive" || u.Invocation != before.Invocation {
		t.Errorf("kubelet after the operator's stop raced the repairer's restart: %s/%s at invocation %s (before: %s), want stopped", u.ActiveState, u.SubState, u.Invocation, before.Invocation)
	}
	// Probed again: left stopped.
	if res, msg := r.Repair(ctx, kl, time.Millisecond, "healthz failed"); res != checks.RepairStopped {
		t.Errorf("the next probe: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	r.Wait()
}

// systemd 252 refuses kubelet's restart in mode "fail" when containerd,
// which kubelet requires, is masked: a refusal (ErrJobRefused) that is no
// one's queued stop (not systemd.StopQueued), so the repairer keeps a
// kubelet its own failed restart left inactive, to retry at the cooldown.
func TestRestartRefusedForAMaskedDependencyIsNoStop(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const kl, ctd, node = "mask-kubelet.service", "mask-containerd.service", "mask-node.target"
	if err := s.AddUnit(ctx, ctd, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, kl, "[Unit]\nDefaultDependencies=no\nRequires="+ctd+"\nAfter="+ctd+"\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, node, "[Unit]\nDefaultDependencies=no\nWants="+kl+"\n"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, node)
	defer s.StopUnit(ctx, kl)
	defer s.StopUnit(ctx, ctd)
	if err := s.StartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, kl, "kubelet up", active)
	if err := s.StopUnit(ctx, ctd); err != nil { // stops kubelet too
		t.Fatal(err)
	}
	p := s.Root("/etc/systemd/system/" + ctd)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", p); err != nil {
		t.Fatal(err)
	}
	defer s.Reload(ctx)
	defer os.Remove(p)
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	err := s.Bus.Restart(ctx, kl)
	if !errors.Is(err, systemd.ErrJobRefused) || systemd.StopQueued(err) {
		t.Errorf("kubelet's restart with containerd masked: %v; want refused (%v), and not for a stop queued", err, systemd.ErrJobRefused)
	}
	if u := waitUnit(t, s, kl, "kubelet", func(systemd.Unit) bool { return true }); u.ActiveState != "inactive" || u.Job != 0 {
		t.Errorf("kubelet after the refused restart: %s/%s job %d, want inactive: no job made", u.ActiveState, u.SubState, u.Job)
	}
}
