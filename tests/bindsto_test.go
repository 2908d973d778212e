//go:build integration

package tests

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// kubelet with BindsTo=containerd.service (and After=), as Bottlerocket's
// kubelet.service has it: when containerd crashes, systemd stops kubelet
// (cleanly: inactive/dead, result success, no job), and when containerd's
// Restart= brings it back, nothing starts kubelet again (BindsTo= starts
// nothing; with PartOf=, Requires= or Requisite= instead, kubelet runs on or
// is restarted: systemd 252). That stop is systemd's, not an operator's: the
// repairer starts kubelet again at its next failed probe. Before, it read
// kubelet inactive as stopped on purpose ("not restarted: ... is stopped"),
// and the node stayed NotReady until someone started kubelet. An operator's
// stops stay theirs: kubelet stopped by hand (also when containerd crashes
// and comes back after that), and kubelet stopped with containerd by hand
// (systemd stops kubelet first, it is ordered after containerd) and
// containerd started again by hand (also once containerd crashed after
// those stops, once or twice). Also when containerd crashed twice before a
// probe read kubelet (systemd keeps the times of its last stop only, and
// kubelet stopped at the first): told by containerd's NRestarts as the
// daemon read it while kubelet ran, kept at kubelet's last passing probe;
// before, kubelet stayed stopped.
func TestRepairStartsAUnitStoppedBecauseItsBindsToCrashed(t *testing.T) {
	s := realSystemd(t)
	// The runtime comes back 1 s after a crash.
	f := newBoundKubelet(t, s, "bound", 1)
	ctx, rt, kl := f.ctx, f.rt, f.kl
	seenHealthy, repair, up := f.seenHealthy, f.repair, f.up
	crash := func() { t.Helper(); f.back(f.kill()) }

	// The runtime crashes and comes back: kubelet, stopped by systemd, is
	// started again.
	crash()
	u := waitUnit(t, s, kl, "kubelet stopped by its BindsTo=", stopped)
	t.Logf("%s after %s crashed and came back: %s/%s, result %s", kl, rt, u.ActiveState, u.SubState, u.Result)
	if res, msg := repair(); res != checks.RepairRestarted {
		t.Errorf("kubelet stopped by systemd because %s, which it BindsTo=, crashed: %s %q, want %s", rt, res, msg, checks.RepairRestarted)
	}
	waitUnit(t, s, kl, "kubelet started again by the repair", active)

	// The runtime crashes twice between two probes (a crash loop that
	// settles): systemd keeps the times of its last stop only, which
	// came after kubelet's (stopped at the first). The daemon saw kubelet
	// healthy at its last probe, with the runtime's NRestarts then: the
	// runtime went down twice since, by its Restart=, and kubelet left
	// active no later than its last stop. Before, kubelet stayed stopped.
	seenHealthy()
	crash()
	crash()
	u = waitUnit(t, s, kl, "kubelet stopped by its BindsTo=", stopped)
	b, err := s.Bus.Unit(ctx, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s after %s crashed twice: %s/%s, left active at %s; %s last left active at %s, NRestarts %d", kl, rt, u.ActiveState, u.SubState, u.ActiveExitMono, rt, b.ActiveExitMono, b.NRestarts)
	if res, msg := repair(); res != checks.RepairRestarted {
		t.Errorf("kubelet stopped by systemd because %s, which it BindsTo=, crashed twice before a probe: %s %q, want %s", rt, res, msg, checks.RepairRestarted)
	}
	waitUnit(t, s, kl, "kubelet started again by the repair", active)

	// An operator stops kubelet: left stopped, also once the runtime
	// crashes and comes back after that, once or twice (a probe read
	// kubelet stopped while the runtime ran: the stop is theirs, whatever
	// the runtime does after).
	seenHealthy()
	if err := s.StopUnit(ctx, kl); err != nil {
		t.Fatal(err)
	}
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped by hand: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	crash()
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped by hand, the runtime crashed since: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	crash()
	crash()
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped by hand, the runtime crashed three times since: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	up()

	// An operator stops the runtime (kubelet with it) and starts it again
	// by hand: kubelet's stop is theirs, also once the runtime crashes
	// twice after that.
	seenHealthy()
	if err := s.StopUnit(ctx, rt); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, kl, "kubelet stopped with the runtime", stopped)
	if err := s.StartUnit(ctx, rt); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, rt, "the runtime started by hand", active)
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped with its runtime by hand, the runtime started again by hand: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	crash()
	crash()
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped with its runtime by hand, the runtime started again by hand and crashed twice: %s %q, want %s", res, msg, checks.RepairStopped)
	}
}

