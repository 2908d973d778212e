package checks

import (
	"context"
	"errors"
	"fmt"
	godbus "github.com/godbus/dbus/v5"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// jobPhase is the unit as systemd shows it from `from` after a restart job
// was taken until the next phase.
type jobPhase struct {
	from                     time.Duration
	active, sub, jobType     string
	newInvocation, mainStart bool // at a new invocation; its process started at from
}

// timedJob is a manager whose first restart systemd takes but whose answer
// is lost (systemd re-executed: systemd.ErrJobReplyLost, returned at once)
// or held (block: the restart's caller waits until the test releases it);
// the job then goes on by phases, on the (fake) clock. Later restarts are
// fakeManager's.
type timedJob struct {
	*fakeManager
	phases  []jobPhase
	block   chan struct{} // nil: the answer is lost at once
	started time.Time     // when the first restart was taken; zero: not yet
	inv     string        // the invocation before it
	taken   []time.Time   // when each restart was requested
	// stopFailed: the job's stop did not end cleanly (killed at its
	// TimeoutStopSec): a failed phase ends with result "timeout", the unit
	// having left active at the job's start, its process exited at the
	// phase's.
	stopFailed *stopFailure
}

type stopFailure struct{ boot time.Time }

func (m *timedJob) Unit(ctx context.Context, name string) (systemd.Unit, error) {
	m.mu.Lock()
	if !m.started.IsZero() && name == "kubelet.service" {
		m.phaseUnitLocked(name)
	}
	m.mu.Unlock()
	return m.fakeManager.Unit(ctx, name)
}

// phaseUnitLocked moves the unit to the phase of the job the clock is in,
// unless a later restart (fakeManager's) moved it on.
func (m *timedJob) phaseUnitLocked(name string) {
	u := m.units[name]
	if len(m.taken) > 1 {
		return
	}
	el := time.Since(m.started)
	var p jobPhase
	for _, q := range m.phases {
		if el >= q.from {
			p = q
		}
	}
	u.ActiveState, u.SubState, u.JobType = p.active, p.sub, p.jobType
	u.Job = 0
	if p.jobType != "" {
		u.Job = 7
	}
	u.Invocation = m.inv
	if p.newInvocation {
		u.Invocation = m.inv + "-job"
	}
	if p.mainStart {
		u.MainStart, u.NRestarts = m.started.Add(p.from), 0
		if u.MainStartMono > 0 {
			u.MainStartMono = u.MainStart.Sub(m.startedBoot())
		}
	}
	if m.stopFailed != nil && p.active == "failed" {
		u.Result = "timeout"
		u.ActiveExitMono = m.started.Sub(m.stopFailed.boot)
		u.MainExitMono = m.started.Add(p.from).Sub(m.stopFailed.boot)
	}
	m.units[name] = u
}

// startedBoot is the boot's start on the fake clock, where the test set
// one (stopFailed), else the zero time.
func (m *timedJob) startedBoot() time.Time {
	if m.stopFailed != nil {
		return m.stopFailed.boot
	}
	return time.Time{}
}

func (m *timedJob) Restart(ctx context.Context, name string) error {
	m.mu.Lock()
	m.taken = append(m.taken, time.Now())
	if len(m.taken) > 1 {
		m.mu.Unlock()
		return m.fakeManager.Restart(ctx, name)
	}
	m.started, m.inv = time.Now(), m.units[name].Invocation
	m.resets = append(m.resets, name)
	m.restarts = append(m.restarts, name)
	m.phaseUnitLocked(name)
	block := m.block
	m.mu.Unlock()
	if block != nil {
		<-block
		return nil
	}
	return fmt.Errorf("restart %s: %w", name, systemd.ErrJobReplyLost)
}

func (m *timedJob) requests() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.taken...)
}

// Restart jobs as systemd runs them, from the moment it takes one.
var (
	// A restart of a kubelet that stops in 3 s and starts in 5 s.
	quickRestart = []jobPhase{
		{0, "deactivating", "stop-sigterm", "restart", false, false},
		{3 * time.Second, "inactive", "dead", "start", false, false},
		{5 * time.Second, "activating", "start-pre", "start", true, true},
		{8 * time.Second, "active", "running", "", true, true},
	}
	// A hung kubelet killed at its TimeoutStopSec (90 s): failed, then
	// started.
	hungStop = []jobPhase{
		{0, "deactivating", "stop-sigterm", "restart", false, false},
		{90 * time.Second, "failed", "failed", "start", false, false},
		{92 * time.Second, "active", "running", "", true, true},
	}
	// Its start fails (a unit it requires does not start): result
	// "dependency", the unit left inactive at the invocation it had.
	startFails = []jobPhase{
		{0, "deactivating", "stop-sigterm", "restart", false, false},
		{3 * time.Second, "inactive", "dead", "start", false, false},
		{20 * time.Second, "inactive", "dead", "", false, false},
	}
)

