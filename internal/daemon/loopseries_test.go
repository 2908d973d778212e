package daemon

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/kmsg"
)

// Every loop /healthz counts ("ok: N loops making progress") has its
// autopilot_health_loop_last_progress_timestamp_seconds series from the
// daemon's start, at the start (the time the liveness counts its silence
// from), not only from its first beat: the role re-detection loop (detect)
// beats first after detect.interval, and an alert on a loop's progress, or
// an operator comparing /healthz with the metrics, saw it missing until
// then. On the bubble's clock: no loop has beaten when the series are read.
func TestEveryLoopHasItsProgressSeriesFromTheStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t)
		// Its watcher blocks in a read of file events the fake clock
		// cannot wait out.
		cfg.Checks.NodeTampered.Enabled = false
		cfg.GPU = "auto" // re-detection runs
		cfg.Detect.Interval = config.Duration{Duration: 5 * time.Minute}
		cfg.Runner.FirstRunSpread = config.Duration{Duration: 5 * time.Minute}
		cfg.Kmsg.Enabled = true
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener(),
			KmsgOpen: func(context.Context, string) (kmsg.Device, error) { return &quietKmsg{}, nil }})
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		defer func() { cancel(); <-done }()
		synctest.Wait()

		loops := d.live.Loops()
		if len(loops) == 0 || !slices.Contains(loops, "detect") {
			t.Fatalf("loops %v: want the re-detection loop among them", loops)
		}
		mfs, err := d.Metrics().Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		progress := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "autopilot_health_loop_last_progress_timestamp_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				progress[label(m, "loop")] = m.GetGauge().GetValue()
			}
		}
		want := float64(began.UnixNano()) / 1e9
		for _, l := range loops {
			v, ok := progress[l]
			switch {
			case !ok:
				t.Errorf("loop %q is counted by /healthz but has no progress series at the start", l)
			case v != want:
				t.Errorf("loop %q: progress %v at the start, want the start time %v", l, v, want)
			}
		}
	})
}
