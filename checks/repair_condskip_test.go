package checks

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// skippingStart is a manager whose restarts start nothing, as systemd 252
// does for a unit with a Condition…= not met (the job's result "done") or
// an Assert…= that fails (result "assert"): its stop half leaves the unit
// inactive at the invocation it had, with the condition's words (as
// TestRepairOfAUnitWhoseConditionIsNotMet in tests/ reads them from
// systemd). met makes the next restart start it.
type skippingStart struct {
	*fakeManager
	mu              sync.Mutex
	skipped, assert string
	met             bool
}

func (m *skippingStart) Restart(ctx context.Context, name string) error {
	m.mu.Lock()
	met, skipped, assert := m.met, m.skipped, m.assert
	m.mu.Unlock()
	if met {
		return m.fakeManager.Restart(ctx, name)
	}
	m.fakeManager.mu.Lock()
	defer m.fakeManager.mu.Unlock()
	m.restarts = append(m.restarts, name)
	u := m.units[name]
	u.ActiveState, u.SubState, u.Result, u.Skipped, u.AssertFailed = "inactive", "dead", "success", skipped, assert
	m.units[name] = u
	if assert != "" {
		return &systemd.JobError{Unit: name, Result: "assert"}
	}
	return nil
}

func (m *skippingStart) meet() { m.mu.Lock(); m.met = true; m.mu.Unlock() }

// warnLog is a logger whose warnings and errors a test reads.
func warnLog() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&lockedWriter{w: &b}, &slog.HandlerOptions{Level: slog.LevelWarn})), &b
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A restart that systemd skips because a Condition…= of the unit is not met
// (kubelet's ConditionPathExists=/usr/bin/kubelet after a botched upgrade)
// ends "done" with nothing started. It is no restart: logged at warning
// naming the condition, counted failed (beside restarted: systemd took the
// job, whose stop half stopped the running kubelet), the status's last
// result says skipped and why, the condition's message says so, the same
// words at every probe, and the unit stays the repairer's: restarted again
// at each cooldown, never in between. Before, it was logged and kept as a
// restart that worked ("done"), and the unit then left inactive was taken
// for one someone stopped: never restarted again, and ServiceNotRecovering
// never named it.
func TestRepairOfAUnitWhoseStartSystemdSkips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := &skippingStart{fakeManager: newFakeManager(u, running("containerd.service"), running("syself-proxy.service")), skipped: "ConditionPathExists=/usr/bin/kubelet"}
		log, logged := warnLog()
		r := NewRepairer(m, log, time.Now, nil)
		var results, msgs []string
		for range 13 { // 2 minutes of probes every 10 s
			res, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
			r.Wait()
			results, msgs = append(results, res), append(msgs, msg)
			time.Sleep(10 * time.Second)
		}
		want := "restarted cooldown cooldown cooldown cooldown cooldown restarted cooldown cooldown cooldown cooldown cooldown restarted"
		if got := strings.Join(results, " "); got != want {
			t.Errorf("results:\n%s\nwant:\n%s", got, want)
		}
		if n := m.restartCount(); n != 3 {
			t.Errorf("%d restarts in 2 minutes with a 1-minute cooldown, want 3", n)
		}
		const skipMsg = "systemd skipped the start of kubelet.service: ConditionPathExists=/usr/bin/kubelet not met; restarting it at most once per 1m0s"
		if msgs[0] != repairingMessage("kubelet.service", time.Minute) {
			t.Errorf("the first restart's message (kubelet running): %q", msgs[0])
		}
		for i, msg := range msgs[1:] {
			if msg != skipMsg {
				t.Errorf("probe %d: message %q, want %q", i+2, msg, skipMsg)
			}
		}
		st := r.Status("kubelet.service")
		if want := "skipped: ConditionPathExists=/usr/bin/kubelet not met"; st.LastResult != want || st.Consecutive != 3 {
			t.Errorf("status: last result %q, %d in a row; want %q, 3", st.LastResult, st.Consecutive, want)
		}
		restarted := testutil.ToFloat64(r.repairs.WithLabelValues("kubelet.service", RepairRestarted))
		failed := testutil.ToFloat64(r.repairs.WithLabelValues("kubelet.service", RepairFailed))
		if restarted != 3 || failed != 3 {
			t.Errorf("repairs_total: restarted %v, failed %v; want 3 and 3", restarted, failed)
		}
		out := logged.String()
		if c := strings.Count(out, "level=WARN msg=\"repair: systemd skipped the start of the unit"); c != 3 || !strings.Contains(out, `condition="ConditionPathExists=/usr/bin/kubelet"`) || strings.Contains(out, "repair: restarted unit") {
			t.Errorf("log (%d skip warnings, want 3, naming the condition, no restart):\n%s", c, out)
		}

		// ServiceNotRecovering: three restarts that started nothing are
		// RepairNotHelping, naming the condition.
		env := testEnv(t, nil)
		env.Systemd, env.Repair, env.Units = m, r, NewUnitWatch(nil, nil)
		c, _ := newServiceNotRecovering(env)
		res, err := c.Probe(context.Background())
		wantMsg := "kubelet.service was repaired 3+ times in a row and is still unhealthy (systemd skipped the start of kubelet.service: ConditionPathExists=/usr/bin/kubelet not met)"
		if err != nil || res.Status != report.StatusTrue || res.Reason != report.ReasonRepairNotHelping || !strings.HasPrefix(res.Message, wantMsg) {
			t.Errorf("ServiceNotRecovering: %s %s %q (%v), want True %s %q", res.Status, res.Reason, res.Message, err, report.ReasonRepairNotHelping, wantMsg)
		}

		// The file is back: the next restart, at the cooldown, starts it.
		m.meet()
		time.Sleep(time.Minute)
		if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
			t.Fatalf("once the condition is met: %s, want %s", res, RepairRestarted)
		}
		r.Wait()
		if st := r.Status("kubelet.service"); st.LastResult != "done" {
			t.Errorf("once the condition is met: last result %q, want done", st.LastResult)
		}
		if failed := testutil.ToFloat64(r.repairs.WithLabelValues("kubelet.service", RepairFailed)); failed != 3 {
			t.Errorf("a restart that started the unit counted failed: %v", failed)
		}
	})
}