// A restart systemd took while it re-executed (its answer lost:
// ErrJobReplyLost, which ends the repairer's wait at once, the job still
// running) is not made again while the job runs, nor within the cooldown of
// the request or of the start the job made: probed every 10 s with kubelet
// unhealthy throughout, in each way the job can go on (a quick restart, a
// stop that takes 90 s, a start that fails). The job's unit is never taken
// for one someone stopped, and one the job left inactive is restarted at the
// cooldown of the request.
func TestRepairAfterARestartWhoseReplyWasLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		phases []jobPhase
		// want: the results of the probes, every 10 s from the first.
		want string
	}{
		{"quick restart", quickRestart,
			"restarted cooldown cooldown cooldown cooldown cooldown cooldown restarted cooldown cooldown cooldown cooldown cooldown restarted"},
		{"hung stop", hungStop,
			"restarted systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting unit-starting cooldown cooldown cooldown cooldown cooldown cooldown restarted"},
		{"start fails", startFails,
			"restarted unit-starting cooldown cooldown cooldown cooldown restarted cooldown cooldown cooldown cooldown cooldown restarted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				u := running("kubelet.service")
				u.MainStart = time.Now().Add(-time.Hour)
				m := &timedJob{fakeManager: newFakeManager(u), phases: tc.phases}
				r := NewRepairer(m, quietLog(), time.Now, nil)
				r.SetUnitWatch(NewUnitWatch(nil, nil))
				begin := time.Now()
				var results []string
				for range len(strings.Fields(tc.want)) {
					res, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
					r.Wait()
					if res == RepairStopped {
						t.Errorf("at %s: %s (%s): the job's unit taken for one someone stopped", time.Since(begin), res, msg)
					}
					results = append(results, res)
					time.Sleep(10 * time.Second)
				}
				if got := strings.Join(results, " "); got != tc.want {
					t.Errorf("probes every 10 s:\n%s\nwant:\n%s", got, tc.want)
				}
				taken := m.requests()
				for i := 1; i < len(taken); i++ {
					if d := taken[i].Sub(taken[i-1]); d < time.Minute {
						t.Errorf("restart %d %s after the one before, within the 1m cooldown", i+1, d)
					}
				}
			})
		})
	}
}

// The daemon itself restarts (an upgrade's `systemctl restart
// autopilot-health`, a crash) while its restart job of kubelet runs: the
// old daemon's state file was saved with the restart requested, its result
// never came to it. The new daemon reads kubelet mid-job and after, probed
// every 10 s with kubelet unhealthy: it restarts kubelet neither while the
// job runs nor within the cooldown of the old daemon's request (kept in the
// state file) or of the job's start; and a job whose start fails (result
// "dependency": a unit kubelet requires does not start), leaving kubelet
// inactive at the invocation it had, or failed where its stop did not end
// cleanly (killed at TimeoutStopSec: result "timeout"), is the repairer's:
// restarted at the cooldown, not taken for an operator's stop and left down.
func TestRepairAfterTheDaemonRestartedMidJob(t *testing.T) {
	// A stop killed at its TimeoutStopSec (90 s) whose start then fails:
	// failed, result "timeout", left active before its process exited.
	stopFailedStartFails := []jobPhase{
		{0, "deactivating", "stop-sigterm", "restart", false, false},
		{90 * time.Second, "failed", "failed", "start", false, false},
		{92 * time.Second, "failed", "failed", "", false, false},
	}
	for _, tc := range []struct {
		name   string
		phases []jobPhase
		// want: the new daemon's probes, every 10 s from 10 s after the
		// old daemon's request.
		want string
	}{
		{"quick restart", quickRestart,
			"cooldown cooldown cooldown cooldown cooldown cooldown restarted"},
		{"start fails", startFails,
			"unit-starting cooldown cooldown cooldown cooldown restarted"},
		{"stop ended failed, start fails", stopFailedStartFails,
			"systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting systemd-restarting unit-starting restarted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				boot := time.Now().Add(-2 * time.Hour)
				u := running("kubelet.service")
				u.MainStart = time.Now().Add(-time.Hour)
				u.MainStartMono = u.MainStart.Sub(boot)
				u.NotifyAccess = "none"
				m := &timedJob{fakeManager: newFakeManager(u), phases: tc.phases, block: make(chan struct{})}
				if strings.Contains(tc.name, "stop ended failed") {
					m.stopFailed = &stopFailure{boot: boot}
				}
				start := func() (*report.Store, *Repairer) {
					t.Helper()
					st := report.NewStore("boot-1")
					if _, err := st.Load(dir); err != nil {
						t.Fatal(err)
					}
					r := NewRepairer(m, quietLog(), time.Now, nil)
					r.sinceBoot = func() time.Duration { return time.Since(boot) }
					r.KeepIn(st)
					return st, r
				}
				st1, r1 := start()
				if res, msg := r1.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
					t.Fatalf("the old daemon's repair: %s (%s)", res, msg)
				}
				// The old daemon stops with its restart's result to come:
				// its last save.
				synctest.Wait()
				if err := st1.Save(dir, time.Now()); err != nil {
					t.Fatal(err)
				}
				_, r2 := start()
				var results []string
				for range len(strings.Fields(tc.want)) {
					time.Sleep(10 * time.Second)
					res, msg := r2.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
					r2.Wait()
					if res == RepairStopped {
						t.Errorf("at %s: %s (%s): the old daemon's restart job taken for someone's stop", time.Since(m.started), res, msg)
					}
					results = append(results, res)
				}
				if got := strings.Join(results, " "); got != tc.want {
					t.Errorf("the new daemon's probes every 10 s:\n%s\nwant:\n%s", got, tc.want)
				}
				taken := m.requests()
				for i := 1; i < len(taken); i++ {
					if d := taken[i].Sub(taken[i-1]); d < time.Minute {
						t.Errorf("restart %d %s after the one before, within the 1m cooldown", i+1, d)
					}
				}
				close(m.block)
				r1.Wait()
			})
		})
	}
}

