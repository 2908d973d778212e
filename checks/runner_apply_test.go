package checks

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// runsOf returns when a check ran (offsets from the start).
func runsOf(runs *sync.Map, name string) []time.Duration {
	v, ok := runs.Load(name)
	if !ok {
		return nil
	}
	return slices.Clone(*v.(*[]time.Duration))
}

// reloadEnv is the plan before the reload: DiskUsageHigh (2m),
// NodeInfoStale (1m) and CNIUnhealthy (30s) run, ClockNotSynchronized is
// disabled; first runs spread over 3s.
func reloadEnv(t *testing.T, mutate func(c *config.Config)) *Env {
	return testEnv(t, func(c *config.Config) {
		c.Runner.FirstRunSpread = config.Duration{Duration: 3 * time.Second}
		c.Checks.ClockNotSynchronized.Enabled = false
		if mutate != nil {
			mutate(c)
		}
	})
}

// Apply changes the plan in place: the check whose settings did not change
// keeps its timer (not run sooner than its schedule), the changed one is
// restarted with its new interval, the disabled one stops, the enabled one
// starts; the started ones' first runs are spread over first_run_spread.
func TestApplyKeepsUnchangedTimers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var runs sync.Map
		store := report.NewStore("b")
		factories := recordingFactories(start, &runs)
		r, err := NewRunner(reloadEnv(t, nil), Options{Store: store, Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var firstPass int
		done := make(chan struct{})
		go func() {
			r.Run(ctx, func() { firstPass++ })
			close(done)
		}()
		time.Sleep(10 * time.Second)
		env := reloadEnv(t, func(c *config.Config) {
			c.Checks.CNIUnhealthy.Interval = config.Duration{Duration: 20 * time.Second}
			c.Checks.NodeInfoStale.Enabled = false
			c.Checks.ClockNotSynchronized.Enabled = true
		})
		a, err := r.Apply(env)
		if err != nil {
			t.Fatal(err)
		}
		want := Applied{Changed: []string{"CNIUnhealthy"}, Started: []string{"ClockNotSynchronized"}, Stopped: []string{"NodeInfoStale"}}
		if !slices.Equal(a.Changed, want.Changed) || !slices.Equal(a.Started, want.Started) || !slices.Equal(a.Stopped, want.Stopped) {
			t.Errorf("Apply = %+v, want %+v", a, want)
		}
		if got := r.Checks(); !slices.Equal(got, []string{"DiskUsageHigh", "ClockNotSynchronized", "CNIUnhealthy"}) {
			t.Errorf("checks after Apply: %v", got)
		}
		time.Sleep(2*time.Minute + 10*time.Second + time.Millisecond)
		cancel()
		<-done

		s := time.Second
		wantRuns := map[string][]time.Duration{
			// Unchanged: at 0 and two minutes later, not at the reload.
			"DiskUsageHigh": {0, 2 * time.Minute},
			// Disabled at 10s: never again.
			"NodeInfoStale": {1 * s},
			// Enabled at 10s: the first of the two started, at once, then
			// on the grid of its interval from the runner's start.
			"ClockNotSynchronized": {10 * s, 60 * s, 120 * s},
			// Changed at 10s: restarted half the spread later, then every
			// 20s on the grid.
			"CNIUnhealthy": {2 * s, 11500 * time.Millisecond, 20 * s, 40 * s, 60 * s, 80 * s, 100 * s, 120 * s, 140 * s},
		}
		for name, w := range wantRuns {
			if got := runsOf(&runs, name); !slices.Equal(got, w) {
				t.Errorf("%s ran at %v, want %v", name, got, w)
			}
		}
		if firstPass != 1 {
			t.Errorf("first pass reported %d times", firstPass)
		}
		// The runner leaves the stopped check's condition to its caller.
		if _, ok := store.Get("NodeInfoStale"); !ok {
			t.Error("the stopped check's condition was dropped by the runner")
		}
	})
}

