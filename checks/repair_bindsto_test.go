package checks

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
)

// bindsToManager answers BindsTo with bound, or err.
type bindsToManager struct {
	*fakeManager
	err   error
	bound []systemd.Bound
}

func (m *bindsToManager) BindsTo(context.Context, string) ([]systemd.Bound, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	return m.bound, nil
}

func (m *bindsToManager) setBound(b ...systemd.Bound) { m.mu.Lock(); m.bound = b; m.mu.Unlock() }

var _ systemd.BindsToReader = (*bindsToManager)(nil)

// A stopped kubelet is probed every 10 s; while systemd does not answer
// the read of the units it BindsTo=, the warning is logged once per
// change of the error, not at every probe (360 lines an hour).
func TestStoppedWithBoundReadFailureLoggedOncePerChange(t *testing.T) {
	var logs bytes.Buffer
	m := &bindsToManager{fakeManager: newFakeManager(), err: errors.New("dbus: NoReply")}
	r := NewRepairer(m, slog.New(slog.NewTextHandler(&logs, nil)), time.Now, nil)
	u := systemd.Unit{Name: "kubelet.service", ActiveState: "inactive", SubState: "dead"}
	count := func() int { return strings.Count(logs.String(), "reading the units a stopped unit BindsTo= failed") }
	for range 3 {
		if r.stoppedWithBound(t.Context(), u) {
			t.Fatal("a failed read taken for a stop with its bound unit")
		}
	}
	if n := count(); n != 1 {
		t.Errorf("the same failed read logged %d times over 3 probes, want once:\n%s", n, logs.String())
	}
	m.err = errors.New("dbus: connection closed")
	r.stoppedWithBound(t.Context(), u)
	if n := count(); n != 2 {
		t.Errorf("a new error logged %d times in all, want 2", n)
	}
	m.err = nil
	r.stoppedWithBound(t.Context(), u)
	m.err = errors.New("dbus: connection closed")
	r.stoppedWithBound(t.Context(), u)
	if n := count(); n != 3 {
		t.Errorf("the error again after a read that worked logged %d times in all, want 3", n)
	}
}

// containerd crashed twice between two kubelet probes: kubelet, bound to
// it, stopped at the first crash, and systemd keeps the times of the second
// only. The repairer starts kubelet again from what the daemon saw when
// kubelet was last healthy (containerd's NRestarts, read by the unit watch
// during kubelet's run); not a daemon restarted since (that is in memory
// only), and not once a probe read kubelet stopped while containerd ran
// (someone's stop: containerd's crashes after it are not why kubelet
// stopped). The same rule against systemd 252:
// TestRepairStartsAUnitStoppedBecauseItsBindsToCrashed in tests/.
func TestRepairStartsAUnitStoppedBecauseItsBindsToCrashedTwice(t *testing.T) {
	s := time.Second
	const rt = "containerd.service"
	// Down at 100 s (kubelet stopped 20 ms after), back at 101 s, down at
	// 102 s, back at 103 s.
	twice := systemd.Bound{Name: rt, ActiveState: "active", ActiveExitMono: 102 * s, ActiveEnterMono: 103 * s, NRestarts: 5}

	m, r := kubeletBoundToContainerd(t, 3)
	m.set(kubeletStoppedAt(100*s + 20*time.Millisecond))
	m.setBound(twice)
	if res := repairKubelet(t, r); res != RepairRestarted {
		t.Errorf("kubelet stopped by containerd's first of two crashes: %s, want %s", res, RepairRestarted)
	}

	// A daemon restarted since knows no healthy kubelet: left stopped.
	m, _ = kubeletBoundToContainerd(t, 3)
	m.set(kubeletStoppedAt(100*s + 20*time.Millisecond))
	m.setBound(twice)
	r = NewRepairer(m, quietLog(), time.Now, nil)
	r.SetUnitWatch(NewUnitWatch(nil, nil))
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("the daemon restarted since kubelet was last healthy: %s, want %s", res, RepairStopped)
	}

	// Someone stops kubelet at 95 s; a probe reads it stopped while
	// containerd runs (up since 10 s): their stop, also once containerd
	// crashed twice after it.
	m, r = kubeletBoundToContainerd(t, 3)
	m.set(kubeletStoppedAt(95 * s))
	m.setBound(systemd.Bound{Name: rt, ActiveState: "active", ActiveEnterMono: 10 * s, NRestarts: 3})
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped by hand: %s, want %s", res, RepairStopped)
	}
	m.setBound(twice)
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped by hand, read so while containerd ran, containerd crashed twice since: %s, want %s", res, RepairStopped)
	}

	// A probe that reads kubelet stopped while containerd is down (its
	// Restart= to come) decides nothing: kubelet is started once
	// containerd is back.
	m, r = kubeletBoundToContainerd(t, 3)
	m.set(kubeletStoppedAt(100*s + 20*time.Millisecond))
	m.setBound(systemd.Bound{Name: rt, ActiveState: "activating", ActiveExitMono: 102 * s, ActiveEnterMono: 101 * s, NRestarts: 5})
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped, containerd down: %s, want %s", res, RepairStopped)
	}
	m.setBound(twice)
	if res := repairKubelet(t, r); res != RepairRestarted {
		t.Errorf("kubelet stopped by containerd's first of two crashes, read once while containerd was down: %s, want %s", res, RepairRestarted)
	}
}

