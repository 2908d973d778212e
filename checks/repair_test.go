package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// fakeManager is a unit manager whose units a test sets.
type fakeManager struct {
	mu       sync.Mutex
	units    map[string]systemd.Unit
	restarts []string
	resets   []string
	err      error
	seq      int
	// state is the manager's SystemState ("" reads as "running");
	// stateReads counts its reads.
	state      string
	stateReads int
	// unitReads counts the reads of each unit.
	unitReads map[string]int
}

func newFakeManager(units ...systemd.Unit) *fakeManager {
	m := &fakeManager{units: map[string]systemd.Unit{}}
	for _, u := range units {
		m.units[u.Name] = u
	}
	return m
}

func (m *fakeManager) set(u systemd.Unit) { m.mu.Lock(); m.units[u.Name] = u; m.mu.Unlock() }

func (m *fakeManager) Unit(_ context.Context, name string) (systemd.Unit, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.unitReads == nil {
		m.unitReads = map[string]int{}
	}
	m.unitReads[name]++
	if m.err != nil {
		return systemd.Unit{}, m.err
	}
	u, ok := m.units[name]
	if !ok {
		return systemd.Unit{Name: name, LoadState: "not-found", ActiveState: "inactive", SubState: "dead"}, nil
	}
	return u, nil
}

func (m *fakeManager) Restart(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resets = append(m.resets, name)
	m.restarts = append(m.restarts, name)
	u := m.units[name]
	// A manual restart: a new invocation, and NRestarts reset.
	m.seq++
	u.ActiveState, u.SubState, u.NRestarts, u.MainStart = "active", "running", 0, time.Now()
	u.Invocation = fmt.Sprintf("%s-manual-%d", name, m.seq)
	m.units[name] = u
	return nil
}

// crash makes systemd restart the unit n times on its own (Restart=): n new
// invocations, NRestarts up by n.
func (m *fakeManager) crash(name string, n uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.units[name]
	m.seq++
	u.ActiveState, u.SubState, u.NRestarts, u.MainStart = "active", "running", u.NRestarts+n, time.Now()
	u.Invocation = fmt.Sprintf("%s-auto-%d", name, m.seq)
	m.units[name] = u
}

// manual is a start or restart by someone else (an operator, RestartUnit).
func (m *fakeManager) manual(name string) {
	m.mu.Lock()
	m.seq++
	u := m.units[name]
	u.ActiveState, u.SubState, u.NRestarts, u.MainStart = "active", "running", 0, time.Now()
	u.Invocation = fmt.Sprintf("%s-manual-%d", name, m.seq)
	m.units[name] = u
	m.mu.Unlock()
}

func (m *fakeManager) ResetFailed(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.resets = append(m.resets, name)
	return nil
}

func (m *fakeManager) SystemState(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return "", m.err
	}
	m.stateReads++
	if m.state == "" {
		return "running", nil
	}
	return m.state, nil
}

// setState sets the manager's SystemState.
func (m *fakeManager) setState(s string) { m.mu.Lock(); m.state = s; m.mu.Unlock() }

func (m *fakeManager) reads() int { m.mu.Lock(); defer m.mu.Unlock(); return m.stateReads }

func (m *fakeManager) restartCount() int { m.mu.Lock(); defer m.mu.Unlock(); return len(m.restarts) }

func running(name string) systemd.Unit {
	return systemd.Unit{Name: name, LoadState: "loaded", ActiveState: "active", SubState: "running", MainStart: time.Now(), Invocation: name + "-boot"}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// probesEvery10s is the results of n probes of kubelet.service that fail
// and ask r for a repair, one every 10 s (each repair's restart awaited),
// joined by spaces.
func probesEvery10s(r *Repairer, n int) string {
	var results []string
	for range n {
		res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
		r.Wait()
		results = append(results, res)
		time.Sleep(10 * time.Second)
	}
	return strings.Join(results, " ")
}

// keptRepairer is a daemon's start: a store loaded from the state in dir
// (boot "boot-1"), and a repairer of m that keeps its memory in it.
func keptRepairer(t *testing.T, m systemd.Manager, dir string) (*report.Store, *Repairer) {
	t.Helper()
	st := report.NewStore("boot-1")
	if _, err := st.Load(dir); err != nil {
		t.Fatal(err)
	}
	r := NewRepairer(m, quietLog(), time.Now, nil)
	r.KeepIn(st)
	return st, r
}

// A broken /healthz every 10 s leads to exactly one restart per cooldown.
func TestRepairCooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := newFakeManager(u)
		r := NewRepairer(m, quietLog(), time.Now, nil)
		got := probesEvery10s(r, 13) // 2 minutes of probes every 10 s
		want := "restarted cooldown cooldown cooldown cooldown cooldown restarted cooldown cooldown cooldown cooldown cooldown restarted"
		if got != want {
			t.Errorf("results:\n%s\nwant:\n%s", got, want)
		}
		if m.restartCount() != 3 {
			t.Errorf("%d restarts in 2 minutes with a 1-minute cooldown", m.restartCount())
		}
		if st := r.Status("kubelet.service"); st.Consecutive != 3 || st.Repairs != 3 {
			t.Errorf("status %+v", st)
		}
		r.Healthy("kubelet.service")
		if st := r.Status("kubelet.service"); st.Consecutive != 0 || st.Repairs != 3 {
			t.Errorf("after healthy: %+v", st)
		}
	})
}

// kubelet's /healthz fails for 2 minutes, probed every 10 s: the repairer
// restarts it once a minute and holds off in between, and containerd, which
// systemd restarts on its own every 30 s, is held off throughout. Each
// condition keeps one message (the store sees one change, the first), so the
// reporter writes the Node once, not at every probe: a cooldown's "started
// 20s ago" or a restart's count changed the message at every probe, and the
// Node was written every 10 s for as long as the unit stayed unhealthy.
func TestRepairMessageStaysTheSameWhileTheProbeFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := running("kubelet.service")
		k.MainStart = time.Now().Add(-time.Hour)
		m := newFakeManager(k, running("containerd.service"))
		env := testEnv(t, nil)
		env.Repair = NewRepairer(m, quietLog(), time.Now, nil)
		st := report.NewStore("boot")
		healthz := errors.New(`Get "http://127.0.0.1:10248/healthz": dial tcp 127.0.0.1:10248: connect: connection refused`)
		cri := errors.New("CRI RuntimeService/Status on /run/containerd/containerd.sock: no RuntimeReady condition in the answer")
		changes := map[string][]string{}
		for i := range 13 {
			if i%3 == 0 {
				m.crash("containerd.service", 1)
			}
			for _, p := range []struct {
				cond, unit string
				cooldown   time.Duration
				reason     report.Reason
				err        error
			}{
				{"KubeletUnhealthy", "kubelet.service", time.Minute, report.ReasonKubeletHealthzFailed, healthz},
				{"ContainerRuntimeUnhealthy", "containerd.service", 2 * time.Minute, report.ReasonCRIProbeFailed, cri},
			} {
				r := repairResult(context.Background(), env, p.unit, p.cooldown, p.reason, p.err)
				env.Repair.Wait()
				if r.Status != report.StatusTrue || r.Reason != p.reason {
					t.Fatalf("probe %d: %s/%s %s", i, r.Status, r.Reason, r.Message)
				}
				if st.Set(report.Condition{Type: p.cond, Status: r.Status, Reason: r.Reason, Message: r.Message}, time.Now()) {
					changes[p.cond] = append(changes[p.cond], r.Message)
				}
			}
			time.Sleep(10 * time.Second)
		}
		for cond, msgs := range changes {
			if len(msgs) != 1 {
				t.Errorf("%s: %d of 13 probes changed the condition, want 1 (the first):\n%s", cond, len(msgs), strings.Join(msgs, "\n"))
			}
		}
		if got := env.Repair.Status("kubelet.service"); got.Repairs != 3 {
			t.Errorf("kubelet repaired %d times in 2 minutes with a 1-minute cooldown, want 3", got.Repairs)
		}
		if got := env.Repair.Status("containerd.service"); got.Repairs != 0 {
			t.Errorf("containerd, restarted by systemd every 30 s, repaired %d times, want 0", got.Repairs)
		}
	})
}

