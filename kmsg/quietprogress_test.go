package kmsg

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
)

// A kernel log that logs nothing for ten minutes after its one record (a
// quiet node) never makes the reader look stuck: each read that waits out
// its deadline (on the daemon's grid, as the daemon sets it) is a beat, so
// the loop beats at least every ReadTimeout, and says ReadTimeout as its
// period (the daemon allows period + 30 s). Checked while looking into
// /healthz naming kmsg stuck under the shipped unit in a test namespace,
// which was the namespace's missing CAP_SYSLOG, not the reader.
func TestReaderQuietLogKeepsProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := report.NewStore("b")
		mon := NewMonitor(opts(t, store))
		mon.Start(t0, t0)
		dev := &fakeDevice{recs: [][]byte{[]byte("6,1,1000,-;ordinary chatter\n")}}
		start := time.Now()
		var mu sync.Mutex
		last, maxGap := start, time.Duration(0)
		var periods []time.Duration
		rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			ReadTimeout: 10 * time.Second, FromStart: true, Grid: tick.New(start.Add(-3 * time.Second)),
			Progress: func(_ string, period time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				now := time.Now()
				maxGap = max(maxGap, now.Sub(last))
				last = now
				if len(periods) == 0 || periods[len(periods)-1] != period {
					periods = append(periods, period)
				}
			},
			Open: func(context.Context, string) (Device, error) { return dev, nil }}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		rd.Run(ctx)
		mu.Lock()
		defer mu.Unlock()
		if tail := time.Since(last); tail > maxGap {
			maxGap = tail
		}
		if maxGap > rd.ReadTimeout {
			t.Errorf("the longest silence of the reader's loop on a quiet log: %s; want at most the read timeout, %s", maxGap, rd.ReadTimeout)
		}
		if len(periods) != 1 || periods[0] != rd.ReadTimeout {
			t.Errorf("periods given with the beats: %v; want only the read timeout, %s", periods, rd.ReadTimeout)
		}
	})
}
