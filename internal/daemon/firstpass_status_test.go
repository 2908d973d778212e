package daemon

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
)

// The status line systemd shows while the daemon starts (activating,
// until READY=1, the first pass over; a check's first run may take its
// timeout, a minute) follows the notes as the running daemon's does: the
// metrics address bound during the first pass takes `metrics not served:
// ... (retrying)` off the starting line at once, not at READY=1.
func TestStatusLineDuringTheFirstPassFollowsTheNotes(t *testing.T) {
	defer func(min, max time.Duration) { metricsRetryMin, metricsRetryMax = min, max }(metricsRetryMin, metricsRetryMax)
	metricsRetryMin, metricsRetryMax = 10*time.Millisecond, 100*time.Millisecond
	sock := notifySocket(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	cfg := testConfig(t)
	cfg.Metrics.ListenAddress = addr
	// The first runs spread over an hour: the first pass is not over
	// while the test runs.
	cfg.Runner.FirstRunSpread = config.Duration{Duration: time.Hour}
	d, err := New(cfg, quietLog(), Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()

	starting := next(t, sock, "the starting status", func(m string) bool { return strings.HasPrefix(m, "STATUS=") })
	failure := "listen tcp " + addr + ": bind: address already in use"
	if !strings.HasPrefix(starting, "STATUS=metrics not served: "+failure+" (retrying); starting: first pass of ") {
		t.Errorf("the starting status %q does not name the bind failure", starting)
	}
	busy.Close()
	await(t, d, "the metrics listener bound", func() bool { return d.Addr() != nil })
	if got := next(t, sock, "a status line", func(m string) bool { return true }); !strings.HasPrefix(got, "STATUS=starting: first pass of ") {
		t.Errorf("once the metrics address is bound during the first pass: %q, want the starting line without the bind failure", got)
	}
}