// The wall clock is set back 30 minutes after kubelet started (an RTC that
// ran ahead, then chrony's makestep at boot): its wall-clock start is then
// in the future. The cooldown counts from its monotonic start, which the
// step does not move: one restart per cooldown as before, neither none for
// half an hour nor one at once. Without a monotonic start, a start in the
// future does not hold repairs off.
func TestRepairCooldownAcrossAWallClockStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const step = 30 * time.Minute
		boot := 100 * time.Second // CLOCK_MONOTONIC at kubelet's start
		started := time.Now()
		mono := func() time.Duration { return boot + time.Since(started) }
		wall := func() time.Time { return time.Now().Add(-step) } // after the step
		u := running("kubelet.service")
		u.MainStart, u.MainStartMono = started, boot // read before the step
		m := newFakeManager(u)
		r := NewRepairer(m, quietLog(), wall, nil)
		r.sinceBoot = mono
		time.Sleep(30 * time.Second) // kubelet has run 30 s
		got := probesEvery10s(r, 7)  // a minute of probes every 10 s
		want := "cooldown cooldown cooldown restarted cooldown cooldown cooldown"
		if got != want {
			t.Errorf("monotonic start:\n%s\nwant:\n%s", got, want)
		}

		// No monotonic start: its wall-clock start, in the future, does
		// not hold the repair off.
		v := running("containerd.service")
		v.MainStart = time.Now().Add(-time.Minute) // a minute ago before the step: 29 min ahead now
		r2 := NewRepairer(newFakeManager(v), quietLog(), wall, nil)
		if res, msg := r2.Repair(context.Background(), "containerd.service", 2*time.Minute, "cri failed"); res != RepairRestarted {
			t.Errorf("wall-clock start in the future: %s (%s), want %s", res, msg, RepairRestarted)
		}
		r2.Wait()
	})
}

func TestRepairDoesNotFightSystemd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			unit       systemd.Unit
			wantResult string
			wantMsg    string
		}{
			{systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "activating", SubState: "auto-restart"}, RepairSystemd,
				"not restarted: systemd is already restarting k.service (activating/auto-restart)"},
			{systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "inactive", SubState: "dead"}, RepairStopped,
				"not restarted: k.service is stopped (inactive/dead); a stopped unit is not started by the repair"},
			{systemd.Unit{Name: "k.service", LoadState: "not-found", ActiveState: "inactive"}, RepairNotLoaded, "not repaired: k.service is not installed (not-found)"},
			// Each not-loaded state says what to do, as NodeServiceDown does.
			{systemd.Unit{Name: "k.service", LoadState: "masked", ActiveState: "inactive"}, RepairNotLoaded,
				"not repaired: k.service is masked: systemd will not start it; systemctl unmask it"},
			{systemd.Unit{Name: "k.service", LoadState: "bad-setting", ActiveState: "inactive"}, RepairNotLoaded,
				"not repaired: k.service does not load (bad-setting): see systemctl status k.service"},
			// At boot: ordered after this daemon, its start job waits.
			{systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Job: 42}, RepairStarting,
				"k.service has not started yet (job 42 queued)"},
			// systemd restarted it 20 s ago (Restart=always): that starts the cooldown too.
			{systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", SubState: "running", MainStart: time.Now().Add(-20 * time.Second)}, RepairCooldown,
				"restarting k.service at most once per 1m0s from its last start"},
			{systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "start-limit-hit"}, RepairRestarted,
				"restarting k.service at most once per 1m0s from its last start"},
		} {
			m := newFakeManager(tc.unit)
			r := NewRepairer(m, quietLog(), time.Now, nil)
			res, msg := r.Repair(context.Background(), "k.service", time.Minute, "probe failed")
			r.Wait()
			if res != tc.wantResult || msg != tc.wantMsg {
				t.Errorf("%s/%s: %s %q, want %s %q", tc.unit.ActiveState, tc.unit.SubState, res, msg, tc.wantResult, tc.wantMsg)
			}
			if (res == RepairRestarted) != (m.restartCount() == 1) {
				t.Errorf("%s: %d restarts", res, m.restartCount())
			}
		}
		r := NewRepairer(nil, quietLog(), time.Now, nil)
		if res, _ := r.Repair(context.Background(), "k.service", time.Minute, "x"); res != RepairNoSystemd {
			t.Errorf("without systemd: %s", res)
		}
		m := newFakeManager()
		m.err = errors.New("bus gone")
		if res, msg := NewRepairer(m, quietLog(), time.Now, nil).Repair(context.Background(), "k.service", time.Minute, "x"); res != RepairFailed || msg != "not repaired: bus gone" {
			t.Errorf("bus error: %s %q", res, msg)
		}
	})
}

// At shutdown or reboot systemd stops the units in reverse order, kubelet
// and containerd before this daemon: a unit with a stop job, or any unit
// while systemd shuts the system down, is not restarted (systemd refuses
// the job then, or worse, starts the unit again). A unit the shutdown could
// not stop cleanly is failed, which the repair restarts otherwise. The
// system state is read only before a restart.
func TestRepairLeavesAShutdownAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			state      string
			unit       systemd.Unit
			wantResult string
			wantMsg    string
			wantReads  int
		}{
			{"stopping", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "deactivating", SubState: "stop-sigterm", Job: 9, JobType: "stop"}, RepairUnitStopping,
				"not restarted: systemd is stopping k.service (deactivating/stop-sigterm, stop job queued)", 0},
			// Someone's stop (systemctl stop) while kubelet hangs: the same.
			{"running", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", SubState: "running", Job: 9, JobType: "stop"}, RepairUnitStopping,
				"not restarted: systemd is stopping k.service (active/running, stop job queued)", 0},
			{"stopping", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "timeout"}, RepairShutdown,
				"not restarted: the system is shutting down", 1},
			// Not reached by the shutdown yet, and not answering.
			{"stopping", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", SubState: "running", MainStart: time.Now().Add(-time.Hour)}, RepairShutdown,
				"not restarted: the system is shutting down", 1},
			// Stopped by the shutdown: left alone as any stopped unit, no read.
			{"stopping", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "inactive", SubState: "dead"}, RepairStopped,
				"not restarted: k.service is stopped (inactive/dead); a stopped unit is not started by the repair", 0},
			{"stopping", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "active", SubState: "running", MainStart: time.Now().Add(-20 * time.Second)}, RepairCooldown,
				"restarting k.service at most once per 1m0s from its last start", 0},
			{"running", systemd.Unit{Name: "k.service", LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "timeout"}, RepairRestarted,
				"restarting k.service at most once per 1m0s from its last start", 1},
		} {
			m := newFakeManager(tc.unit)
			m.setState(tc.state)
			r := NewRepairer(m, quietLog(), time.Now, nil)
			res, msg := r.Repair(context.Background(), "k.service", time.Minute, "probe failed")
			r.Wait()
			if res != tc.wantResult || msg != tc.wantMsg {
				t.Errorf("%s, %s/%s job %q: %s %q, want %s %q", tc.state, tc.unit.ActiveState, tc.unit.SubState, tc.unit.JobType, res, msg, tc.wantResult, tc.wantMsg)
			}
			if (res == RepairRestarted) != (m.restartCount() == 1) {
				t.Errorf("%s, %s: %d restarts", tc.state, res, m.restartCount())
			}
			if m.reads() != tc.wantReads {
				t.Errorf("%s, %s: SystemState read %d times, want %d", tc.state, res, m.reads(), tc.wantReads)
			}
		}
	})
}

