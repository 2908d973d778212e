package kmsg

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// feedIOErrors hands mon one disk I/O error per kernel time in usecs, on
// the device dev(i).
func feedIOErrors(mon *Monitor, usecs []uint64, dev func(i int) string) {
	for i, at := range usecs {
		mon.Handle(rec(at, fmt.Sprintf("I/O error, dev %s, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0", dev(i))), t0)
	}
}

func disksFailure(store *report.Store) report.Condition {
	c, _ := store.Get("DisksFailure")
	return c
}

// A reload that changes io_error_threshold or io_error_window judges the
// errors already counted exactly as a fresh start over the same lines
// would, whichever way and however often the settings change (the window
// kept only the newest `threshold` errors: raising the threshold turned
// DisksFailure False over errors still in the window); the message counts
// every error in the window.
func TestReconfigureJudgesErrorsHeldAsAFreshStart(t *testing.T) {
	sec := uint64(time.Second / time.Microsecond)
	var usecs []uint64
	for i := range 8 {
		usecs = append(usecs, uint64(10+i)*sec) // 10 s .. 17 s
	}
	dev := func(i int) string { return []string{"sda", "sdb"}[i%2] }
	store := report.NewStore("b")
	o := opts(t, store)
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	feedIOErrors(mon, usecs, dev)
	if c := disksFailure(store); c.Status != report.StatusTrue || c.Message != "the kernel logged 8 disk I/O errors in the last 10m0s (threshold 5) on sda, sdb" {
		t.Errorf("8 errors, threshold 5: %+v", c)
	}

	// fresh is what a monitor started with o over the same lines says at
	// kernel time now.
	fresh := func(o Options, now uint64) report.Condition {
		s := report.NewStore("b")
		o.Store = s
		m := NewMonitor(o)
		m.Start(t0, t0)
		m.CaughtUp(0, t0)
		feedIOErrors(m, usecs, dev)
		m.Tick(now, t0)
		return disksFailure(s)
	}
	// 612.5 s: the errors at 10, 11 and 12 s are more than 10 minutes old.
	aged := 612*sec + sec/2
	for _, step := range []struct {
		threshold int
		window    time.Duration
		now       uint64
		status    report.Status
		n         int
	}{
		{7, 10 * time.Minute, 20 * sec, report.StatusTrue, 8},  // raised, still reached
		{8, 10 * time.Minute, 20 * sec, report.StatusTrue, 8},  // raised to exactly the count
		{9, 10 * time.Minute, 20 * sec, report.StatusFalse, 8}, // raised past the count
		{3, 10 * time.Minute, 20 * sec, report.StatusTrue, 8},  // lowered
		{8, 10 * time.Minute, 20 * sec, report.StatusTrue, 8},  // raised again after a lower one
		{5, 10 * time.Minute, aged, report.StatusTrue, 5},      // three aged out
		{6, 10 * time.Minute, aged, report.StatusFalse, 5},     // ... so 6 is not reached
		{6, 20 * time.Minute, aged, report.StatusTrue, 8},      // a wider window counts them again
		{8, 10 * time.Minute, 30 * 60 * sec, report.StatusFalse, 0},
	} {
		o.IOErrorThreshold, o.IOErrorWindow = step.threshold, step.window
		mon.Reconfigure(o)
		mon.Tick(step.now, t0)
		got, want := disksFailure(store), fresh(o, step.now)
		msg := fmt.Sprintf("the kernel logged %d disk I/O errors in the last %s (threshold %d)", step.n, step.window, step.threshold)
		if step.status == report.StatusTrue {
			msg += " on sda, sdb"
		}
		if got.Status != step.status || got.Message != msg {
			t.Errorf("threshold %d, window %s, at %d s, after a reload: %s %q, want %s %q", step.threshold, step.window, step.now/sec, got.Status, got.Message, step.status, msg)
		}
		if got.Status != want.Status || got.Reason != want.Reason || got.Message != want.Message {
			t.Errorf("threshold %d, window %s, at %d s: after a reload %s %q, a fresh start %s %q", step.threshold, step.window, step.now/sec, got.Status, got.Message, want.Status, want.Message)
		}
	}
}

