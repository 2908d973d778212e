package checks

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// unitRestarts reads syself_node_unit_restarts{unit} from reg; -1 when the
// series does not exist.
func unitRestarts(t *testing.T, reg *prometheus.Registry, unit string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "syself_node_unit_restarts" {
			continue
		}
		if mf.GetType().String() != "COUNTER" {
			t.Fatalf("syself_node_unit_restarts is a %s", mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "unit" && l.GetValue() == unit {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

func TestUnitWatchCounts(t *testing.T) {
	const k = "kubelet.service"
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	u := systemd.Unit{Name: k, LoadState: "loaded", ActiveState: "active", SubState: "running", Invocation: "i0", MainStart: at}
	next := func(inv string, n uint32) systemd.Unit {
		at = at.Add(time.Second)
		u.Invocation, u.NRestarts, u.MainStart = inv, n, at
		return u
	}
	reg := prometheus.NewRegistry()
	w := NewUnitWatch(nil, reg)
	if got := unitRestarts(t, reg, k); got != -1 {
		t.Fatalf("a series before the first read: %v", got)
	}
	steps := []struct {
		what         string
		read         func() systemd.Unit
		own          bool
		auto, manual uint64
	}{
		{"first read: the baseline", func() systemd.Unit { return u }, false, 0, 0},
		{"the same again", func() systemd.Unit { return u }, false, 0, 0},
		{"3 automatic restarts (NRestarts 0 -> 3)", func() systemd.Unit { return next("i1", 3) }, false, 3, 0},
		{"a manual restart (NRestarts 3 -> 0)", func() systemd.Unit { return next("i2", 0) }, false, 3, 1},
		{"a manual restart, then 2 automatic ones (NRestarts 0 -> 2: up, so read as 2 automatic: the limit)", func() systemd.Unit { return next("i3", 2) }, false, 5, 1},
		{"a manual restart, then 2 automatic ones (NRestarts 2 -> 2)", func() systemd.Unit { return next("i4", 2) }, false, 7, 2},
		{"two manual restarts, then 1 automatic one (NRestarts 2 -> 1): one manual", func() systemd.Unit { return next("i5", 1) }, false, 8, 3},
		// systemd counts an automatic restart when it queues its start
		// job: a read can see NRestarts up before the new invocation.
		{"automatic restart queued (same invocation, NRestarts 1 -> 2)", func() systemd.Unit { u.NRestarts = 2; return u }, false, 9, 3},
		{"... then its invocation (NRestarts 2 -> 2)", func() systemd.Unit { return next("i6", 2) }, false, 9, 3},
		{"reset-failed (same invocation, NRestarts 2 -> 0)", func() systemd.Unit { u.NRestarts = 0; return u }, false, 9, 3},
		{"our repair, read right after it (NRestarts 0 -> 0)", func() systemd.Unit { return next("i7", 0) }, true, 9, 4},
		{"our repair, read after one more automatic restart (NRestarts 0 -> 1)", func() systemd.Unit { return next("i8", 1) }, true, 10, 5},
		{"the read after our repair, when another read saw it first: not again", func() systemd.Unit { return u }, true, 10, 5},
		{"an older read applied late (two readers at once)", func() systemd.Unit {
			return systemd.Unit{Name: k, LoadState: "loaded", Invocation: "i5", NRestarts: 1, MainStart: at.Add(-time.Hour)}
		}, false, 10, 5},
		{"not loaded: ignored", func() systemd.Unit { return systemd.Unit{Name: k, LoadState: "not-found"} }, false, 10, 5},
		{"stopped, no invocation: nothing to compare", func() systemd.Unit { return systemd.Unit{Name: k, LoadState: "loaded", ActiveState: "inactive"} }, false, 10, 5},
		{"started again (NRestarts 1 -> 0)", func() systemd.Unit { return next("i9", 0) }, false, 10, 6},
	}
	for _, s := range steps {
		if s.own {
			w.ObserveRestarted(s.read())
		} else {
			w.Observe(s.read())
		}
		auto, manual := w.Restarts(k)
		if auto != s.auto || manual != s.manual {
			t.Errorf("%s: %d automatic, %d manual; want %d, %d", s.what, auto, manual, s.auto, s.manual)
		}
		if got := unitRestarts(t, reg, k); got != float64(s.auto+s.manual) {
			t.Errorf("%s: syself_node_unit_restarts %v, want %d", s.what, got, s.auto+s.manual)
		}
	}
}

// The wall clock is set back an hour after kubelet started: its next
// invocation's wall-clock start is before the last one's. The monotonic
// starts order them, so the restart is counted, not taken for an older
// read; a read that is older on the monotonic clock is still ignored.
func TestUnitWatchCountsAcrossAWallClockStep(t *testing.T) {
	const k = "kubelet.service"
	at := time.Date(2025, 1, 1, 1, 0, 0, 0, time.UTC)
	u := systemd.Unit{Name: k, LoadState: "loaded", ActiveState: "active", SubState: "running", Invocation: "i0", MainStart: at, MainStartMono: 10 * time.Second}
	w := NewUnitWatch(nil, nil)
	w.Observe(u)
	u.Invocation, u.NRestarts, u.MainStart, u.MainStartMono = "i1", 1, at.Add(-time.Hour+time.Minute), 70*time.Second
	w.Observe(u)
	if auto, manual := w.Restarts(k); auto != 1 || manual != 0 {
		t.Errorf("a restart after the clock was set back: %d automatic, %d manual; want 1, 0", auto, manual)
	}
	w.Observe(systemd.Unit{Name: k, LoadState: "loaded", Invocation: "i0", MainStart: at, MainStartMono: 10 * time.Second})
	if auto, manual := w.Restarts(k); auto != 1 || manual != 0 {
		t.Errorf("an older read applied late: %d automatic, %d manual; want 1, 0", auto, manual)
	}
}

// A unit seen before it started (at boot, its start job waiting): its first
// start is not a restart; automatic restarts of it are.
func TestUnitWatchFirstStart(t *testing.T) {
	w := NewUnitWatch(nil, nil)
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "inactive", Job: 3})
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", Invocation: "a", MainStart: time.Now()})
	if auto, manual := w.Restarts("k.service"); auto+manual != 0 {
		t.Errorf("first start counted: %d, %d", auto, manual)
	}
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", Invocation: "b", NRestarts: 1, MainStart: time.Now()})
	if auto, manual := w.Restarts("k.service"); auto != 1 || manual != 0 {
		t.Errorf("after one automatic restart: %d, %d", auto, manual)
	}
	w2 := NewUnitWatch(nil, nil)
	w2.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "inactive", Job: 3})
	w2.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", Invocation: "a", NRestarts: 2, MainStart: time.Now()})
	if auto, manual := w2.Restarts("k.service"); auto != 2 || manual != 0 {
		t.Errorf("first start, then 2 automatic restarts: %d, %d", auto, manual)
	}
	var nilWatch *UnitWatch
	nilWatch.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded"})
	if nilWatch.AutoSince("x", "k.service") != 0 {
		t.Error("nil watch")
	}
}