func snrEnv(t *testing.T, m *fakeManager) *Env {
	env := testEnv(t, nil)
	env.Systemd = m
	env.Repair = NewRepairer(m, quietLog(), time.Now, nil)
	env.Units = NewUnitWatch(nil, nil)
	env.Repair.SetUnitWatch(env.Units)
	return env
}

func TestServiceNotRecoveringDelta(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newFakeManager(running("kubelet.service"), running("containerd.service"), running("syself-proxy.service"))
		env := snrEnv(t, m)
		c, _ := newServiceNotRecovering(env)
		probe := func() Result {
			t.Helper()
			time.Sleep(time.Minute) // the check's interval; MainStart moves on
			r, err := c.Probe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		if r := probe(); r.Status != report.StatusFalse {
			t.Fatalf("baseline: %+v", r)
		}
		m.crash("kubelet.service", 2)
		if r := probe(); r.Status != report.StatusFalse {
			t.Errorf("2 restarts: %+v", r)
		}
		m.crash("kubelet.service", 3) // NRestarts 2 -> 5
		if r := probe(); r.Status != report.StatusTrue || r.Reason != "UnitFlapping" || r.Message != "kubelet.service restarted 3 times since the last check" {
			t.Errorf("+3: %+v", r)
		}
		// A manual restart resets NRestarts to 0; then 1 automatic restart.
		m.manual("kubelet.service")
		m.crash("kubelet.service", 1)
		if r := probe(); r.Status != report.StatusFalse {
			t.Errorf("after a manual restart: %+v", r)
		}
		// The daemon's own repair (it reads the unit before and after the
		// restart), then 3 automatic restarts before the next run: NRestarts
		// 1 -> 0 -> 3 is 3, not 3 - 1.
		time.Sleep(time.Minute) // the repair's cooldown since the last start
		if res, msg := env.Repair.Repair(context.Background(), "kubelet.service", time.Minute, "healthz"); res != RepairRestarted {
			t.Fatalf("repair: %s %s", res, msg)
		}
		env.Repair.Wait()
		m.crash("kubelet.service", 3)
		if r := probe(); r.Reason != "UnitFlapping" || r.Message != "kubelet.service restarted 3 times since the last check" {
			t.Errorf("+3 after a repair: %+v", r)
		}
		if auto, manual := env.Units.Restarts("kubelet.service"); auto != 9 || manual != 2 {
			t.Errorf("counted %d automatic, %d manual restarts, want 9 and 2", auto, manual)
		}
	})
}

func TestServiceNotRecoveringFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Restart=no: failed is final.
		u := running("containerd.service")
		u.ActiveState, u.SubState, u.Result = "failed", "failed", "exit-code"
		m := newFakeManager(running("kubelet.service"), u, running("syself-proxy.service"))
		c, _ := newServiceNotRecovering(snrEnv(t, m))
		r, _ := c.Probe(context.Background())
		if r.Status != report.StatusTrue || r.Reason != "UnitFailed" || r.Message != "containerd.service is failed (exit-code)" {
			t.Errorf("failed: %+v", r)
		}
		// Restart=always and failed: systemd will not restart it (no read
		// sees the failed a unit passes through before an automatic
		// restart: TestFailedIsNeverSeenBeforeAnAutomaticRestart in
		// tests/). It counts at once, read once.
		k := running("kubelet.service")
		k.ActiveState, k.SubState, k.Result = "failed", "failed", "signal"
		m2 := newFakeManager(k, running("containerd.service"), running("syself-proxy.service"))
		c2, _ := newServiceNotRecovering(snrEnv(t, m2))
		if r, _ := c2.Probe(context.Background()); r.Reason != "UnitFailed" || r.Message != "kubelet.service is failed (signal)" {
			t.Errorf("failed, Restart=always: %+v", r)
		}
		m2.mu.Lock()
		reads := m2.unitReads["kubelet.service"]
		m2.mu.Unlock()
		if reads != 1 {
			t.Errorf("failed, Restart=always: kubelet.service read %d times in one run, want 1", reads)
		}
	})
}

func TestServiceNotRecoveringRepairNotHelping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := newFakeManager(u, running("containerd.service"), running("syself-proxy.service"))
		env := snrEnv(t, m)
		for range 3 {
			env.Repair.Repair(context.Background(), "kubelet.service", time.Minute, "healthz")
			env.Repair.Wait()
			time.Sleep(61 * time.Second)
		}
		c, _ := newServiceNotRecovering(env)
		r, _ := c.Probe(context.Background())
		const want = "kubelet.service was repaired 3+ times in a row and is still unhealthy"
		if r.Reason != "RepairNotHelping" || r.Message != want {
			t.Errorf("%+v", r)
		}
		// A fourth repair that did not help either: the same message (the
		// count, in the services report, moves on). With the count in the
		// message every run while kubelet stayed down changed the
		// condition, and wrote the Node.
		env.Repair.Repair(context.Background(), "kubelet.service", time.Minute, "healthz")
		env.Repair.Wait()
		r, _ = c.Probe(context.Background())
		if r.Reason != "RepairNotHelping" || r.Message != want {
			t.Errorf("after the 4th repair: %+v", r)
		}
		if st := r.Details[0].Value.([]ServiceState); st[0].Name != "kubelet.service" || st[0].Repair == nil || st[0].Repair.Consecutive != 4 {
			t.Errorf("services report: %+v", st)
		}
	})
}

func TestNodeServiceDown(t *testing.T) {
	failed := systemd.Unit{Name: "syself-tunnel-agent.service", LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code"}
	m := newFakeManager(failed)
	env := testEnv(t, nil)
	env.Systemd = m
	c, _ := newNodeServiceDown(env)
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusTrue || r.Message != "syself-tunnel-agent.service is not active (failed/failed, result exit-code)" {
		t.Errorf("%+v %v", r, err)
	}
	m.set(running("syself-tunnel-agent.service"))
	if r, _ := c.Probe(context.Background()); r.Status != report.StatusFalse {
		t.Errorf("active: %+v", r)
	}
	env.Role = report.RoleControlPlane
	c, _ = newNodeServiceDown(env)
	r, _ = c.Probe(context.Background())
	if r.Message != "syself-tunnel-server.service is not installed; syself-source-ip.service is not installed" {
		t.Errorf("control plane: %+v", r)
	}
	env.Systemd = nil
	if _, err := c.Probe(context.Background()); err == nil {
		t.Error("no systemd: no error")
	}
}

// While kubelet has not started yet (boot), a failed probe is Unknown, not True.
func TestKubeletNotStartedYetIsUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newFakeManager(systemd.Unit{Name: "kubelet.service", LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Job: 7})
		env := testEnv(t, nil)
		env.Systemd, env.Repair = m, NewRepairer(m, quietLog(), time.Now, nil)
		env.Config.Checks.KubeletUnhealthy.HealthzURL = "http://127.0.0.1:1/healthz"
		c, _ := newKubeletCheck(env)
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != report.StatusUnknown || r.Reason != report.ReasonNoData || !strings.HasPrefix(r.Message, "kubelet.service has not started yet (job 7 queued); ") {
			t.Errorf("%+v %v", r, err)
		}
		if m.restartCount() != 0 {
			t.Error("restarted a unit that is starting")
		}
	})
}

