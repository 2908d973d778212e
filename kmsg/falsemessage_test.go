package kmsg

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/report"
)

// A kernel condition's healthy False says what the monitor read. With
// from_boot_start true it read this boot's records still in the ring
// buffer, and says so. With from_boot_start false it began at the end of
// the log and left those records unread: its False says since when it
// read, and that the records before were not read. Before, both said
// "this boot's, as far as the ring buffer still held them", which after a
// start at the end told an operator that a read-only remount logged before
// the daemon's start had been looked for when it had not. So does the
// count of disk I/O errors of DisksFailure, until the window's span has
// passed since the start: before, it said the kernel logged 0 errors in
// the last 10 minutes when those before the start were not read.
func TestFalseSaysWhatWasRead(t *testing.T) {
	for _, c := range []struct {
		fromStart bool
		want      string
		// disks: the kernel's part of DisksFailure, until the window's
		// span has passed since the start.
		disks string
	}{
		{true, "no matching kernel message in the records read (this boot's, as far as the ring buffer still held them)",
			"the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5)"},
		{false, "no matching kernel message since the monitor began reading at the end of the kernel log at 2000-01-01T00:00:00Z (kmsg.from_boot_start = false: the records logged before were not read)",
			"the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5), read since 2000-01-01T00:00:00Z only (kmsg.from_boot_start = false: those logged before were not read)"},
	} {
		t.Run("from_boot_start="+map[bool]string{true: "true", false: "false"}[c.fromStart], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := report.NewStore("b")
				mon := NewMonitor(opts(t, store))
				mon.Start(time.Now(), time.Now())
				dev := &fakeDevice{recs: lines("6,1,1,-;ordinary chatter", "6,2,2,-;more chatter")}
				rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: c.fromStart,
					ReadTimeout: time.Second, Open: func(context.Context, string) (Device, error) { return dev, nil }}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { rd.Run(ctx); close(done) }()
				// The log is read to its end once a read waits out its
				// 250 ms for a record.
				time.Sleep(2 * time.Second)
				synctest.Wait()
				for _, typ := range mon.Conditions() {
					cond, ok := store.Get(typ)
					if !ok || cond.Status != report.StatusFalse {
						t.Fatalf("%s: %+v, want False once the log is read to its end", typ, cond)
					}
					if cond.Message != c.want {
						t.Errorf("%s False says %q, want %q", typ, cond.Message, c.want)
					}
				}
				if p, _ := store.Part(report.SourceKmsg, "DisksFailure"); p.Message != c.disks {
					t.Errorf("DisksFailure's kernel part says %q, want %q", p.Message, c.disks)
				}
				cancel()
				<-done
				// Once the window's span (10 min) has passed since the
				// start, every error it counts was read.
				mon.Tick(MonotonicNow()+uint64(10*time.Minute/time.Microsecond), time.Now())
				if p, _ := store.Part(report.SourceKmsg, "DisksFailure"); p.Message != "the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5)" {
					t.Errorf("10 min after the start, DisksFailure's kernel part says %q", p.Message)
				}
			})
		})
	}
}