// An operator's stop of kubelet that a probe read while containerd was
// down stays theirs, whatever containerd does after: kubelet stopped by
// hand, then containerd crashed and the probe came while containerd waited
// for its Restart= (RestartSec=5 in containerd's own unit); and containerd
// stopped by hand (kubelet with it, first) for maintenance, read so, then
// started by hand. In both, containerd crashes twice more and runs; before,
// kubelet was then started against the operator's stop (its NRestarts two
// above the daemon's read during kubelet's run). The stops of a runtime
// down since kubelet's stop all came after kubelet's where its Restart=
// has not brought it back since that read (systemd 252's timestamps and
// NRestarts, read here).
func TestRepairLeavesAUnitStoppedByHandReadWhileItsBindsToWasDown(t *testing.T) {
	s := realSystemd(t)
	// RestartSec long enough that a probe reads the runtime waiting for
	// its Restart= (auto-restart), as one does with containerd's 5 s.
	f := newBoundKubelet(t, s, "bound2", 2)
	ctx, rt, kl := f.ctx, f.rt, f.kl
	seenHealthy, repair, up, read, kill, back := f.seenHealthy, f.repair, f.up, f.read, f.kill, f.back

	// kubelet stopped by hand; the runtime crashes, and a probe reads
	// kubelet stopped while the runtime waits for its Restart=.
	seenHealthy()
	if err := s.StopUnit(ctx, kl); err != nil {
		t.Fatal(err)
	}
	before := kill()
	b := waitUnit(t, s, rt, "the runtime waiting for its Restart=", func(u systemd.Unit) bool { return u.SubState == "auto-restart" })
	u := read(kl)
	t.Logf("%s stopped by hand, left active at %s; %s crashed since: %s/%s, left active at %s, NRestarts %d", kl, u.ActiveExitMono, rt, b.ActiveState, b.SubState, b.ActiveExitMono, b.NRestarts)
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped by hand, the runtime down since: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	back(before)
	back(kill())
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped by hand, read so while the runtime waited for its Restart=, the runtime crashed twice in all: %s %q, want %s", res, msg, checks.RepairStopped)
	}

	// The runtime stopped by hand (kubelet with it), read so, started by
	// hand: its NRestarts is 0 again, as at the daemon's read after a
	// start by hand.
	for _, op := range []func(context.Context, string) error{s.StopUnit, s.StartUnit} {
		if err := op(ctx, rt); err != nil {
			t.Fatal(err)
		}
	}
	up()
	seenHealthy()
	if err := s.StopUnit(ctx, rt); err != nil {
		t.Fatal(err)
	}
	u = waitUnit(t, s, kl, "kubelet stopped with the runtime", stopped)
	b = read(rt)
	t.Logf("%s and %s stopped by hand: %s left active at %s, %s at %s (NRestarts %d)", rt, kl, kl, u.ActiveExitMono, rt, b.ActiveExitMono, b.NRestarts)
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped with its runtime by hand: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	if err := s.StartUnit(ctx, rt); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, rt, "the runtime started by hand", active)
	back(kill())
	back(kill())
	if res, msg := repair(); res != checks.RepairStopped {
		t.Errorf("kubelet stopped with its runtime by hand, read so while both were stopped, the runtime started by hand and crashed twice: %s %q, want %s", res, msg, checks.RepairStopped)
	}
}

// boundKubelet is a runtime (PREFIX-runtime.service, Restart=always after
// restartSec seconds) and a kubelet (PREFIX-kubelet.service) with
// BindsTo= and After= the runtime, on real systemd, both running, with the
// daemon's repairer and its unit watch.
type boundKubelet struct {
	t      *testing.T
	s      *harness.Systemd
	ctx    context.Context
	rt, kl string
	r      *checks.Repairer
	w      *checks.UnitWatch
}

