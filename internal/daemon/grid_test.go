package daemon

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
)

// The state writer, role re-detection and the watchdog wake on the daemon's
// grid (tick.Grid): at multiples of their periods from the daemon's start,
// whenever they started, so that they wake together with the checks.
func TestPeriodicLoopsWakeOnTheGrid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		grid := tick.New(time.Now())
		time.Sleep(7 * time.Second) // the loops start off the grid
		var mu sync.Mutex
		var calls []time.Duration
		beats := map[string][]time.Duration{}
		live := NewLiveness(func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, time.Since(grid.Anchor()))
			return time.Now()
		})
		live.OnBeat = func(loop string, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			beats[loop] = append(beats[loop], time.Since(grid.Anchor()))
		}
		cfg := testConfig(t)
		cfg.Role, cfg.GPU = "worker", "false"
		d := &Daemon{cfg: cfg, log: quietLog(), store: report.NewStore("b"), metrics: report.NewMetrics("test"), live: live,
			parts: &Parts{Grid: grid}, env: &checks.Env{Role: report.RoleWorker}}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { d.persist(ctx) })
		wg.Go(func() { d.redetect(ctx, 2*time.Minute) })
		wg.Go(func() { d.watchdog(ctx, 0) }) // no systemd watchdog: 15 s
		time.Sleep(10 * time.Minute)
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		onGrid := func(what string, at []time.Duration, period time.Duration, want int) {
			t.Helper()
			if len(at) != want {
				t.Errorf("%s: %d wake-ups in 10 minutes, want %d: %v", what, len(at), want, at)
			}
			for _, a := range at {
				if a%period != 0 {
					t.Errorf("%s woke %v after the start, off its %v grid: %v", what, a, period, at)
					break
				}
			}
		}
		onGrid("the state writer", beats["state"], time.Minute, 10)
		onGrid("re-detection", beats["detect"], 2*time.Minute, 5)
		var watchdog []time.Duration
		for _, c := range calls {
			if c != 7*time.Second { // Expect at the loops' start
				watchdog = append(watchdog, c)
			}
		}
		// The watchdog's liveness checks, with the beats' clock reads
		// among them: all on the 15 s grid.
		onGrid("the watchdog (and the beats)", watchdog, 15*time.Second, 10*4+10+5)
	})
}
