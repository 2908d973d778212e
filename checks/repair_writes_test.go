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
