package kmsg

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// A reader that cannot open the device never reports progress (so /healthz
// and the watchdog fail) and says so in its metric: it is never blind
// silently.
func TestReaderThatCannotReadReportsNoProgress(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	var beats atomic.Int64
	rd := &Reader{Path: filepath.Join(t.TempDir(), "no-kmsg"), Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Progress: func(string, time.Duration) { beats.Add(1) }, ReadTimeout: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rd.Run(ctx) // returns when ctx is done
	if beats.Load() != 0 || mon.Metrics().ReaderUp() {
		t.Errorf("progress reported %d times, reader up %v, with no device", beats.Load(), mon.Metrics().ReaderUp())
	}
}
