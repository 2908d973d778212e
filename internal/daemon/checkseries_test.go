package daemon

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// Every check the runner starts has its autopilot_health_check_runs_total
// series of every result (ok, problem, error, timeout, panic) from its
// start, at 0: Prometheus' increase() and rate() do not see a series that
// first appears at 1, so the dashboard's "Check runs by result" missed the
// first run of each result (a check's first timeout, its first error).
// On the bubble's clock, with the first runs spread over 5 minutes: the
// series are read before most checks ran (the first starts at once).
func TestEveryCheckHasItsRunSeriesOfEveryResultFromTheStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		// Its watcher blocks in a read of file events the fake clock
		// cannot wait out.
		cfg.Checks.NodeTampered.Enabled = false
		cfg.Runner.FirstRunSpread = config.Duration{Duration: 5 * time.Minute}
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		defer func() { cancel(); <-done }()
		synctest.Wait()

		var started []string
		for _, l := range d.live.Loops() {
			if c, ok := strings.CutPrefix(l, "check/"); ok {
				started = append(started, c)
			}
		}
		if len(started) < 5 {
			t.Fatalf("checks started: %v, want the defaults' (5 or more)", started)
		}
		mfs, err := d.Metrics().Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		runs := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "autopilot_health_check_runs_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				runs[label(m, "check")+"/"+label(m, "result")] = m.GetCounter().GetValue()
			}
		}
		ran := 0
		for _, c := range started {
			n := 0.0
			for _, res := range []string{report.ResultOK, report.ResultProblem, report.ResultError, report.ResultTimeout, report.ResultPanic} {
				v, ok := runs[c+"/"+res]
				if !ok {
					t.Errorf("check_runs_total{check=%q,result=%q} is not exported at the check's start", c, res)
				}
				n += v
			}
			if n > 0 {
				ran++
			}
		}
		if ran > 1 {
			t.Errorf("%d checks ran before the series were read; want the first at most (the spread is 5 min): the test reads them too late", ran)
		}
	})
}
