package checks

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// touchCount is a state store that counts the saves asked for at once
// (Touch: the state file written within a second).
type touchCount struct {
	*report.Store
	n atomic.Int64
}

func (c *touchCount) Touch() { c.n.Add(1); c.Store.Touch() }

// systemd not reachable (or the unit not readable) while kubelet's probe
// fails every 10 s: each failed attempt is recorded (LastAttempt, in status
// and the services report), but the state file is asked to save it at once
// only when the error is new, or once per cooldown while it stays the same:
// before, every probe asked for a save, a state file write every 10 s (two
// with containerd's probe failing too) for as long as systemd was away.
func TestRepairFailedAttemptsDoNotWriteTheStateFileAtEveryProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			name string
			mgr  func() *fakeManager
		}{
			{"unit not readable", func() *fakeManager {
				m := newFakeManager()
				m.err = errors.New("dial unix /run/dbus/system_bus_socket: connect: no such file or directory")
				return m
			}},
			{"no systemd", nil},
		} {
			mem := &touchCount{Store: report.NewStore("b")}
			var r *Repairer
			var m *fakeManager
			if tc.mgr != nil {
				m = tc.mgr()
				r = NewRepairer(m, quietLog(), time.Now, nil)
			} else {
				r = NewRepairer(nil, quietLog(), time.Now, nil)
			}
			r.KeepIn(mem)
			start := time.Now()
			for range 13 { // 2 minutes of probes, every 10 s
				res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
				if res != RepairFailed && res != RepairNoSystemd {
					t.Fatalf("%s: %s, want failed or no-systemd", tc.name, res)
				}
				r.Wait()
				time.Sleep(10 * time.Second)
			}
			// At 0 s, 60 s and 120 s: once per cooldown.
			if got := mem.n.Load(); got != 3 {
				t.Errorf("%s: %d saves asked for in 2 minutes of failed attempts every 10 s, want 3 (one per 1m cooldown)", tc.name, got)
			}
			if st := r.Status("kubelet.service"); !st.LastAttempt.Equal(start.Add(120 * time.Second)) {
				t.Errorf("%s: the last failed attempt: %v, want the last probe's time (in memory)", tc.name, st.LastAttempt.Sub(start))
			}
			// A new error is news: saved at once.
			if m != nil {
				m.mu.Lock()
				m.err = errors.New("Message recipient disconnected from message bus without replying")
				m.mu.Unlock()
				was := mem.n.Load()
				r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
				if got := mem.n.Load(); got != was+1 {
					t.Errorf("%s: a new error asked for %d saves, want 1", tc.name, got-was)
				}
			}
		}
	})
}

// savingStore is a state store that saves its state file at each Touch
// (the persister does within a second): what a crash after it finds.
type savingStore struct {
	*report.Store
	t   *testing.T
	dir string
}

func (c *savingStore) Touch() {
	if err := c.Save(c.dir, time.Now()); err != nil {
		c.t.Fatal(err)
	}
}

// savedRepairOf returns the unit's repair status in the state file in dir.
func savedRepairOf(t *testing.T, dir, unit string) savedRepair {
	t.Helper()
	s := report.NewStore("b")
	if res, err := s.Load(dir); err != nil || res.Corrupt != nil {
		t.Fatalf("load: %v %v", err, res.Corrupt)
	}
	var saved map[string]savedRepair
	s.Memo(RepairKey, &saved)
	return saved[unit]
}

// README ("Local state"): a failed attempt is saved when its error is new,
// then once per cooldown (e7acee1), so a crash between those saves loses
// the later failed attempts' time: the state file's lastFailedAttempt is
// less than one cooldown older than the last attempt, with its error. A
// crash after each probe of 5 minutes of failed attempts every 10 s.
func TestRepairCrashBetweenSavesLosesLessThanACooldown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const unit, cooldown = "kubelet.service", time.Minute
		m := newFakeManager()
		m.err = errors.New("dial unix /run/dbus/system_bus_socket: connect: no such file or directory")
		mem := &savingStore{Store: report.NewStore("b"), t: t, dir: t.TempDir()}
		r := NewRepairer(m, quietLog(), time.Now, nil)
		r.KeepIn(mem)
		var worst time.Duration
		for i := range 31 {
			if i > 0 {
				time.Sleep(10 * time.Second)
			}
			r.Repair(context.Background(), unit, cooldown, "healthz failed")
			r.Wait()
			now := r.Status(unit)
			saved := savedRepairOf(t, mem.dir, unit)
			lost := now.LastAttempt.Sub(saved.LastAttempt)
			if saved.LastAttempt.IsZero() || lost < 0 || lost >= cooldown || saved.LastAttemptError != now.LastAttemptError {
				t.Fatalf("a crash after the probe at %d s: the state file holds the failed attempt of %v (error %q), the last was %v (error %q): want it less than %v before",
					i*10, saved.LastAttempt, saved.LastAttemptError, now.LastAttempt, now.LastAttemptError, cooldown)
			}
			worst = max(worst, lost)
		}
		t.Logf("a crash between the saves loses at most %v of the last failed attempt's time (cooldown %v, probes every 10 s)", worst, cooldown)
	})
}