// Someone's stop of kubelet read by a probe while containerd was down
// (crashed after that stop, its Restart= to come; or stopped by hand with
// kubelet, for maintenance) is theirs: containerd's last stop came after
// kubelet's, and its Restart= had not brought it back since the daemon
// last saw kubelet healthy, so no stop of containerd came at or before
// kubelet's. Before, only a probe that read containerd running made the
// stop someone's, and containerd's next two crashes (a crash loop after
// the maintenance) had kubelet started against the operator's stop.
func TestRepairLeavesKubeletStoppedByHandReadWhileContainerdDown(t *testing.T) {
	s := time.Second
	const rt = "containerd.service"
	// kubelet stopped by hand at 95 s; containerd crashes at 97 s and is
	// read in its auto-restart (NRestarts not yet counted); then it comes
	// back at 102 s, crashes at 104 s and is back at 109 s.
	m, r := kubeletBoundToContainerd(t, 3)
	m.set(kubeletStoppedAt(95 * s))
	m.setBound(systemd.Bound{Name: rt, ActiveState: "activating", ActiveEnterMono: 10 * s, ActiveExitMono: 97 * s, NRestarts: 3})
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped by hand, containerd down since: %s, want %s", res, RepairStopped)
	}
	m.setBound(systemd.Bound{Name: rt, ActiveState: "active", ActiveEnterMono: 109 * s, ActiveExitMono: 104 * s, NRestarts: 5})
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped by hand, read so while containerd was down after a crash, containerd crashed twice in all: %s, want %s", res, RepairStopped)
	}

	// containerd stopped by hand (systemd stops kubelet first, at 95 s,
	// containerd at 95.1 s), read so while both are stopped; started by
	// hand at 300 s (NRestarts back to 0), it crashes twice and runs.
	m, r = kubeletBoundToContainerd(t, 0)
	m.set(kubeletStoppedAt(95 * s))
	m.setBound(systemd.Bound{Name: rt, ActiveState: "inactive", ActiveEnterMono: 10 * s, ActiveExitMono: 95*s + 100*time.Millisecond})
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped with containerd by hand: %s, want %s", res, RepairStopped)
	}
	m.setBound(systemd.Bound{Name: rt, ActiveState: "active", ActiveEnterMono: 312 * s, ActiveExitMono: 306 * s, NRestarts: 2})
	if res := repairKubelet(t, r); res != RepairStopped {
		t.Errorf("kubelet stopped with containerd by hand, read so while both were stopped, containerd started by hand and crashed twice: %s, want %s", res, RepairStopped)
	}
}

// runningKubelet is kubelet.service running since 50 s.
func runningKubelet() systemd.Unit {
	return systemd.Unit{Name: "kubelet.service", LoadState: "loaded", ActiveState: "active", SubState: "running", Invocation: "k1", MainStartMono: 50 * time.Second}
}

// kubeletStoppedAt is runningKubelet stopped at exit.
func kubeletStoppedAt(exit time.Duration) systemd.Unit {
	u := runningKubelet()
	u.ActiveState, u.SubState, u.ActiveExitMono = "inactive", "dead", exit
	return u
}

// kubeletBoundToContainerd is a Repairer whose unit watch saw, at 90 s,
// runningKubelet and containerd.service running since 10 s with nrestarts
// restarts (ServiceNotRecovering's read), after which a kubelet probe
// passed.
func kubeletBoundToContainerd(t *testing.T, nrestarts uint32) (*bindsToManager, *Repairer) {
	t.Helper()
	const kl, rt = "kubelet.service", "containerd.service"
	runtime := systemd.Unit{Name: rt, LoadState: "loaded", ActiveState: "active", SubState: "running", Invocation: "c1", NRestarts: nrestarts, MainStartMono: 10 * time.Second}
	m := &bindsToManager{fakeManager: newFakeManager(runningKubelet(), runtime)}
	w := NewUnitWatch(nil, nil)
	w.sinceBoot = func() time.Duration { return 90 * time.Second }
	r := NewRepairer(m, quietLog(), time.Now, nil)
	r.SetUnitWatch(w)
	for _, name := range []string{kl, rt} {
		w.Observe(mustUnit(t, m.fakeManager, name))
	}
	r.Healthy(kl)
	return m, r
}

// repairKubelet runs a repair of kubelet.service for a failed healthz and
// waits for it; it returns the repair's result.
func repairKubelet(t *testing.T, r *Repairer) string {
	t.Helper()
	res, _ := r.Repair(t.Context(), "kubelet.service", time.Millisecond, "healthz failed")
	r.Wait()
	return res
}