// An operator's `systemctl stop kubelet` replaces the repairer's restart job
// while its result is not to come to the daemon that probes (the daemon
// itself restarted mid-job, the old one's request and mark in the state
// file; or the job's answer lost, ErrJobReplyLost): the repairer's mark at
// the request, the unit's invocation then, still names the invocation the
// stop leaves kubelet inactive at. A probe saw that stop job (a restart job
// shows as "restart", then "start", never "stop"): the stop is the
// operator's, and kubelet stays stopped, not restarted at the cooldown.
func TestRepairLeavesAStopThatReplacedItsJobAlone(t *testing.T) {
	// The restart job stops kubelet slowly; at 15 s the operator's stop
	// replaces it (result "canceled", told to no one), and kubelet is
	// stopped at 25 s.
	replaced := []jobPhase{
		{0, "deactivating", "stop-sigterm", "restart", false, false},
		{15 * time.Second, "deactivating", "stop-sigterm", "stop", false, false},
		{25 * time.Second, "inactive", "dead", "", false, false},
	}
	for _, restarted := range []bool{true, false} {
		name := "the daemon restarted mid-job"
		if !restarted {
			name = "the job's answer lost"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dir := t.TempDir()
				u := running("kubelet.service")
				u.MainStart = time.Now().Add(-time.Hour)
				m := &timedJob{fakeManager: newFakeManager(u), phases: replaced}
				if restarted {
					m.block = make(chan struct{})
				}
				start := func() (*report.Store, *Repairer) { return keptRepairer(t, m, dir) }
				st1, r1 := start()
				if res, msg := r1.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
					t.Fatalf("the repair: %s (%s)", res, msg)
				}
				r := r1
				if restarted {
					synctest.Wait()
					if err := st1.Save(dir, time.Now()); err != nil {
						t.Fatal(err)
					}
					_, r = start()
				} else {
					r1.Wait()
				}
				var results []string
				for range 12 {
					time.Sleep(10 * time.Second)
					res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
					r.Wait()
					results = append(results, res)
				}
				want := "systemd-restarting unit-stopping unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped"
				if got := strings.Join(results, " "); got != want {
					t.Errorf("probes every 10 s after the request:\n%s\nwant:\n%s", got, want)
				}
				if n := len(m.requests()); n != 1 {
					t.Errorf("%d restarts requested, want 1: the operator's stop fought", n)
				}
				if restarted {
					close(m.block)
					r1.Wait()
				}
			})
		})
	}
}

// refusingStop is a manager whose restart systemd refuses: an operator's
// `systemctl stop kubelet` was queued between the repairer's read and its
// request (mode "fail": ErrJobRefused, no job made), and the stop is done
// by the time the repairer reads the unit after the refusal.
type refusingStop struct{ *fakeManager }

func (m refusingStop) Restart(_ context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restarts = append(m.restarts, name)
	u := m.units[name]
	u.ActiveState, u.SubState = "inactive", "dead"
	m.units[name] = u
	return fmt.Errorf("restart %s: %w: %w", name, systemd.ErrJobRefused, destructive(fmt.Sprintf("Transaction for %s/restart is destructive (%s has 'stop' job queued, but 'restart' is included in transaction).", name, name)))
}

// destructive is systemd's answer to a request in mode "fail" that would
// cancel a stop job queued, as systemd 252 sends it.
func destructive(msg string) godbus.Error {
	return godbus.Error{Name: "org.freedesktop.systemd1.TransactionIsDestructive", Body: []any{msg}}
}