// A repair that cannot even start (the unit cannot be read) is recorded
// beside the repairs made, so status shows why nothing was restarted.
func TestRepairThatCannotStartIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newFakeManager(running("kubelet.service"))
		m.err = errors.New("dial unix /run/dbus/system_bus_socket: connect: no such file or directory")
		r := NewRepairer(m, quietLog(), time.Now, nil)
		if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairFailed {
			t.Fatalf("result %s", res)
		}
		st := r.Status("kubelet.service")
		if st.Repairs != 0 || st.LastAttempt.IsZero() || !strings.Contains(st.LastAttemptError, "no such file or directory") {
			t.Errorf("status %+v", st)
		}
		if _, ok := r.All()["kubelet.service"]; !ok {
			t.Error("the unit is not listed among the watched ones")
		}
	})
}

// A unit the repair was asked for but systemd did not load (not installed,
// masked, a unit file in error) is listed among the watched ones too, never
// repaired: status's "Repairs:" named containerd.service and left out a
// kubelet.service that was not installed, whose KubeletUnhealthy said "not
// repaired: kubelet.service is not installed (not-found)".
func TestRepairOfAUnitNotLoadedIsListed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, load := range []string{"not-found", "masked", "bad-setting"} {
			m := newFakeManager(systemd.Unit{Name: "kubelet.service", LoadState: load, ActiveState: "inactive", SubState: "dead"})
			r := NewRepairer(m, quietLog(), time.Now, nil)
			if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairNotLoaded {
				t.Fatalf("%s: result %s", load, res)
			}
			st, ok := r.All()["kubelet.service"]
			if !ok {
				t.Errorf("%s: the unit is not listed among the watched ones: %v", load, r.All())
			}
			if st.Repairs != 0 || !st.LastRepair.IsZero() || st.LastAttemptError != "" {
				t.Errorf("%s: status %+v, want never repaired", load, st)
			}
		}
	})
}

// A unit stuck failed whose RestartSec is 5 s or more (Debian's containerd:
// 5 s; kubeadm's kubelet: 10 s) is reported failed within the run's 10 s
// timeout, and read once per run: systemd does not restart a unit a read
// found failed. Neither one whose start limit was hit by a start of
// someone's (start-limit-hit) nor one its own automatic restarts drove
// into it: systemd 252 keeps that one's last result (exit-code, NRestarts
// 3 with Debian's containerd's StartLimitBurst=3 in 60 s), and it was
// re-read every 50 ms for up to twice its RestartSec, 9 s of every
// minute's run, for as long as it stayed failed.
func TestServiceNotRecoveringFailedWithALongRestartDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, result := range []string{"start-limit-hit", "exit-code"} {
			u := running("containerd.service")
			u.ActiveState, u.SubState, u.Result, u.NRestarts = "failed", "failed", result, 3
			m := newFakeManager(running("kubelet.service"), u, running("syself-proxy.service"))
			c, _ := newServiceNotRecovering(snrEnv(t, m))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the check's default timeout
			began := time.Now()
			r, err := c.Probe(ctx)
			took := time.Since(began)
			cancel()
			if err != nil || r.Status != report.StatusTrue || r.Reason != "UnitFailed" || r.Message != "containerd.service is failed ("+result+")" {
				t.Errorf("%s: %+v, %v", result, r, err)
			}
			m.mu.Lock()
			reads := m.unitReads["containerd.service"]
			m.mu.Unlock()
			if reads != 1 || took != 0 {
				t.Errorf("at its start limit (%s): containerd.service read %d times in one run of %s, want 1 and no wait", result, reads, took)
			}
		}
	})
}

// A unit an operator's stop left failed (killed at its TimeoutStopSec)
// stays failed: systemd restarts no unit that was stopped, whatever its
// Restart=. It is read once per run, not every 50 ms for the run's whole
// timeout (twice its RestartSec, up to 9 s of every minute for as long as
// the operator keeps it stopped).
func TestServiceNotRecoveringDoesNotWaitOnAStoppedUnit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.ActiveState, u.SubState, u.Result, u.NotifyAccess = "failed", "failed", "timeout", "none"
		u.MainStartMono, u.ActiveExitMono, u.MainExitMono = time.Minute, 2*time.Minute, 2*time.Minute+90*time.Second
		m := newFakeManager(u, running("containerd.service"), running("syself-proxy.service"))
		c, _ := newServiceNotRecovering(snrEnv(t, m))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the check's default timeout
		r, err := c.Probe(ctx)
		cancel()
		if err != nil || r.Status != report.StatusTrue || r.Reason != "UnitFailed" {
			t.Errorf("stopped, failed: %+v, %v", r, err)
		}
		m.mu.Lock()
		reads := m.unitReads["kubelet.service"]
		m.mu.Unlock()
		if reads != 1 {
			t.Errorf("a unit a stop left failed: read %d times in one run, want 1", reads)
		}
	})
}

// The repairer reads kubelet every 10 s when its probe fails; the first
// ServiceNotRecovering run of the boot comes later. Restarts the repairer's
// reads saw before that run do not make it flapping: the first run only
// sets the baseline; the next one counts.
func TestServiceNotRecoveringFirstRunOnlySetsABaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := running("kubelet.service")
		m := newFakeManager(k, running("containerd.service"), running("syself-proxy.service"))
		env := snrEnv(t, m)
		env.Units.Observe(k) // the repairer's read
		for i := 1; i <= 3; i++ {
			k.Invocation, k.NRestarts = fmt.Sprintf("inv-%d", i), uint32(i)
			m.set(k)
			env.Units.Observe(k)
		}
		c, _ := newServiceNotRecovering(env)
		if r, _ := c.Probe(context.Background()); r.Status != report.StatusFalse {
			t.Errorf("first run after 3 restarts another reader saw: %+v", r)
		}
		for i := 4; i <= 6; i++ {
			k.Invocation, k.NRestarts = fmt.Sprintf("inv-%d", i), uint32(i)
			m.set(k)
			env.Units.Observe(k)
		}
		if r, _ := c.Probe(context.Background()); r.Status != report.StatusTrue || r.Reason != "UnitFlapping" {
			t.Errorf("second run after 3 more: %+v", r)
		}
	})
}

// dependencyFailing is a manager whose restarts of one unit end as
// systemd's do when a unit the restarted one requires cannot start: the
// reset-failed before the restart made the failed unit inactive, the start
// job ends with result "dependency", and the unit never started, so it
// stays inactive. With result "canceled", someone's stop replaced the job.
type dependencyFailing struct {
	*fakeManager
	name   string
	fails  bool
	result string // "" is "dependency"
}