// A flood of disk I/O errors (many more than the window holds) keeps the
// window within its cap (memory does not grow with the flood), the
// condition True at the largest threshold the configuration allows (1000),
// the message saying the count is a lower bound; once the flood ages out the
// errors still in the window are counted exactly, in order, across the
// ring's wrap.
func TestIOErrorFloodBoundedByCap(t *testing.T) {
	const n = 20000
	ms := uint64(time.Millisecond / time.Microsecond)
	store := report.NewStore("b")
	o := opts(t, store)
	o.IOErrorThreshold = 1000
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	usecs := make([]uint64, n)
	for i := range usecs {
		usecs[i] = uint64(1000+i) * ms // 1 s .. 21 s
	}
	// The newest 1000 on sda, those before on sdb.
	dev := func(i int) string {
		if i >= n-1000 {
			return "sda"
		}
		return "sdb"
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	feedIOErrors(mon, usecs, dev)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 256<<10 {
		t.Errorf("heap grew by %d bytes over %d disk I/O errors", grow, n)
	}
	if got := windowLen(mon); got > 1024 {
		t.Errorf("the window holds %d errors, more than its cap", got)
	}
	if c := disksFailure(store); c.Status != report.StatusTrue || c.Message != "the kernel logged at least 1024 disk I/O errors in the last 10m0s (threshold 1000) on sda, sdb" {
		t.Errorf("%d errors, threshold 1000: %+v", n, c)
	}
	span := uint64(10 * time.Minute / time.Microsecond)
	// Exactly the newest 1000 (all sda) within the window, then 999.
	mon.Tick(usecs[n-1000]+span, t0)
	if c := disksFailure(store); c.Status != report.StatusTrue || c.Message != "the kernel logged 1000 disk I/O errors in the last 10m0s (threshold 1000) on sda" {
		t.Errorf("1000 errors left in the window: %+v", c)
	}
	mon.Tick(usecs[n-999]+span, t0)
	if c := disksFailure(store); c.Status != report.StatusFalse || c.Message != "the kernel logged 999 disk I/O errors in the last 10m0s (threshold 1000)" {
		t.Errorf("999 errors left in the window: %+v", c)
	}
	// 1010 within the window: the 10 oldest of them on sdb.
	mon.Tick(usecs[n-1010]+span, t0)
	if c := disksFailure(store); c.Status != report.StatusTrue || c.Message != "the kernel logged 1010 disk I/O errors in the last 10m0s (threshold 1000) on sda, sdb" {
		t.Errorf("1010 errors left in the window: %+v", c)
	}
}

func windowLen(mon *Monitor) int { return mon.window.n }

// Errors older than the window when a later one arrives are still held (up
// to 24 h): a reload that widens the window counts them, as a fresh start
// over the same lines would. A device a reload adds to ignore_devices no
// longer counts, as a fresh start would not have recorded its errors.
func TestReconfigureWidensAndIgnoresAsAFreshStart(t *testing.T) {
	sec := uint64(time.Second / time.Microsecond)
	store := report.NewStore("b")
	o := opts(t, store)
	o.IOErrorThreshold, o.IOErrorWindow = 5, 10*time.Minute
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	feedIOErrors(mon, []uint64{10 * sec, 11 * sec, 12 * sec, 13 * sec, 700 * sec}, func(i int) string { return "sda" })
	if c := disksFailure(store); c.Status != report.StatusFalse {
		t.Fatalf("1 error in the last 10 minutes: %+v", c)
	}
	o.IOErrorWindow = 20 * time.Minute
	mon.Reconfigure(o)
	mon.Tick(701*sec, t0)
	if c := disksFailure(store); c.Status != report.StatusTrue || c.Message != "the kernel logged 5 disk I/O errors in the last 20m0s (threshold 5) on sda" {
		t.Errorf("the window widened to 20 minutes: %+v", c)
	}
	o.IgnoreDevices = []string{"sda"}
	mon.Reconfigure(o)
	mon.Tick(702*sec, t0)
	if c := disksFailure(store); c.Status != report.StatusFalse || c.Message != "the kernel logged 0 disk I/O errors in the last 20m0s (threshold 5)" {
		t.Errorf("sda ignored: %+v", c)
	}
}

// A restart after ignore_devices gained a device (the configuration edited
// while the daemon was down, or a reload with no record read since)
// judges the errors the state file kept as a fresh start over the same
// lines would: the now ignored device's errors do not count. Before, the
// saved window was restored as it was: DisksFailure stayed True, naming
// the device the operator had just told it to ignore, until its errors
// aged out of the window.
func TestRestartDropsTheSavedErrorsOfAnIgnoredDevice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		first := MonotonicNow() - uint64(5*time.Minute/time.Microsecond)
		sf := fmt.Sprintf(`{"version":1,"bootID":"b","savedAt":"2026-01-01T00:00:00Z",`+
			`"conditions":[{"type":"DisksFailure","status":"True","reason":"DiskIOErrors","message":"the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on sdc","lastTransitionTime":"2026-01-01T00:00:00Z"}],`+
			`"parts":{"DisksFailure":{"kmsg":{"type":"DisksFailure","status":"True","reason":"DiskIOErrors","message":"the kernel logged 5 disk I/O errors in the last 10m0s (threshold 5) on sdc","lastTransitionTime":"2026-01-01T00:00:00Z"}}},`+
			`"memos":{"kmsg":{"seq":5,"have":true,"ioErrorWindow":"@sdc %d 1000000 1000000 1000000 1000000"}}}`, first)
		if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(sf), 0o600); err != nil {
			t.Fatal(err)
		}
		store := report.NewStore("b")
		if res, err := store.Load(dir); err != nil || res.Corrupt != nil || res.Restored != 1 {
			t.Fatalf("load: %+v, %v", res, err)
		}
		o := opts(t, store)
		o.IgnoreDevices = append(slices.Clone(DefaultIgnoreDevices), "sdc")
		mon := NewMonitor(o)
		mon.Start(time.Now(), time.Now())
		dev := &fakeDevice{recs: [][]byte{[]byte("6,5,1,-;ordinary chatter\n")}}
		rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
			ReadTimeout: 10 * time.Second, Open: func(context.Context, string) (Device, error) { return dev, nil }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); close(done) }()
		time.Sleep(time.Minute) // caught up
		cancel()
		<-done
		if c := disksFailure(store); c.Status != report.StatusFalse || c.Message != "the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5)" {
			t.Errorf("sdc ignored since the last run: %s/%s %q", c.Status, c.Reason, c.Message)
		}
		if c, _ := rd.snapshot().(cursor); len(c.IOErrors) != 0 {
			t.Errorf("the cursor still keeps the ignored device's errors: %+v", c.IOErrors)
		}
	})
}
