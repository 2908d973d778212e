package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
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

// A reload during the first pass (SIGHUP, or `autopilot-health reload` on
// the control socket: the unit is activating) that starts or changes a
// check starts that check's first run again from now, with its new timeout,
// and READY=1 waits for it. systemd is told the first pass's length again
// from then (EXTEND_TIMEOUT_USEC=), before READY=1: told only at the start,
// a check's timeout raised past what systemd was told had the start timed
// out, the daemon stopped and started again.
func TestStartTimeoutExtendedAgainByAReloadDuringTheFirstPass(t *testing.T) {
	sock := notifySocket(t)
	base := testConfig(t)
	path := filepath.Join(t.TempDir(), "config.toml")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	// The first runs spread over 5 min: the first pass is not over
	// while the test runs.
	write := func(extra string) {
		t.Helper()
		s := strings.Replace(reloadTOML(base, ln.Addr().String(), extra), `first_run_spread = "0s"`, `first_run_spread = "5m"`, 1)
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	// The daemon as `run` starts it from that file.
	cfg, _, digest, err := config.LoadDigest(path, false)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, ConfigPath: path, ConfigDigest: digest})
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
	extension := func(m string) time.Duration {
		v, _ := strings.CutPrefix(m, "EXTEND_TIMEOUT_USEC=")
		usec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%q: %v", m, err)
		}
		return time.Duration(usec) * time.Microsecond
	}
	first := extension(next(t, sock, "the start's EXTEND_TIMEOUT_USEC=", func(m string) bool { return strings.HasPrefix(m, "EXTEND_TIMEOUT_USEC=") }))
	next(t, sock, "the starting line", func(m string) bool { return strings.HasPrefix(m, "STATUS=starting: first pass of ") })

	// A check the reload changes (a new instance, its first run from
	// now), whose first run may take 5 h: past what systemd was told at
	// the start.
	const timeout = 5 * time.Hour
	if first >= timeout {
		t.Fatalf("the start told systemd %s already; the test needs less than %s", first, timeout)
	}
	write("[checks.CertRenewalFailing]\nenabled = true\ninterval = \"6h\"\ntimeout = \"5h\"\n")
	res, err := d.ReloadNotified()
	if err != nil {
		t.Fatalf("reload during the first pass: %v", err)
	}
	if !slices.Contains(slices.Concat(res.Checks.Started, res.Checks.Changed), "CertRenewalFailing") {
		t.Fatalf("the reload started %v, changed %v, want CertRenewalFailing", res.Checks.Started, res.Checks.Changed)
	}
	select {
	case <-d.firstPassDone:
		t.Fatal("the first pass is over: the test needs it running")
	default:
	}
	// Datagrams arrive in order: a marker sent after the reload comes
	// after what the reload sent.
	d.tell(func(n Notifier) error { return n.Status("marker") })
	var told time.Duration
	next(t, sock, "the marker", func(m string) bool {
		if strings.HasPrefix(m, "EXTEND_TIMEOUT_USEC=") {
			told = max(told, extension(m))
		}
		return m == "STATUS=marker"
	})
	if told < timeout {
		t.Errorf("after a reload during the first pass that changed a check to a %s timeout, systemd was told %s more (at the start: %s), want at least %s", timeout, told, first, timeout)
	}
}