func (d *dependencyFailing) Restart(ctx context.Context, name string) error {
	d.mu.Lock()
	fails := d.fails
	d.mu.Unlock()
	if name != d.name || !fails {
		return d.fakeManager.Restart(ctx, name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resets = append(d.resets, name)
	d.restarts = append(d.restarts, name)
	u := d.units[name]
	u.ActiveState, u.SubState, u.Result, u.NRestarts = "inactive", "dead", "success", 0
	d.units[name] = u
	result := d.result
	if result == "" {
		result = "dependency"
	}
	return fmt.Errorf("restart %s: %w", name, &systemd.JobError{Unit: name, Result: result})
}

// kubelet is failed and its restart cannot start it (a unit it requires
// fails to start: the job's result is "dependency"). The reset-failed
// before the restart left it inactive, not failed: that is the daemon's own
// doing, not someone's stop, and the repair goes on at the cooldown, no
// more often, until a restart starts it. Before, the next probe took the
// unit for stopped on purpose ("a stopped unit is not started by the
// repair") and kubelet was never repaired again, nor, no longer failed,
// reported by ServiceNotRecovering. A unit someone stops after a restart
// that worked is still left alone.
func TestRepairAfterItsOwnRestartFailedLeavesTheUnitInactive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.ActiveState, u.SubState, u.Result, u.MainStart = "failed", "failed", "exit-code", time.Now().Add(-time.Hour)
		m := &dependencyFailing{fakeManager: newFakeManager(u, running("containerd.service"), running("syself-proxy.service")), name: "kubelet.service", fails: true}
		env := testEnv(t, nil)
		env.Systemd = m
		env.Repair = NewRepairer(m, quietLog(), time.Now, nil)
		env.Units = NewUnitWatch(nil, nil)
		env.Repair.SetUnitWatch(env.Units)
		probe := func() string {
			res, _ := env.Repair.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
			env.Repair.Wait()
			time.Sleep(10 * time.Second)
			return res
		}
		var results []string
		for range 13 { // 2 minutes of probes every 10 s, each restart failing
			results = append(results, probe())
		}
		want := "restarted cooldown cooldown cooldown cooldown cooldown restarted cooldown cooldown cooldown cooldown cooldown restarted"
		if got := strings.Join(results, " "); got != want {
			t.Errorf("restarts that cannot start the unit:\n%s\nwant:\n%s", got, want)
		}
		if st := env.Repair.Status("kubelet.service"); !strings.HasPrefix(st.LastResult, "failed: ") || st.Consecutive != 3 {
			t.Errorf("status %+v", st)
		}
		c, _ := newServiceNotRecovering(env)
		// Failed before the first restart, whose reset-failed alone left it
		// inactive: still failed (HidFailed), and not helped by its
		// repairs.
		if r, _ := c.Probe(context.Background()); r.Reason != report.ReasonUnitFailed ||
			!strings.HasPrefix(r.Message, "kubelet.service is failed (exit-code), left inactive by the repair's reset-failed") ||
			!strings.Contains(r.Message, "repaired 3+ times in a row") {
			t.Errorf("ServiceNotRecovering after 3 restarts that did not start kubelet: %+v", r)
		}
		// The unit kubelet needs starts again: the next restart, at the
		// cooldown, brings kubelet up.
		m.mu.Lock()
		m.fails = false
		m.mu.Unlock()
		results = results[:0]
		for range 6 {
			results = append(results, probe())
		}
		if got := strings.Join(results, " "); got != "cooldown cooldown cooldown cooldown cooldown restarted" {
			t.Errorf("once a restart can start it: %s", got)
		}
		if k, _ := m.Unit(context.Background(), "kubelet.service"); k.ActiveState != "active" {
			t.Errorf("kubelet.service %s/%s after the restart that worked", k.ActiveState, k.SubState)
		}
		// Someone stops it: left alone, as any stopped unit.
		time.Sleep(time.Minute)
		k, _ := m.Unit(context.Background(), "kubelet.service")
		k.ActiveState, k.SubState = "inactive", "dead"
		m.set(k)
		if res := probe(); res != RepairStopped {
			t.Errorf("stopped by someone after a restart that worked: %s, want %s", res, RepairStopped)
		}
		// Someone's stop replaces the daemon's restart job while it runs
		// (its result is "canceled"): the unit is theirs, left alone.
		k.ActiveState, k.SubState = "failed", "failed"
		m.set(k)
		m.mu.Lock()
		m.fails, m.result = true, "canceled"
		m.mu.Unlock()
		time.Sleep(time.Minute)
		if res := probe(); res != RepairRestarted {
			t.Fatalf("failed again: %s, want %s", res, RepairRestarted)
		}
		time.Sleep(time.Minute)
		if res := probe(); res != RepairStopped {
			t.Errorf("stopped by someone while the daemon's restart ran: %s, want %s", res, RepairStopped)
		}
	})
}

// kubelet runs but stays unhealthy: the daemon's third restart in a row
// sets RepairNotHelping, which only a probe that passes clears. The daemon
// itself restarts (an upgrade, its watchdog) within the boot: the repair
// status is kept in the state file, so the next run still says
// RepairNotHelping, and the restart count goes on from where it was,
// instead of ServiceNotRecovering turning False for the next 3 repairs
// while kubelet stays broken. A new boot starts over.
func TestRepairNotHelpingSurvivesDaemonRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		k := running("kubelet.service")
		k.MainStart = time.Now().Add(-time.Hour)
		m := newFakeManager(k, running("containerd.service"), running("syself-proxy.service"))
		type daemon struct {
			store *report.Store
			env   *Env
			check Check
		}
		start := func(boot string) daemon {
			t.Helper()
			d := daemon{store: report.NewStore(boot)}
			if _, err := d.store.Load(dir); err != nil {
				t.Fatal(err)
			}
			d.env = snrEnv(t, m)
			d.env.Repair.KeepIn(d.store)
			d.check, _ = newServiceNotRecovering(d.env)
			return d
		}
		snr := func(d daemon) Result {
			t.Helper()
			r, err := d.check.Probe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		repair := func(d daemon) string {
			res, _ := d.env.Repair.Repair(context.Background(), "kubelet.service", time.Minute, "healthz")
			d.env.Repair.Wait()
			return res
		}
		d1 := start("boot-1")
		for range 3 {
			if res := repair(d1); res != RepairRestarted {
				t.Fatalf("repair: %s", res)
			}
			time.Sleep(61 * time.Second)
		}
		if r := snr(d1); r.Reason != report.ReasonRepairNotHelping {
			t.Fatalf("after 3 repairs: %+v", r)
		}
		if err := d1.store.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}

		d2 := start("boot-1")
		if r := snr(d2); r.Reason != report.ReasonRepairNotHelping {
			t.Errorf("after the daemon's restart, kubelet still unhealthy: %s %s %q", r.Status, r.Reason, r.Message)
		}
		if st := d2.env.Repair.Status("kubelet.service"); st.Repairs != 3 || st.Consecutive != 3 || st.LastResult != "done" {
			t.Errorf("repair status after the daemon's restart: %+v", st)
		}
		if res := repair(d2); res != RepairRestarted {
			t.Fatalf("repair: %s", res)
		}
		if st := d2.env.Repair.Status("kubelet.service"); st.Repairs != 4 || st.Consecutive != 4 {
			t.Errorf("after a fourth repair: %+v", st)
		}
		d2.env.Repair.Healthy("kubelet.service")
		if r := snr(d2); r.Status != report.StatusFalse {
			t.Errorf("after a probe that passed: %+v", r)
		}
		if err := d2.store.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}
		d3 := start("boot-1")
		if r := snr(d3); r.Status != report.StatusFalse {
			t.Errorf("restarted after a probe that passed: %+v", r)
		}
		// The wall clock is then set back 30 minutes (the last repair, read
		// back as a wall-clock time, is in the future): that does not hold
		// the next repair off for half an hour.
		time.Sleep(time.Minute)
		d3.env.Repair.now = func() time.Time { return time.Now().Add(-30 * time.Minute).Round(0) }
		if res := repair(d3); res != RepairRestarted {
			t.Errorf("a minute after the last repair, the clock set back since: %s, want %s", res, RepairRestarted)
		}

		// A new boot: nothing of the last one's repairs.
		if st := start("boot-2").env.Repair.Status("kubelet.service"); st.Repairs != 0 || st.Consecutive != 0 {
			t.Errorf("repair status in a new boot: %+v", st)
		}
	})
}