func TestUnitWatchAutoSince(t *testing.T) {
	w := NewUnitWatch(nil, nil)
	if n := w.AutoSince("a", "k.service"); n != 0 {
		t.Errorf("unknown unit: %d", n)
	}
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", Invocation: "a"})
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", Invocation: "b", NRestarts: 2})
	// A consumer's first call sets its baseline, whatever another reader
	// saw before it (README: without a baseline a run only sets one).
	if n := w.AutoSince("a", "k.service"); n != 0 {
		t.Errorf("first call, a baseline: %d", n)
	}
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", Invocation: "c", NRestarts: 3})
	if n := w.AutoSince("a", "k.service"); n != 1 {
		t.Errorf("a: %d", n)
	}
	if n := w.AutoSince("a", "k.service"); n != 0 {
		t.Errorf("a again: %d", n)
	}
	if n := w.AutoSince("b", "k.service"); n != 0 {
		t.Errorf("another consumer's first call: %d", n)
	}
	w.Observe(systemd.Unit{Name: "k.service", LoadState: "loaded", Invocation: "d", NRestarts: 4})
	if n := w.AutoSince("b", "k.service"); n != 1 {
		t.Errorf("another consumer after its baseline: %d", n)
	}
}

// The daemon's own repair goes through the repairer, which reads the unit
// before and after its restart; ServiceNotRecovering reads it too. The
// repair is counted once, whichever read sees the new invocation first.
func TestUnitWatchOwnRepairCountedOnce(t *testing.T) {
	u := running("kubelet.service")
	u.MainStart = time.Now().Add(-time.Hour)
	m := newFakeManager(u, running("containerd.service"), running("syself-proxy.service"))
	env := snrEnv(t, m)
	reg := prometheus.NewRegistry()
	env.Units = NewUnitWatch(nil, reg)
	env.Repair.SetUnitWatch(env.Units)
	c, _ := newServiceNotRecovering(env)
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
		t.Fatalf("baseline: %+v %v", r, err)
	}
	if res, msg := env.Repair.Repair(context.Background(), "kubelet.service", time.Minute, "healthz"); res != RepairRestarted {
		t.Fatalf("%s %s", res, msg)
	}
	env.Repair.Wait()
	if got := unitRestarts(t, reg, "kubelet.service"); got != 1 {
		t.Errorf("after our repair: %v", got)
	}
	if r, _ := c.Probe(context.Background()); r.Status != report.StatusFalse {
		t.Errorf("after our repair: %+v", r)
	}
	if auto, manual := env.Units.Restarts("kubelet.service"); auto != 0 || manual != 1 || unitRestarts(t, reg, "kubelet.service") != 1 {
		t.Errorf("our repair counted %d automatic, %d manual (metric %v)", auto, manual, unitRestarts(t, reg, "kubelet.service"))
	}
	// Another reader sees the new invocation before the repairer's read
	// after the restart.
	w := NewUnitWatch(nil, nil)
	before := running("k.service")
	w.Observe(before)
	after := before
	after.Invocation, after.MainStart = "new", before.MainStart.Add(time.Second)
	w.Observe(after)
	w.ObserveRestarted(after)
	if auto, manual := w.Restarts("k.service"); auto != 0 || manual != 1 {
		t.Errorf("seen first by another read: %d automatic, %d manual", auto, manual)
	}
}

