package checks

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// statusChanges records every status change of every condition.
type statusChanges struct {
	mu  sync.Mutex
	got []string
}

func (s *statusChanges) ConditionChanged(prev *report.Condition, cur report.Condition) {
	if prev != nil && prev.Status == cur.Status {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, fmt.Sprintf("%s=%s/%s", cur.Type, cur.Status, cur.Reason))
}
func (*statusChanges) ConditionRestored(report.Condition) {}
func (*statusChanges) EventEmitted(report.Event)          {}

// An Apply that changes a check while it runs (one whose probe returns
// when its context ends) or while it is stuck (one whose probe never
// returns) returns at once, records nothing for the run it cut short (no
// Unknown, no flap), and the check's new instance runs with the new
// settings; an Apply back to the old settings does the same again.
func TestApplyWhileRunningOrStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var mu sync.Mutex
		instances := map[string]int{}
		factory := func(name string, stuck bool) Factory {
			return func(*Env) (Check, error) {
				mu.Lock()
				instances[name]++
				mu.Unlock()
				n := 0
				return probeFunc(func(ctx context.Context) (Result, error) {
					n++
					if n == 2 {
						if stuck {
							<-release // ignores its context
						} else {
							<-ctx.Done()
							return Result{}, ctx.Err()
						}
					}
					return healthy[name], nil
				}), nil
			}
		}
		interval := func(d time.Duration) func(c *config.Config) {
			return func(c *config.Config) {
				c.Checks.NodeInfoStale.Enabled = false
				for _, com := range []*config.Common{&c.Checks.DiskUsageHigh.Common, &c.Checks.CNIUnhealthy.Common} {
					com.Interval = config.Duration{Duration: d}
					com.Timeout = config.Duration{Duration: 30 * time.Second}
				}
			}
		}
		store := report.NewStore("b")
		changes := &statusChanges{}
		store.Observe(changes)
		r, err := NewRunner(reloadEnv(t, interval(time.Minute)), Options{Store: store, Factories: map[string]Factory{
			"DiskUsageHigh": factory("DiskUsageHigh", true),
			"CNIUnhealthy":  factory("CNIUnhealthy", false),
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			r.Run(ctx, func() {})
			close(done)
		}()
		time.Sleep(65 * time.Second) // both in their second run since 60 s and 61.5 s
		synctest.Wait()
		before := map[string]time.Time{}
		for _, c := range store.All() {
			before[c.Type] = c.LastTransitionTime
		}
		for _, d := range []time.Duration{61 * time.Second, time.Minute} {
			a, err := r.Apply(reloadEnv(t, interval(d)))
			if err != nil {
				t.Fatal(err)
			}
			if len(a.Changed) != 2 {
				t.Fatalf("Apply(%s) = %+v", d, a)
			}
			time.Sleep(10 * time.Second)
			synctest.Wait()
		}
		for _, c := range store.All() {
			if c.Status != report.StatusFalse || !c.LastTransitionTime.Equal(before[c.Type]) {
				t.Errorf("%s after the Applies: %s/%s since %v, was False since %v", c.Type, c.Status, c.Reason, c.LastTransitionTime, before[c.Type])
			}
		}
		if want := []string{"DiskUsageHigh=False/DiskUsageOK", "CNIUnhealthy=False/CNIHealthy"}; fmt.Sprint(changes.got) != fmt.Sprint(want) {
			t.Errorf("status changes %v, want %v only", changes.got, want)
		}
		if instances["DiskUsageHigh"] != 3 || instances["CNIUnhealthy"] != 3 {
			t.Errorf("instances %v, want 3 of each (start, two Applies)", instances)
		}
		cancel()
		close(release)
		<-done
	})
}