// resultLost is a manager whose restart of one unit does restart it (a new
// invocation, running) but whose job result never reaches the daemon: the
// D-Bus connection dropped mid-job (systemd.ErrJobConnLost).
type resultLost struct{ *fakeManager }

func (m resultLost) Restart(ctx context.Context, name string) error {
	if err := m.fakeManager.Restart(ctx, name); err != nil {
		return err
	}
	return fmt.Errorf("restart %s: %w", name, systemd.ErrJobConnLost)
}

// A restart whose result was lost (the bus dropped mid-job) but that did
// start the unit is no restart that left the unit inactive: when someone
// stops the unit afterwards (the invocation systemd keeps after a stop is
// the one the restart started), the repair leaves it stopped. Before, the
// lost result counted as a failed restart of that invocation, and the
// operator's stop was undone at the next probe past the cooldown.
func TestRepairLeavesAUnitStoppedAfterARestartWhoseResultWasLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := resultLost{newFakeManager(u)}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
			t.Fatalf("first repair: %s", res)
		}
		r.Wait()
		if st := r.Status("kubelet.service"); !strings.Contains(st.LastResult, "connection lost") {
			t.Errorf("status after the lost result: %+v", st)
		}
		// The operator stops kubelet on purpose, past the cooldown.
		time.Sleep(2 * time.Minute)
		m.mu.Lock()
		s := m.units["kubelet.service"]
		s.ActiveState, s.SubState = "inactive", "dead"
		m.units["kubelet.service"] = s
		m.mu.Unlock()
		if res, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairStopped {
			t.Errorf("a unit stopped after a restart that started it: %s (%s), want %s", res, msg, RepairStopped)
		}
		r.Wait()
	})
}

// kubelet's restart by the daemon cannot start it (result "dependency"), and
// the daemon itself restarts then (an upgrade, its watchdog), within the
// boot: kubelet, inactive at the invocation the failed restart left, is
// still the repairer's, and is restarted again at the cooldown. Before, the
// state file kept the repairs but not that the last one left the unit
// inactive: the next daemon took kubelet for stopped on purpose ("a stopped
// unit is not started by the repair") and never repaired it again in this
// boot.
func TestRepairAfterItsOwnFailedRestartSurvivesDaemonRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		u := running("kubelet.service")
		u.ActiveState, u.SubState, u.Result, u.MainStart = "failed", "failed", "exit-code", time.Now().Add(-time.Hour)
		m := &dependencyFailing{fakeManager: newFakeManager(u), name: "kubelet.service", fails: true}
		start := func() (*report.Store, *Repairer) { return keptRepairer(t, m, dir) }
		st1, r1 := start()
		if res, _ := r1.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
			t.Fatalf("first repair: %s", res)
		}
		r1.Wait()
		if err := st1.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}
		// The daemon restarts; kubelet's dependency comes back.
		st2, r2 := start()
		m.mu.Lock()
		m.fails = false
		m.mu.Unlock()
		time.Sleep(time.Minute)
		if res, msg := r2.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
			t.Errorf("kubelet left inactive by the last daemon's failed restart, a cooldown later: %s (%s), want %s", res, msg, RepairRestarted)
		}
		r2.Wait()
		if err := st2.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}
		// Someone's stop after a restart that worked is still theirs,
		// across a daemon restart too.
		k, _ := m.Unit(context.Background(), "kubelet.service")
		k.ActiveState, k.SubState = "inactive", "dead"
		m.set(k)
		_, r3 := start()
		time.Sleep(time.Minute)
		if res, _ := r3.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairStopped {
			t.Errorf("stopped by someone after a restart that worked: %s, want %s", res, RepairStopped)
		}
	})
}

// gatedManager is a manager whose SystemState reads and restarts each wait
// for a token of the test's: a D-Bus call that takes its time.
type gatedManager struct {
	*fakeManager
	state, restart chan struct{}
}

func (m gatedManager) SystemState(ctx context.Context) (string, error) {
	<-m.state
	return m.fakeManager.SystemState(ctx)
}

func (m gatedManager) Restart(ctx context.Context, name string) error {
	<-m.restart
	return m.fakeManager.Restart(ctx, name)
}

// Two probes of kubelet at once (a reload replaced KubeletUnhealthy's check,
// and the old probe still runs beside the new one's) restart it once. Before,
// both passed the cooldown before either recorded its restart, and the
// second, its read of the system's state answered after the first restart
// ended, restarted kubelet again within the cooldown.
func TestRepairTwoProbesAtOnceRestartOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := gatedManager{newFakeManager(u), make(chan struct{}), make(chan struct{})}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		results := make([]string, 2)
		var wg sync.WaitGroup
		for i := range results {
			wg.Go(func() {
				results[i], _ = r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
			})
		}
		synctest.Wait()
		// One probe's restart runs to its end.
		m.state <- struct{}{}
		synctest.Wait()
		m.restart <- struct{}{}
		synctest.Wait()
		// Then the other's read of the system's state answers, if it made one.
		close(m.state)
		close(m.restart)
		wg.Wait()
		r.Wait()
		slices.Sort(results)
		if got := strings.Join(results, " "); got != RepairInProgress+" "+RepairRestarted {
			t.Errorf("two probes at once: %s, want one %s and one %s", got, RepairRestarted, RepairInProgress)
		}
		if n := m.restartCount(); n != 1 {
			t.Errorf("%d restarts by two probes at once within the cooldown, want 1", n)
		}
		if st := r.Status("kubelet.service"); st.Repairs != 1 || st.Consecutive != 1 || st.LastResult != "done" {
			t.Errorf("status %+v", st)
		}
		if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairCooldown {
			t.Errorf("the next probe: %s, want %s", res, RepairCooldown)
		}
	})
}

// A restart held off by a shutdown is not left claimed: once the shutdown
// is called off (its job canceled before the boot finished), the next probe
// restarts the unit, and does not find a restart in progress.
func TestRepairAfterAShutdownCalledOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := newFakeManager(u)
		m.setState("stopping")
		r := NewRepairer(m, quietLog(), time.Now, nil)
		if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairShutdown {
			t.Fatalf("while shutting down: %s", res)
		}
		m.setState("running")
		if res, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
			t.Errorf("after the shutdown was called off: %s (%s), want %s", res, msg, RepairRestarted)
		}
		r.Wait()
		if st := r.Status("kubelet.service"); st.Repairs != 1 {
			t.Errorf("status %+v", st)
		}
	})
}