// The watch's state, ServiceNotRecovering's baseline with it, is kept in
// the state file: a daemon restart within the boot neither forgets a unit
// that flapped nor counts a restart twice; a new boot starts afresh.
func TestUnitWatchSurvivesDaemonRestart(t *testing.T) {
	dir := t.TempDir()
	m := newFakeManager(running("kubelet.service"), running("containerd.service"), running("syself-proxy.service"))
	type daemon struct {
		store *report.Store
		reg   *prometheus.Registry
		env   *Env
		check Check
	}
	start := func(boot string) daemon {
		t.Helper()
		d := daemon{store: report.NewStore(boot), reg: prometheus.NewRegistry()}
		if _, err := d.store.Load(dir); err != nil {
			t.Fatal(err)
		}
		d.env = snrEnv(t, m)
		d.env.Units = NewUnitWatch(d.store, d.reg)
		d.env.Repair.SetUnitWatch(d.env.Units)
		d.check, _ = newServiceNotRecovering(d.env)
		return d
	}
	probe := func(d daemon) Result {
		t.Helper()
		r, err := d.check.Probe(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	save := func(d daemon) {
		t.Helper()
		if err := d.store.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}
	}

	d1 := start("boot-1")
	if r := probe(d1); r.Status != report.StatusFalse {
		t.Fatalf("baseline: %+v", r)
	}
	m.crash("kubelet.service", 1)
	m.manual("kubelet.service")
	if r := probe(d1); r.Status != report.StatusFalse {
		t.Fatalf("%+v", r)
	}
	if got := unitRestarts(t, d1.reg, "kubelet.service"); got != 1 {
		t.Fatalf("counter %v", got) // the automatic restart hidden by the manual one
	}
	save(d1)

	// Flapping while the daemon was down.
	m.crash("kubelet.service", 3)
	d2 := start("boot-1")
	if got := unitRestarts(t, d2.reg, "kubelet.service"); got != -1 {
		t.Errorf("series before the first read: %v", got)
	}
	if r := probe(d2); r.Reason != "UnitFlapping" || r.Message != "kubelet.service restarted 3 times since the last check" {
		t.Errorf("flapped while the daemon was down: %+v", r)
	}
	if got := unitRestarts(t, d2.reg, "kubelet.service"); got != 4 {
		t.Errorf("counter after the restart: %v, want 1 before + 3", got)
	}
	if r := probe(d2); r.Status != report.StatusFalse {
		t.Errorf("next run: %+v", r)
	}
	save(d2)

	// Flapping seen by another reader (the repairer) after the last run
	// of the check, then a daemon restart before its next run.
	m.crash("kubelet.service", 3)
	d2.env.Units.Observe(mustUnit(t, m, "kubelet.service"))
	save(d2)
	d3 := start("boot-1")
	if r := probe(d3); r.Reason != "UnitFlapping" || r.Message != "kubelet.service restarted 3 times since the last check" {
		t.Errorf("flapped between the last run before the restart and the first after: %+v", r)
	}
	if got := unitRestarts(t, d3.reg, "kubelet.service"); got != 7 {
		t.Errorf("counter: %v, want 7 (no restart counted twice)", got)
	}
	// Saved, restarted, nothing new: nothing counted twice.
	save(d3)
	d4 := start("boot-1")
	if r := probe(d4); r.Status != report.StatusFalse {
		t.Errorf("nothing new: %+v", r)
	}
	if got := unitRestarts(t, d4.reg, "kubelet.service"); got != 7 {
		t.Errorf("counter: %v", got)
	}
	select { // nothing changed: nothing to write
	case <-d4.store.Dirty():
		t.Error("a read that changed nothing touched the store")
	default:
	}
	m.crash("kubelet.service", 1)
	probe(d4)
	select { // a change is written soon (the persister), not at the next minute
	case <-d4.store.Dirty():
	default:
		t.Error("a counted restart did not touch the store")
	}
	save(d4)

	// A new boot: NRestarts and invocations start over, so does the watch.
	m.crash("kubelet.service", 5)
	d5 := start("boot-2")
	if r := probe(d5); r.Status != report.StatusFalse {
		t.Errorf("new boot: %+v", r)
	}
	if got := unitRestarts(t, d5.reg, "kubelet.service"); got != 0 {
		t.Errorf("counter in a new boot: %v", got)
	}
}

func mustUnit(t *testing.T, m *fakeManager, name string) systemd.Unit {
	t.Helper()
	u, err := m.Unit(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Without a watch (the one-shot check) the check keeps its own, without
// metrics or state.
func TestServiceNotRecoveringWithoutWatch(t *testing.T) {
	m := newFakeManager(running("kubelet.service"), running("containerd.service"), running("syself-proxy.service"))
	env := testEnv(t, nil)
	env.Systemd = m
	c, _ := newServiceNotRecovering(env)
	if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
		t.Fatalf("%+v %v", r, err)
	}
	m.crash("kubelet.service", 3)
	if r, _ := c.Probe(context.Background()); r.Reason != "UnitFlapping" {
		t.Errorf("%+v", r)
	}
}
