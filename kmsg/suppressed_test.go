package kmsg

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// The kernel prints "I/O error, dev X" lines rate-limited, one state for
// the call site whatever the device (blk_print_req_error's
// printk_ratelimited: 10 in 5 s), and says later how many it dropped:
// "blk_print_req_error: 37 callbacks suppressed" (lib/ratelimit.c
// ___ratelimit, "%s: %d callbacks suppressed", KERN_WARNING). A flood from
// a device the window leaves out (loop0 here) hides a real disk's errors:
// the suppressed lines are counted by function, and while they are within
// DisksFailure's window its message says its count is a lower bound; the
// status is still the count's. Before, neither was said anywhere.
func TestSuppressedIOErrorLinesAreSaid(t *testing.T) {
	sec := uint64(time.Second / time.Microsecond)
	store := report.NewStore("b")
	reg := prometheus.NewRegistry()
	o := opts(t, store)
	o.Registerer = reg
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	line := func(usec uint64, level uint8, msg string) {
		r := rec(usec, msg)
		r.Level = level
		mon.Handle(r, t0)
	}
	// The burst: ten lines of the loop device's flood; two of sda's.
	for i := range 8 {
		line(10*sec+uint64(i), 3, "I/O error, dev loop0, sector 8 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2")
	}
	line(10*sec+sec/2, 3, "I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0")
	line(10*sec+sec/2+1, 3, "I/O error, dev sda, sector 2056 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0")
	// The next error after the rate limit's 5 s: the count of the lines
	// dropped (between the burst's last line and 5 s after its first),
	// then the line.
	line(16*sec, 4, "blk_print_req_error: 37 callbacks suppressed")
	line(16*sec+1, 3, "I/O error, dev sda, sector 4096 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0")
	// Another call site's: counted, not an I/O error line of DisksFailure.
	line(17*sec, 4, "buffer_io_error: 5 callbacks suppressed")
	// Not the kernel's form: not counted.
	line(18*sec, 4, "my_func: 3 callbacks suppressed because")
	line(18*sec, 4, "two words: 3 callbacks suppressed")

	exp := `
# HELP autopilot_health_kernel_suppressed_messages_total Kernel messages the kernel's rate limit (printk_ratelimited and the like) dropped, by the function that printed them, as its "<function>: N callbacks suppressed" lines say.
# TYPE autopilot_health_kernel_suppressed_messages_total counter
autopilot_health_kernel_suppressed_messages_total{function="blk_print_req_error"} 37
autopilot_health_kernel_suppressed_messages_total{function="buffer_io_error"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "autopilot_health_kernel_suppressed_messages_total"); err != nil {
		t.Error(err)
	}
	note := "; the kernel suppressed 37 I/O error lines in that time (its rate limit, shared by every device): the count is a lower bound"
	if c := disksFailure(store); c.Status != report.StatusFalse ||
		c.Message != "the kernel logged 3 disk I/O errors in the last 10m0s (threshold 5)"+note {
		t.Errorf("3 errors counted, 37 lines suppressed: %s %q", c.Status, c.Message)
	}
	// The status is still the count's: two more errors reach the threshold.
	line(20*sec, 3, "I/O error, dev sdb, sector 0 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0")
	line(20*sec+1, 3, "I/O error, dev sdb, sector 8 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0")
	if c := disksFailure(store); c.Status != report.StatusTrue ||
		c.Message != "the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on sda, sdb"+note {
		t.Errorf("5 errors counted, 37 lines suppressed: %s %q", c.Status, c.Message)
	}
	// The suppressed lines are of the burst (dated by its last line, at
	// 10.5 s): out of the window at 610.5 s, when the errors of 16 s and
	// 20 s are still in it.
	mon.Tick(611*sec, t0)
	if c := disksFailure(store); c.Message != "the kernel logged 3 disk I/O errors in the last 10m0s (threshold 5)" {
		t.Errorf("at 611 s: %s %q", c.Status, c.Message)
	}
}

// A restart within the boot keeps what the window said: the suppressed
// lines are saved with the window, in the cursor, and the message after
// the restart is the one before it.
func TestSuppressedIOErrorLinesSurviveARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		now := MonotonicNow()
		recs := [][]byte{
			fmt.Appendf(nil, "3,1,%d,-;I/O error, dev loop0, sector 8 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2\n", now-3000),
			fmt.Appendf(nil, "3,2,%d,-;I/O error, dev sda, sector 8 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0\n", now-2000),
			fmt.Appendf(nil, "4,3,%d,-;blk_print_req_error: 12 callbacks suppressed\n", now-1000),
		}
		want := "the kernel logged 1 disk I/O errors in the last 10m0s (threshold 5); the kernel suppressed 12 I/O error lines in that time (its rate limit, shared by every device): the count is a lower bound"
		for run := range 2 {
			store := report.NewStore("b")
			if _, err := store.Load(dir); err != nil {
				t.Fatal(err)
			}
			mon := NewMonitor(opts(t, store))
			mon.Start(time.Now(), time.Now())
			dev := &fakeDevice{recs: recs}
			rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
				ReadTimeout: 10 * time.Second, Open: func(context.Context, string) (Device, error) { return dev, nil }}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { rd.Run(ctx); close(done) }()
			time.Sleep(time.Minute) // caught up
			synctest.Wait()
			if !mon.caughtUp.Load() {
				t.Fatalf("run %d: not caught up", run)
			}
			if c := disksFailure(store); c.Message != want {
				t.Errorf("run %d: DisksFailure %q, want %q", run, c.Message, want)
			}
			cancel()
			<-done
			if err := store.Save(dir, time.Now()); err != nil {
				t.Fatal(err)
			}
			if run == 1 && mon.Metrics().Records() != 0 {
				t.Errorf("the restart handled %v records again", mon.Metrics().Records())
			}
		}
	})
}

// The rate limit's line in the forms the kernel prints it, and lines that
// only look like it.
func TestParseSuppressed(t *testing.T) {
	for _, c := range []struct {
		msg string
		fn  string
		n   uint64
		ok  bool
	}{
		{"blk_print_req_error: 37 callbacks suppressed", "blk_print_req_error", 37, true},
		{"print_req_error: 4294967295 callbacks suppressed\n", "print_req_error", 4294967295, true}, // "%u" (6.16+)
		{"buffer_io_error: 1 callbacks suppressed", "buffer_io_error", 1, true},
		{"__ratelimit_x2: 0 callbacks suppressed", "__ratelimit_x2", 0, true},
		{": 3 callbacks suppressed", "", 0, false},
		{"2fn: 3 callbacks suppressed", "", 0, false},
		{"two words: 3 callbacks suppressed", "", 0, false},
		{"fn: -3 callbacks suppressed", "", 0, false},
		{"fn: 3 callbacks suppressed because", "", 0, false},
		{"fn:3 callbacks suppressed", "", 0, false},
		{"net_ratelimit: 3 callbacks suppressed", "net_ratelimit", 3, true},
	} {
		fn, n, ok := parseSuppressed([]byte(c.msg))
		if string(fn) != c.fn || n != c.n || ok != c.ok {
			t.Errorf("%q: %q %d %v, want %q %d %v", c.msg, fn, n, ok, c.fn, c.n, c.ok)
		}
	}
}

// A saved count of suppressed lines that does not read costs that count
// (and the window's note says so in the log), never the position.
func TestCursorBadSuppressedKeepsThePosition(t *testing.T) {
	var c cursor
	if err := json.Unmarshal([]byte(`{"seq":7,"have":true,"ioErrorWindow":"@sda 5","ioErrorSuppressed":"12:x"}`), &c); err != nil ||
		c.Seq != 7 || !c.Have || len(c.IOErrors) != 1 || c.Suppressed != nil || c.windowErr != nil || c.suppressedErr == nil {
		t.Errorf("%+v, %v", c, err)
	}
	b, _ := json.Marshal(cursor{Seq: 1, Have: true, Suppressed: []suppression{{5, 37}, {9, 2}}})
	var back cursor
	if err := json.Unmarshal(b, &back); err != nil || len(back.Suppressed) != 2 || back.Suppressed[0] != (suppression{5, 37}) || back.Suppressed[1] != (suppression{9, 2}) {
		t.Errorf("%s: %+v, %v", b, back, err)
	}
}

// The metric's series are bounded: the functions after the first 64 are
// counted as "(other)".
func TestSuppressedFunctionsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	o := opts(t, report.NewStore("b"))
	o.Registerer = reg
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	for i := range 70 {
		mon.Handle(rec(uint64(i+1), fmt.Sprintf("fn_%d: 2 callbacks suppressed", i)), t0)
	}
	mon.Handle(rec(100, "fn_3: 1 callbacks suppressed"), t0)
	if n, err := testutil.GatherAndCount(reg, "autopilot_health_kernel_suppressed_messages_total"); err != nil || n != 65 {
		t.Errorf("%d series (%v), want 65", n, err)
	}
	if v := testutil.ToFloat64(mon.m.suppressed.WithLabelValues(suppressedOther)); v != 12 {
		t.Errorf("(other): %v, want 12 (6 functions, 2 each)", v)
	}
	if v := testutil.ToFloat64(mon.m.suppressed.WithLabelValues("fn_3")); v != 3 {
		t.Errorf("fn_3: %v, want 3", v)
	}
}

// A count of suppressed lines read after a restart is dated as one read
// without it: by the last I/O error line before it, which the run before
// the restart handled (saved with the cursor, ioErrorLastLine). The
// kernel prints the count at the site's next call after its 5 s interval,
// which may be long after the dropped lines: here a minute, six times the
// window. Before, a restart between the two forgot that line and dated the
// count by its own line, and DisksFailure's message said the kernel had
// suppressed 37 I/O error lines in its last 10 s, where the run without
// the restart said nothing.
func TestSuppressedIOErrorLinesDatedAcrossARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := MonotonicNow()
		burst := [][]byte{
			fmt.Appendf(nil, "3,1,%d,-;I/O error, dev loop0, sector 8 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2\n", now-60_000_000),
			fmt.Appendf(nil, "3,2,%d,-;I/O error, dev loop0, sector 16 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2\n", now-59_999_000),
		}
		later := append(slices.Clone(burst),
			fmt.Appendf(nil, "4,3,%d,-;blk_print_req_error: 37 callbacks suppressed\n", now-2000),
			fmt.Appendf(nil, "3,4,%d,-;I/O error, dev sda, sector 8 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0\n", now-1000))
		want := "the kernel logged 1 disk I/O errors in the last 10s (threshold 5)"
		// run reads recs from the cursor saved in dir (none at first) and
		// returns DisksFailure's message.
		run := func(dir string, recs [][]byte) string {
			store := report.NewStore("b")
			if _, err := store.Load(dir); err != nil {
				t.Fatal(err)
			}
			o := opts(t, store)
			o.IOErrorWindow = 10 * time.Second
			mon := NewMonitor(o)
			mon.Start(time.Now(), time.Now())
			dev := &fakeDevice{recs: recs}
			rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
				ReadTimeout: 10 * time.Second, Open: func(context.Context, string) (Device, error) { return dev, nil }}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { rd.Run(ctx); close(done) }()
			time.Sleep(time.Minute) // caught up
			synctest.Wait()
			if !mon.caughtUp.Load() {
				t.Fatal("not caught up")
			}
			cancel()
			<-done
			if err := store.Save(dir, time.Now()); err != nil {
				t.Fatal(err)
			}
			return disksFailure(store).Message
		}
		if got := run(t.TempDir(), later); got != want {
			t.Errorf("without a restart: DisksFailure %q, want %q", got, want)
		}
		dir := t.TempDir()
		run(dir, burst)
		if got := run(dir, later); got != want {
			t.Errorf("with a restart between the burst and the count: DisksFailure %q, want %q", got, want)
		}
	})
}

// Counts whose sum passes the largest uint64 (a state file edited by hand:
// the kernel's counts are at most 2^32-1) say the largest, never a sum
// that wrapped around to a small one.
func TestSuppressedSumDoesNotWrap(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	now := MonotonicNow()
	mon.CaughtUp(now, t0)
	mon.restoreWindow(nil, []suppression{{Usec: now - 2000, N: math.MaxUint64}, {Usec: now - 1000, N: 2}})
	if c := disksFailure(store); !strings.Contains(c.Message, fmt.Sprintf("the kernel suppressed %d I/O error lines", uint64(math.MaxUint64))) {
		t.Errorf("DisksFailure %q, want the largest count", c.Message)
	}
}