// An Apply during the first pass: the first pass waits for the check
// started, not for the one stopped.
func TestApplyDuringFirstPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var runs sync.Map
		r, err := NewRunner(reloadEnv(t, nil), Options{Store: report.NewStore("b"), Factories: recordingFactories(start, &runs)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var firstPass []time.Duration
		done := make(chan struct{})
		go func() {
			r.Run(ctx, func() { firstPass = append(firstPass, time.Since(start)) })
			close(done)
		}()
		time.Sleep(500 * time.Millisecond) // DiskUsageHigh ran; NodeInfoStale (1s) and CNIUnhealthy (2s) pending
		if _, err := r.Apply(reloadEnv(t, func(c *config.Config) {
			c.Checks.CNIUnhealthy.Enabled = false
			c.Checks.ClockNotSynchronized.Enabled = true
		})); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		cancel()
		<-done
		if !slices.Equal(firstPass, []time.Duration{time.Second}) {
			t.Errorf("first pass at %v, want once at 1s (NodeInfoStale's first run, ClockNotSynchronized ran at 0.5s)", firstPass)
		}
		if got := runsOf(&runs, "CNIUnhealthy"); len(got) != 0 {
			t.Errorf("CNIUnhealthy, disabled before its first run, ran at %v", got)
		}
	})
}

// A check that cannot be built refuses the whole Apply: the running plan
// goes on unchanged, the check with the old settings included.
func TestApplyThatFailsChangesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var runs sync.Map
		factories := recordingFactories(start, &runs)
		r, err := NewRunner(reloadEnv(t, nil), Options{Store: report.NewStore("b"), Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			r.Run(ctx, nil)
			close(done)
		}()
		time.Sleep(10 * time.Second)
		cni := factories["CNIUnhealthy"]
		factories["CNIUnhealthy"] = func(*Env) (Check, error) { return nil, errors.New("no socket") }
		_, err = r.Apply(reloadEnv(t, func(c *config.Config) {
			c.Checks.CNIUnhealthy.Interval = config.Duration{Duration: 20 * time.Second}
			c.Checks.NodeInfoStale.Enabled = false
		}))
		if err == nil || err.Error() != "check CNIUnhealthy: no socket" {
			t.Errorf("Apply: %v", err)
		}
		factories["CNIUnhealthy"] = cni
		time.Sleep(60 * time.Second)
		cancel()
		<-done
		if got := runsOf(&runs, "CNIUnhealthy"); !slices.Equal(got, []time.Duration{2 * time.Second, 30 * time.Second, time.Minute}) {
			t.Errorf("CNIUnhealthy ran at %v, want its old 30s schedule", got)
		}
		if got := runsOf(&runs, "NodeInfoStale"); !slices.Equal(got, []time.Duration{time.Second, time.Minute}) {
			t.Errorf("NodeInfoStale ran at %v, want it still running", got)
		}
	})
}

// closingCheck counts its Close calls.
type closingCheck struct {
	Check
	closed atomic.Int32
}

func (c *closingCheck) Close() { c.closed.Add(1) }

// A check that keeps something open is closed when a reload removes or
// replaces it, and the others when the runner stops.
func TestApplyClosesTheChecksItStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		made := map[string][]*closingCheck{}
		var mu sync.Mutex
		factories := map[string]Factory{}
		for name, res := range healthy {
			factories[name] = func(*Env) (Check, error) {
				c := &closingCheck{Check: probeFunc(func(context.Context) (Result, error) { return res, nil })}
				mu.Lock()
				made[name] = append(made[name], c)
				mu.Unlock()
				return c, nil
			}
		}
		r, err := NewRunner(reloadEnv(t, nil), Options{Store: report.NewStore("b"), Factories: factories})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { r.Run(ctx, nil); close(done) }()
		time.Sleep(10 * time.Second)
		if _, err := r.Apply(reloadEnv(t, func(c *config.Config) {
			c.Checks.CNIUnhealthy.Interval = config.Duration{Duration: 20 * time.Second} // replaced
			c.Checks.NodeInfoStale.Enabled = false                                       // removed
		})); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		closed := func(name string, i int) int32 { return made[name][i].closed.Load() }
		if closed("NodeInfoStale", 0) != 1 || closed("CNIUnhealthy", 0) != 1 || closed("DiskUsageHigh", 0) != 0 || closed("CNIUnhealthy", 1) != 0 {
			t.Errorf("after the reload: closed NodeInfoStale %d, the old CNIUnhealthy %d, DiskUsageHigh %d, the new CNIUnhealthy %d; want 1 1 0 0",
				closed("NodeInfoStale", 0), closed("CNIUnhealthy", 0), closed("DiskUsageHigh", 0), closed("CNIUnhealthy", 1))
		}
		mu.Unlock()
		cancel()
		<-done
		if closed("DiskUsageHigh", 0) != 1 || closed("CNIUnhealthy", 1) != 1 {
			t.Errorf("after the runner stopped: closed DiskUsageHigh %d, the new CNIUnhealthy %d; want 1 1", closed("DiskUsageHigh", 0), closed("CNIUnhealthy", 1))
		}
	})
}