// An Assert…= that fails fails the restart job (result "assert"): counted
// failed, logged as an error naming the assert, and, as for a condition,
// the unit is the repairer's, retried at the cooldown, the message naming
// the assert.
func TestRepairOfAUnitWhoseAssertFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := &skippingStart{fakeManager: newFakeManager(u), assert: "AssertPathExists=/usr/bin/kubelet"}
		log, logged := warnLog()
		r := NewRepairer(m, log, time.Now, nil)
		got := probesEvery10s(r, 7)
		if want := "restarted cooldown cooldown cooldown cooldown cooldown restarted"; got != want {
			t.Errorf("results:\n%s\nwant:\n%s", got, want)
		}
		st := r.Status("kubelet.service")
		if want := `failed: kubelet.service: job result "assert": systemd job did not succeed: AssertPathExists=/usr/bin/kubelet failed`; st.LastResult != want {
			t.Errorf("last result %q, want %q", st.LastResult, want)
		}
		if failed := testutil.ToFloat64(r.repairs.WithLabelValues("kubelet.service", RepairFailed)); failed != 2 {
			t.Errorf("repairs_total failed %v, want 2", failed)
		}
		if !strings.Contains(logged.String(), "AssertPathExists=/usr/bin/kubelet failed") {
			t.Errorf("log:\n%s", logged)
		}
		_, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
		if want := "systemd did not start kubelet.service: AssertPathExists=/usr/bin/kubelet failed; restarting it at most once per 1m0s"; msg != want {
			t.Errorf("message %q, want %q", msg, want)
		}
	})
}

// A unit whose last start systemd skipped, that start not the repairer's
// (kubelet crashed and its Restart= was skipped, result "signal"; someone's
// start or restart; the boot's), was asked to run, not stopped: it is
// restarted, where a unit stopped, inactive, is left alone. Before, it was
// taken for a stopped one ("a stopped unit is not started by the repair").
func TestRepairStartsAUnitWhoseOwnStartWasSkipped(t *testing.T) {
	for _, tc := range []struct {
		name             string
		skipped, assert  string
		want, wantPrefix string
	}{
		{"condition", "ConditionPathExists=/usr/bin/kubelet", "", RepairRestarted, "systemd skipped the start of kubelet.service: ConditionPathExists=/usr/bin/kubelet not met"},
		{"assert", "", "AssertPathExists=/usr/bin/kubelet", RepairRestarted, "systemd did not start kubelet.service: AssertPathExists=/usr/bin/kubelet failed"},
		{"stopped", "", "", RepairStopped, "not restarted: kubelet.service is stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := running("kubelet.service")
			u.MainStart = time.Now().Add(-time.Hour)
			u.ActiveState, u.SubState, u.Result, u.NRestarts, u.Skipped, u.AssertFailed = "inactive", "dead", "signal", 1, tc.skipped, tc.assert
			m := newFakeManager(u)
			r := NewRepairer(m, quietLog(), time.Now, nil)
			res, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
			r.Wait()
			if res != tc.want || !strings.HasPrefix(msg, tc.wantPrefix) {
				t.Errorf("%s %q, want %s %q...", res, msg, tc.want, tc.wantPrefix)
			}
		})
	}
}

// A failed kubelet (its start limit hit) whose restart systemd skips: the
// reset-failed before the restart ended its failed state, and the skipped
// start left it inactive at the invocation it failed at. ServiceNotRecovering
// names it failed, as for any restart that did not start it, and says why
// the restart did not: the condition.
func TestServiceNotRecoveringNamesTheConditionOfAFailedUnitsSkippedRestart(t *testing.T) {
	u := running("kubelet.service")
	u.MainStart = time.Now().Add(-time.Hour)
	u.ActiveState, u.SubState, u.Result = "failed", "failed", "exit-code"
	m := &skippingStart{fakeManager: newFakeManager(u, running("containerd.service"), running("syself-proxy.service")), skipped: "ConditionPathExists=/usr/bin/kubelet"}
	r := NewRepairer(m, quietLog(), time.Now, nil)
	if res, msg := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
		t.Fatalf("repair: %s %q", res, msg)
	}
	r.Wait()
	env := testEnv(t, nil)
	env.Systemd, env.Repair, env.Units = m, r, NewUnitWatch(nil, nil)
	c, _ := newServiceNotRecovering(env)
	res, err := c.Probe(context.Background())
	want := "kubelet.service is failed (exit-code), left inactive by the repair's reset-failed before a restart that did not start it (systemd skipped the start of kubelet.service: ConditionPathExists=/usr/bin/kubelet not met)"
	if err != nil || res.Status != report.StatusTrue || res.Reason != report.ReasonUnitFailed || !strings.HasPrefix(res.Message, want) {
		t.Errorf("%s %s %q (%v), want True %s %q", res.Status, res.Reason, res.Message, err, report.ReasonUnitFailed, want)
	}
}