// A restart request systemd refused because an operator's stop was queued
// made no job: kubelet, running when it was requested and stopped by that
// stop, is the operator's, left stopped, not restarted at the cooldown as
// one the repairer's failed restart left inactive.
func TestRepairAfterARefusedRestartLeavesTheOperatorsStopAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := refusingStop{newFakeManager(u)}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		got := probesEvery10s(r, 10)
		want := "restarted unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped"
		if got != want {
			t.Errorf("probes every 10 s:\n%s\nwant:\n%s", got, want)
		}
		if n := len(m.restarts); n != 1 {
			t.Errorf("%d restarts requested, want 1: the operator's stop fought", n)
		}
	})
}

// scriptedRestarts is a manager whose restarts end, in turn, as errs says
// (nil: fakeManager's restart); one that ends with a *systemd.JobError
// leaves the unit inactive at its invocation (its stop done, its start
// failed), one that ends otherwise does not move it.
type scriptedRestarts struct {
	*fakeManager
	errs []error
}

func (m *scriptedRestarts) Restart(ctx context.Context, name string) error {
	m.mu.Lock()
	n := len(m.restarts)
	if n >= len(m.errs) || m.errs[n] == nil {
		m.mu.Unlock()
		return m.fakeManager.Restart(ctx, name)
	}
	m.restarts = append(m.restarts, name)
	var je *systemd.JobError
	if errors.As(m.errs[n], &je) {
		u := m.units[name]
		u.ActiveState, u.SubState = "inactive", "dead"
		m.units[name] = u
	}
	m.mu.Unlock()
	return m.errs[n]
}

// The repairer's restart of kubelet failed (result "dependency": containerd,
// which it requires, did not start) and left it inactive: its to restart at
// the cooldown. The operator then stops containerd for maintenance
// (`systemctl stop containerd`, its stop job queued), and the repairer's
// next restart, which would start containerd again, is refused (mode
// "fail", ErrJobRefused). That refusal made no job and left nothing: kubelet,
// inactive at the same invocation, is no longer the repairer's, and is not
// restarted again at the next cooldown (which would start containerd against
// the operator's stop).
func TestRepairAfterARefusedRetryOfAnInactiveUnitStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := &scriptedRestarts{fakeManager: newFakeManager(u), errs: []error{
			&systemd.JobError{Unit: "kubelet.service", Result: "dependency"},
			fmt.Errorf("restart kubelet.service: %w: %w", systemd.ErrJobRefused, destructive("Transaction for kubelet.service/restart is destructive (containerd.service has 'stop' job queued, but 'start' is included in transaction).")),
		}}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		got := probesEvery10s(r, 16)
		want := "restarted cooldown cooldown cooldown cooldown cooldown restarted unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped unit-stopped"
		if got != want {
			t.Errorf("probes every 10 s:\n%s\nwant:\n%s", got, want)
		}
		if n := len(m.restarts); n != 2 {
			t.Errorf("%d restarts requested, want 2: the operator's stop of containerd fought", n)
		}
	})
}

// The repairer's restart of kubelet failed (result "dependency": containerd
// did not start) and left it inactive: its to restart at the cooldown. Its
// retry is refused by systemd for a reason that is no one's stop:
// containerd's unit cannot be loaded for a while (masked, or removed and
// installed again by a package switch: "Unit containerd.service is masked.",
// org.freedesktop.systemd1.UnitMasked, as systemd 252 answers). That refusal
// made no job, and no one stopped kubelet: it stays the repairer's, retried
// at the next cooldown (and restarted once containerd loads again), not
// left down for good as a unit someone stopped.
func TestRepairRetriesARefusalThatIsNoStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := &scriptedRestarts{fakeManager: newFakeManager(u), errs: []error{
			&systemd.JobError{Unit: "kubelet.service", Result: "dependency"},
			fmt.Errorf("restart kubelet.service: %w: %w", systemd.ErrJobRefused, godbus.Error{Name: "org.freedesktop.systemd1.UnitMasked", Body: []any{"Unit containerd.service is masked."}}),
		}}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		var results []string
		for range 13 {
			res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
			r.Wait()
			results = append(results, res)
			time.Sleep(10 * time.Second)
		}
		want := "restarted cooldown cooldown cooldown cooldown cooldown restarted cooldown cooldown cooldown cooldown cooldown restarted"
		if got := strings.Join(results, " "); got != want {
			t.Errorf("probes every 10 s:\n%s\nwant:\n%s", got, want)
		}
		if n := len(m.restarts); n != 3 {
			t.Errorf("%d restarts requested, want 3: kubelet left down after a refusal that was no one's stop", n)
		}
		if got, err := m.Unit(context.Background(), "kubelet.service"); err != nil || got.ActiveState != "active" {
			t.Errorf("kubelet at the end: %+v, %v; want active", got, err)
		}
	})
}