// slowJob is a manager whose first restart of a unit starts a job that
// outlives the daemon's wait for it: the unit, hung, takes its whole
// TimeoutStopSec to stop, and is deactivating (stop-sigterm) at the
// invocation it had, with the restart job on it, when Restart returns. With
// lost set, Restart returns at once with systemd.ErrJobConnLost (the bus
// dropped mid-job); else it returns when its context ends, with the
// context's error, as DBus.Restart does. Its reads, as DBus's, fail once
// their context is done. end ends the job as systemd would.
type slowJob struct {
	*fakeManager
	lost bool
	done bool // the first restart was made: the next are fakeManager's
}

func (m *slowJob) Unit(ctx context.Context, name string) (systemd.Unit, error) {
	if err := ctx.Err(); err != nil {
		return systemd.Unit{}, fmt.Errorf("reading %s: %w", name, err)
	}
	return m.fakeManager.Unit(ctx, name)
}

func (m *slowJob) Restart(ctx context.Context, name string) error {
	m.mu.Lock()
	if m.done {
		m.mu.Unlock()
		return m.fakeManager.Restart(ctx, name)
	}
	m.done = true
	m.resets = append(m.resets, name)
	m.restarts = append(m.restarts, name)
	u := m.units[name]
	u.ActiveState, u.SubState, u.Job, u.JobType = "deactivating", "stop-sigterm", 77, "restart"
	m.units[name] = u
	m.mu.Unlock()
	if m.lost {
		return fmt.Errorf("restart %s: %w", name, systemd.ErrJobConnLost)
	}
	<-ctx.Done()
	return fmt.Errorf("restart %s: %w", name, ctx.Err())
}

// end ends the slow job: its start fails with result "dependency" (a unit
// the restarted one requires does not start), leaving the unit inactive at
// the invocation it had; or the start works (a new invocation, running).
func (m *slowJob) end(name string, started bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.units[name]
	u.Job, u.JobType = 0, ""
	if !started {
		u.ActiveState, u.SubState, u.Result = "inactive", "dead", "success"
	} else {
		m.seq++
		u.ActiveState, u.SubState, u.NRestarts, u.MainStart = "active", "running", 0, time.Now()
		u.Invocation = fmt.Sprintf("%s-manual-%d", name, m.seq)
	}
	m.units[name] = u
}

// A restart job whose result does not come while it still runs in systemd
// (a hung kubelet's stop takes its TimeoutStopSec, longer than the daemon's
// 5 min wait; or the bus drops mid-job): the job goes on, and either its
// start fails with result "dependency", leaving kubelet inactive at the
// invocation it had, which is the daemon's doing and restarted at the
// cooldown as after any restart that could not start it; or it starts
// kubelet, and a stop after that is someone's, left alone. Before, the
// read of the unit after a wait that ran out used the wait's expired
// context, and the operator read only "context deadline exceeded"; and
// where the bus dropped while kubelet was still stopping, deactivating
// counted as running, and kubelet, left inactive by the job's failed
// start, was never repaired again ("a stopped unit is not started").
func TestRepairWhenTheRestartJobOutlivesItsWait(t *testing.T) {
	for _, tc := range []struct {
		name          string
		lost, started bool
		wantResult    string
		want          string // the status's LastResult and the log's err
	}{
		{"wait ran out, start failed", false, false, RepairRestarted,
			"failed: kubelet.service: the restart job did not finish within 5m0s (it may still be running)"},
		{"wait ran out, started, stopped by someone", false, true, RepairStopped,
			"failed: kubelet.service: the restart job did not finish within 5m0s (it may still be running)"},
		{"bus dropped, start failed", true, false, RepairRestarted,
			"failed: restart kubelet.service: " + systemd.ErrJobConnLost.Error()},
		{"bus dropped, started, stopped by someone", true, true, RepairStopped,
			"failed: restart kubelet.service: " + systemd.ErrJobConnLost.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const unit = "kubelet.service"
				u := running(unit)
				u.MainStart = time.Now().Add(-time.Hour)
				m := &slowJob{fakeManager: newFakeManager(u), lost: tc.lost}
				var logs bytes.Buffer
				r := NewRepairer(m, slog.New(slog.NewTextHandler(&logs, nil)), time.Now, nil)
				r.SetUnitWatch(NewUnitWatch(nil, nil))
				probe := func() (string, string) {
					t.Helper()
					return r.Repair(context.Background(), unit, time.Minute, "healthz failed")
				}
				if res, msg := probe(); res != RepairRestarted {
					t.Fatalf("first probe: %s (%s)", res, msg)
				}
				r.Wait()
				if st := r.Status(unit); st.LastResult != tc.want {
					t.Errorf("status after the wait ended: %q, want %q", st.LastResult, tc.want)
				}
				if want := strings.TrimPrefix(tc.want, "failed: "); !strings.Contains(logs.String(), want) {
					t.Errorf("log after the wait ended:\n%s\nwant %q in it", logs.String(), want)
				}
				// The job still runs: the unit is systemd's.
				if res, msg := probe(); res != RepairSystemd {
					t.Errorf("while the job still stops kubelet: %s (%s), want %s", res, msg, RepairSystemd)
				}
				time.Sleep(2 * time.Minute)
				m.end(unit, tc.started)
				if tc.started {
					// Running, unhealthy, within the cooldown of its start;
					// then someone stops it.
					if res, msg := probe(); res != RepairCooldown {
						t.Errorf("started by the job: %s (%s), want %s", res, msg, RepairCooldown)
					}
					time.Sleep(2 * time.Minute)
					k, _ := m.Unit(context.Background(), unit)
					k.ActiveState, k.SubState = "inactive", "dead"
					m.set(k)
				}
				time.Sleep(time.Minute)
				if res, msg := probe(); res != tc.wantResult {
					t.Errorf("after the job ended: %s (%s), want %s", res, msg, tc.wantResult)
				}
				r.Wait()
				if tc.wantResult == RepairRestarted {
					if k, _ := m.Unit(context.Background(), unit); k.ActiveState != "active" {
						t.Errorf("%s %s/%s after the repair", unit, k.ActiveState, k.SubState)
					}
				}
			})
		})
	}
}

