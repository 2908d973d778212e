package daemon

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// READY=1 waits for every check's first run: runner.first_run_spread (up to
// 5 min) and a check's timeout (up to its interval) may put it past the
// unit's TimeoutStartSec= (3 min). Before the first run, the daemon tells
// systemd how long its first pass may take (EXTEND_TIMEOUT_USEC=, at least
// the spread and the longest timeout; its first notification), and nothing
// of it after READY=1.
// Before, systemd timed such a start out and started the daemon again, for
// ever (tests/ TestFirstPassLongerThanTimeoutStartSec in a real systemd).
func TestStartTimeoutExtendedToTheFirstPass(t *testing.T) {
	sock := notifySocket(t)
	cfg := testConfig(t)
	cfg.Runner.FirstRunSpread.Duration = 500 * time.Millisecond
	cfg.Checks.CertRenewalFailing.Enabled = true
	cfg.Checks.CertRenewalFailing.Interval.Duration = time.Hour
	cfg.Checks.CertRenewalFailing.Timeout.Duration = 20 * time.Minute
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Error(err)
		}
	}()

	// The first notification, before the starting line.
	m := next(t, sock, "the first notification", func(string) bool { return true })
	v, ok := strings.CutPrefix(m, "EXTEND_TIMEOUT_USEC=")
	if !ok {
		t.Fatalf("the first notification is %q, want EXTEND_TIMEOUT_USEC=", m)
	}
	usec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("EXTEND_TIMEOUT_USEC=%q: %v", v, err)
	}
	if want := 500*time.Millisecond + 20*time.Minute; time.Duration(usec)*time.Microsecond < want {
		t.Errorf("EXTEND_TIMEOUT_USEC=%d (%s), want at least the spread and the longest timeout, %s", usec, time.Duration(usec)*time.Microsecond, want)
	}
	next(t, sock, "READY=1", func(m string) bool {
		if strings.HasPrefix(m, "EXTEND_TIMEOUT_USEC=") {
			t.Errorf("a second EXTEND_TIMEOUT_USEC= before READY=1: %q", m)
		}
		return strings.HasPrefix(m, "READY=1")
	})
	// After READY=1, a re-plan's runner (role, GPU) extends nothing: an
	// EXTEND_TIMEOUT_USEC= in the running state would be for the runtime.
	// As for a new plan's runner, one systemd was not told of.
	d.sdMu.Lock()
	d.sdExtendedFor = nil
	d.sdMu.Unlock()
	d.extendStart(d.currentRunner())
	// Datagrams arrive in order: a marker sent after it comes first.
	d.tell(func(n Notifier) error { return n.Status("marker") })
	next(t, sock, "the marker", func(m string) bool {
		if strings.HasPrefix(m, "EXTEND_TIMEOUT_USEC=") {
			t.Errorf("EXTEND_TIMEOUT_USEC= after READY=1: %q", m)
		}
		return m == "STATUS=marker"
	})
}