func newBoundKubelet(t *testing.T, s *harness.Systemd, prefix string, restartSec int) *boundKubelet {
	t.Helper()
	ctx := context.Background()
	f := &boundKubelet{t: t, s: s, ctx: ctx, rt: prefix + "-runtime.service", kl: prefix + "-kubelet.service"}
	node := prefix + "-node.target"
	if err := s.AddUnit(ctx, f.rt, fmt.Sprintf("[Unit]\nDefaultDependencies=no\nStartLimitIntervalSec=0\n[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=%d\n", restartSec)); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, f.kl, "[Unit]\nDefaultDependencies=no\nStartLimitIntervalSec=0\nBindsTo="+f.rt+"\nAfter="+f.rt+"\n[Service]\nExecStart=/bin/sleep infinity\nRestart=always\nRestartSec=100ms\n"); err != nil {
		t.Fatal(err)
	}
	// Wanted by a target that runs, as an enabled kubelet is by
	// multi-user.target: systemd keeps the unit (and its timestamps) once
	// it is inactive, where it unloads one nothing refers to.
	if err := s.AddUnit(ctx, node, "[Unit]\nDefaultDependencies=no\nWants="+f.kl+"\n"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.StopUnit(ctx, f.rt)
		s.StopUnit(ctx, f.kl)
		s.StopUnit(ctx, node)
	})
	if err := s.StartUnit(ctx, node); err != nil {
		t.Fatal(err)
	}
	f.up()
	f.r = checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	// The daemon's unit watch, fed what ServiceNotRecovering reads every
	// minute (kubelet and the runtime in one read), and the repairer told
	// of each kubelet probe that passed (Healthy).
	f.w = checks.NewUnitWatch(nil, nil)
	f.r.SetUnitWatch(f.w)
	return f
}

// up starts the runtime, then kubelet, and waits for kubelet to run.
func (f *boundKubelet) up() {
	f.t.Helper()
	for _, name := range []string{f.rt, f.kl} {
		if err := f.s.StartUnit(f.ctx, name); err != nil {
			f.t.Fatal(err)
		}
	}
	waitUnit(f.t, f.s, f.kl, "kubelet up", active)
}

// read is systemd's unit name now.
func (f *boundKubelet) read(name string) systemd.Unit {
	f.t.Helper()
	u, err := f.s.Bus.Unit(f.ctx, name)
	if err != nil {
		f.t.Fatal(err)
	}
	return u
}

// seenHealthy is the daemon's read of both units, running, then a kubelet
// probe that passed.
func (f *boundKubelet) seenHealthy() {
	f.t.Helper()
	for _, name := range []string{f.kl, f.rt} {
		u := f.read(name)
		if !active(u) {
			f.t.Fatalf("%s not active when the daemon saw the node healthy: %s/%s", name, u.ActiveState, u.SubState)
		}
		f.w.Observe(u)
	}
	f.r.Healthy(f.kl)
}

// repair is the repair of kubelet after a failed probe, waited for.
func (f *boundKubelet) repair() (string, string) {
	f.t.Helper()
	res, msg := f.r.Repair(f.ctx, f.kl, time.Millisecond, "healthz failed")
	f.r.Wait()
	return res, msg
}

// kill crashes the runtime (SIGKILL to its main process); it returns the
// unit as read before.
func (f *boundKubelet) kill() systemd.Unit {
	f.t.Helper()
	before := f.read(f.rt)
	if err := f.s.KillMain(f.ctx, f.rt, int32(syscall.SIGKILL)); err != nil {
		f.t.Fatal(err)
	}
	return before
}

// back waits for the runtime, read as before when kill crashed it, to be
// running again by its Restart=.
func (f *boundKubelet) back(before systemd.Unit) {
	f.t.Helper()
	waitUnit(f.t, f.s, f.rt, "the runtime back by its Restart=", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != before.Invocation && u.NRestarts > before.NRestarts
	})
}

// stopped: inactive, with no job queued.
func stopped(u systemd.Unit) bool { return u.ActiveState == "inactive" && u.Job == 0 }