// Someone's stop that does not end cleanly (killed at its TimeoutStopSec:
// result "timeout") leaves the unit failed at the invocation the stop job
// was seen on: not restarted, as an inactive unit is not. A stop called off
// (the unit read running again, no job, at that invocation) is forgotten: a
// failure of that invocation later is the repairer's.
func TestRepairLeavesAStopThatEndedFailedAloneFake(t *testing.T) {
	u := running("kubelet.service")
	u.MainStart = time.Now().Add(-time.Hour)
	m := newFakeManager(u)
	now := time.Now()
	r := NewRepairer(m, quietLog(), func() time.Time { return now }, nil)
	repair := func() string {
		res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
		r.Wait()
		return res
	}
	stopping := u
	stopping.ActiveState, stopping.SubState, stopping.Job, stopping.JobType = "deactivating", "stop-sigterm", 7, "stop"
	m.set(stopping)
	if res := repair(); res != RepairUnitStopping {
		t.Fatalf("during the stop: %s", res)
	}
	failed := u
	failed.ActiveState, failed.SubState, failed.Result = "failed", "failed", "timeout"
	m.set(failed)
	if res := repair(); res != RepairStopped || m.restartCount() != 0 {
		t.Errorf("a stop that ended failed: %s, %d restarts; want %s, none", res, m.restartCount(), RepairStopped)
	}
	// A daemon restarted since (its state file) leaves it alone too.
	dir := t.TempDir()
	st1 := report.NewStore("boot-1")
	if _, err := st1.Load(dir); err != nil {
		t.Fatal(err)
	}
	r1 := NewRepairer(m, quietLog(), time.Now, nil)
	r1.KeepIn(st1)
	m.set(stopping)
	r1.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
	if err := st1.Save(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	st2 := report.NewStore("boot-1")
	if _, err := st2.Load(dir); err != nil {
		t.Fatal(err)
	}
	r2 := NewRepairer(m, quietLog(), time.Now, nil)
	r2.KeepIn(st2)
	m.set(failed)
	if res, _ := r2.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairStopped || m.restartCount() != 0 {
		t.Errorf("after a daemon restart: %s, %d restarts; want %s, none", res, m.restartCount(), RepairStopped)
	}
	r2.Wait()
	// The stop called off: read running, no job, at the same invocation
	// (a probe that fails then restarts it), and that invocation failing
	// later, past the cooldown.
	m.set(stopping)
	repair()
	m.set(u)
	if res := repair(); res != RepairRestarted {
		t.Fatalf("running again: %s", res)
	}
	now = now.Add(2 * time.Minute)
	m.set(failed)
	if res := repair(); res != RepairRestarted || m.restartCount() != 2 {
		t.Errorf("a failure after a stop called off: %s, %d restarts; want %s, 2", res, m.restartCount(), RepairRestarted)
	}
}

// A unit read between the halves of a restart (its stop done, inactive or
// failed when the stop did not end cleanly, and the start job the restart
// turned into still to run; TestARestartBetweenItsHalvesIsComingBack in
// tests/ reads it so from systemd 252), or in its stop half, is coming
// back: NodeServiceDown is Unknown, not True; ServiceNotRecovering does
// not count it failed; the repairer leaves it to systemd's start, neither
// taking a stop that ended failed for someone's stop nor restarting it.
func TestARestartBetweenItsHalvesIsComingBackFake(t *testing.T) {
	ctx := context.Background()
	for _, st := range []struct{ active, sub, result, job string }{
		{"inactive", "dead", "success", "start"},
		{"failed", "failed", "exit-code", "start"},
		{"failed", "failed", "timeout", "restart"},
		{"deactivating", "stop-sigterm", "success", "restart"},
	} {
		what := fmt.Sprintf("%s/%s, result %s, %s job", st.active, st.sub, st.result, st.job)
		for _, notify := range []string{"none", "main"} {
			// Its last stop as a stop's: left active, then its process exited.
			u := running("kubelet.service")
			u.ActiveState, u.SubState, u.Result, u.Job, u.JobType = st.active, st.sub, st.result, 7, st.job
			u.NotifyAccess, u.MainStartMono, u.ActiveExitMono, u.MainExitMono = notify, time.Second, 2*time.Second, 3*time.Second
			m := newFakeManager(u, running("containerd.service"), running("syself-proxy.service"))
			r := NewRepairer(m, quietLog(), time.Now, nil)
			r.sinceBoot = func() time.Duration { return time.Hour }
			res, msg := r.Repair(ctx, "kubelet.service", time.Millisecond, "healthz failed")
			r.Wait()
			want := RepairStarting
			if st.active == "deactivating" {
				want = RepairSystemd
			}
			if res != want || m.restartCount() != 0 {
				t.Errorf("repair, %s, NotifyAccess=%s: %s %q, %d restarts; want %s and none", what, notify, res, msg, m.restartCount(), want)
			}
			snr, _ := newServiceNotRecovering(snrEnv(t, m))
			if res, err := snr.Probe(ctx); err != nil || res.Status == report.StatusTrue {
				t.Errorf("ServiceNotRecovering, %s: %s %q (%v), want not True", what, res.Status, res.Message, err)
			}
		}
		a := running("syself-tunnel-agent.service")
		a.ActiveState, a.SubState, a.Result, a.Job, a.JobType = st.active, st.sub, st.result, 7, st.job
		env := testEnv(t, nil)
		env.Systemd = newFakeManager(a)
		nsd, _ := newNodeServiceDown(env)
		wantMsg := fmt.Sprintf("syself-tunnel-agent.service is being started (%s/%s, %s job queued)", st.active, st.sub, st.job)
		if res, err := nsd.Probe(ctx); err != nil || res.Status != report.StatusUnknown || res.Reason != report.ReasonNoData || res.Message != wantMsg {
			t.Errorf("NodeServiceDown, %s: %s %s %q (%v), want Unknown NoData %q", what, res.Status, res.Reason, res.Message, err, wantMsg)
		}
	}
	// A unit read coming back, run after run, for comingBackLimit (a start
	// job that never ends) is down.
	{
		a := running("syself-tunnel-agent.service")
		a.ActiveState, a.SubState, a.Job, a.JobType = "activating", "start", 7, "start"
		now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
		env := testEnv(t, nil)
		env.Now = func() time.Time { return now }
		env.Systemd = newFakeManager(a)
		nsd, _ := newNodeServiceDown(env)
		for _, step := range []struct {
			after time.Duration
			want  report.Status
		}{{0, report.StatusUnknown}, {comingBackLimit - time.Second, report.StatusUnknown}, {time.Second, report.StatusTrue}} {
			now = now.Add(step.after)
			if res, err := nsd.Probe(ctx); err != nil || res.Status != step.want {
				t.Errorf("NodeServiceDown, starting for %s: %s %q (%v), want %s", now.Sub(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)), res.Status, res.Message, err, step.want)
			} else if step.want == report.StatusTrue && res.Message != "syself-tunnel-agent.service has been starting since 2026-12-05T12:00:00Z (activating/start, start job queued)" {
				t.Errorf("NodeServiceDown, starting too long: %q", res.Message)
			}
		}
		// Read active once: the count starts again.
		a.ActiveState, a.SubState, a.Job, a.JobType = "active", "running", 0, ""
		env.Systemd.(*fakeManager).set(a)
		nsd.Probe(ctx)
		a.ActiveState, a.SubState, a.Job, a.JobType = "activating", "start", 8, "start"
		env.Systemd.(*fakeManager).set(a)
		if res, err := nsd.Probe(ctx); err != nil || res.Status != report.StatusUnknown {
			t.Errorf("NodeServiceDown, starting again after it ran: %s %q (%v), want Unknown", res.Status, res.Message, err)
		}
	}
	// Another unit down is still True, the one coming back left out of it.
	a := running("syself-tunnel-agent.service")
	a.ActiveState, a.SubState, a.Job, a.JobType = "inactive", "dead", 7, "start"
	b := running("syself-source-ip.service")
	b.ActiveState, b.SubState = "inactive", "dead"
	env := testEnv(t, func(c *config.Config) {
		c.Checks.NodeServiceDown.WorkerUnits = []string{a.Name, b.Name}
	})
	env.Systemd = newFakeManager(a, b)
	nsd, _ := newNodeServiceDown(env)
	if res, err := nsd.Probe(ctx); err != nil || res.Status != report.StatusTrue || res.Message != "syself-source-ip.service is not active (inactive/dead)" {
		t.Errorf("NodeServiceDown, one down and one coming back: %s %q (%v)", res.Status, res.Message, err)
	}
}
