package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/internal/tick"
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

// fakeDevice serves records one per Read, like /dev/kmsg; then it waits
// for its read deadline. failReads makes the first reads fail.
type fakeDevice struct {
	mu        sync.Mutex
	recs      [][]byte
	pos       int
	failReads *atomic.Int64 // reads left that fail (shared across opens)
	readErr   error
	deadline  time.Time
	deadlines int           // SetReadDeadline calls
	set       []time.Time   // the deadlines set
	more      chan struct{} // if set, gets a token when a record is appended
	onRead    func(i int)   // called before record i is returned
	waits     int           // reads that found no record ready and waited
}

// waitsBegun: as the kernel log device's (kmsgFile.waits).
func (d *fakeDevice) waitsBegun() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waits
}

func (d *fakeDevice) Read(p []byte) (int, error) {
	if d.failReads != nil && d.failReads.Add(-1) >= 0 {
		return 0, d.readErr
	}
	d.mu.Lock()
	if d.pos < len(d.recs) {
		i := d.pos
		d.pos++
		d.mu.Unlock()
		if d.onRead != nil {
			d.onRead(i)
		}
		return copy(p, d.recs[i]), nil
	}
	dl, more := d.deadline, d.more
	d.waits++
	d.mu.Unlock()
	if more == nil {
		time.Sleep(time.Until(dl))
		return 0, os.ErrDeadlineExceeded
	}
	select {
	case <-time.After(time.Until(dl)):
		return 0, os.ErrDeadlineExceeded
	case <-more: // a record appended: read it
		return d.Read(p)
	}
}
func (d *fakeDevice) Seek(off int64, whence int) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if whence == io.SeekEnd {
		d.pos = len(d.recs)
	} else {
		d.pos = 0
	}
	return 0, nil
}
func (d *fakeDevice) SetReadDeadline(t time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deadline = t
	d.deadlines++
	d.set = append(d.set, t)
	return nil
}
func (d *fakeDevice) Close() error { return nil }

// The reader sets its read deadline when the wait changes or an eighth of
// it has passed, not for every record: a burst of 2,000 records read at
// once sets it a few times (it set it 2,000 times before).
func TestReaderSetsTheDeadlineOncePerBurst(t *testing.T) {
	const n = 2000
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = fmt.Appendf(nil, "6,%d,%d,-;ordinary chatter\n", i+1, i+1)
	}
	dev := &fakeDevice{recs: recs}
	set := make(chan int, 1)
	dev.onRead = func(i int) {
		if i == n-1 {
			dev.mu.Lock()
			set <- dev.deadlines
			dev.mu.Unlock()
		}
	}
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(time.Now(), time.Now())
	rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
		ReadTimeout: 8 * time.Second, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case got := <-set:
		// A burst read within 31 ms (an eighth of the 250 ms catch-up
		// wait) sets it once; a slow machine a few times more.
		if got > 20 {
			t.Errorf("the read deadline was set %d times for %d records read at once", got, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the records were not read")
	}
}

// Once the backlog is read, a read that waits for a record ends at the
// next point of the read timeout's grid, so the reader's periodic wake-up
// falls together with the daemon's others (tick.Grid); before, 10 s from
// whenever it last set one.
func TestReaderWaitsOnTheGrid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		grid := tick.New(start.Add(-3 * time.Second)) // points at 7 s, 17 s, ... from start
		dev := &fakeDevice{recs: [][]byte{[]byte("6,1,1,-;ordinary chatter\n")}, more: make(chan struct{}, 1)}
		// A record logged at 12 s, once the backlog is read: read at
		// once, and the deadline stays on the grid.
		read12 := make(chan time.Duration, 1)
		dev.onRead = func(i int) {
			if i == 1 {
				read12 <- time.Since(start)
			}
		}
		time.AfterFunc(12*time.Second, func() {
			dev.mu.Lock()
			dev.recs = append(dev.recs, []byte("6,2,12000000,-;more chatter\n"))
			dev.mu.Unlock()
			dev.more <- struct{}{}
		})
		store := report.NewStore("b")
		mon := NewMonitor(opts(t, store))
		mon.Start(time.Now(), time.Now())
		rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
			ReadTimeout: 10 * time.Second, Grid: grid, Open: func(context.Context, string) (Device, error) { return dev, nil }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); close(done) }()
		time.Sleep(30 * time.Second)
		var got []time.Duration
		dev.mu.Lock()
		for _, d := range dev.set {
			got = append(got, d.Sub(start))
		}
		dev.mu.Unlock()
		cancel()
		<-done
		select {
		case at := <-read12:
			if at != 12*time.Second {
				t.Errorf("the record logged at 12 s was read at %s", at)
			}
		default:
			t.Error("the record logged at 12 s was not read")
		}
		// The catch-up wait (250 ms from the start), then the grid.
		want := []time.Duration{catchUpWait, 7 * time.Second, 17 * time.Second, 27 * time.Second, 37 * time.Second}
		if !slices.Equal(got, want) {
			t.Errorf("read deadlines at %v after the start, want %v", got, want)
		}
	})
}

// countingLog counts the records logged at each level.
type countingLog struct {
	mu    sync.Mutex
	lines []string
}

func (c *countingLog) Enabled(context.Context, slog.Level) bool { return true }
func (c *countingLog) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, r.Level.String()+" "+r.Message)
	return nil
}
func (c *countingLog) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *countingLog) WithGroup(string) slog.Handler      { return c }
func (c *countingLog) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// The device opens, then every read fails (here: a directory, EISDIR): the
// reader backs off as it does for open errors, logs the error once, and
// never reports progress. It spun before: 26,618 reopens and log lines in
// 300 ms, /healthz green.
func TestReaderBacksOffWhenEveryReadFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := report.NewStore("b")
		mon := NewMonitor(opts(t, store))
		var beats, opens atomic.Int64
		lg := &countingLog{}
		dir := t.TempDir()
		// From the start: a directory sought to its end reads EINVAL, to
		// its start EISDIR, and each error text is logged once; every
		// reopen seeks to the start (see Run).
		rd := &Reader{Path: dir, Monitor: mon, Log: slog.New(lg), ReadTimeout: 10 * time.Second, FromStart: true,
			Progress: func(string, time.Duration) { beats.Add(1) },
			Open: func(_ context.Context, p string) (Device, error) {
				opens.Add(1)
				return os.OpenFile(p, os.O_RDONLY, 0) // a directory: reads fail with EISDIR
			}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		rd.Run(ctx)
		// 1 s doubling to 1 min, half of it jittered: at most 2+4+...+32 s
		// before the waits reach a minute, then one a minute at least
		// every 30 s: well under 30 opens in 10 minutes.
		if n := opens.Load(); n < 5 || n > 30 {
			t.Errorf("%d opens in 10 minutes of failing reads; want a backoff (5..30)", n)
		}
		if beats.Load() != 0 || mon.Metrics().ReaderUp() {
			t.Errorf("progress %d, up %v, while every read fails", beats.Load(), mon.Metrics().ReaderUp())
		}
		if lines := lg.all(); len(lines) != 1 || !strings.Contains(lines[0], "reading the kernel log failed") {
			t.Errorf("log lines: %q; want the error once", lines)
		}
		if got := mon.Metrics().Reopens(); got != float64(opens.Load()) {
			t.Errorf("reopens metric %v, opens %d", got, opens.Load())
		}
	})
}

// Reads fail for a while, then work again: the reader backs off while they
// fail, then reads the records, reports progress again and says once that
// the log is readable again.
func TestReaderRecoversAfterReadErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := report.NewStore("b")
		mon := NewMonitor(opts(t, store))
		mon.Start(t0, t0)
		var fails atomic.Int64
		fails.Store(5)
		dev := &fakeDevice{failReads: &fails, readErr: syscall.EIO,
			recs: [][]byte{[]byte("3,1,1000,-;EXT4-fs (sda1): Remounting filesystem read-only\n")}}
		var beats atomic.Int64
		lg := &countingLog{}
		rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(lg), ReadTimeout: 10 * time.Second, FromStart: true,
			Progress: func(string, time.Duration) { beats.Add(1) },
			Open:     func(context.Context, string) (Device, error) { return dev, nil }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); close(done) }()
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
			t.Errorf("after recovery: %+v", c)
		}
		if !mon.Metrics().ReaderUp() || beats.Load() == 0 {
			t.Errorf("after recovery: up %v, progress %d", mon.Metrics().ReaderUp(), beats.Load())
		}
		cancel()
		<-done
		var errs, back int
		for _, l := range lg.all() {
			switch {
			case strings.HasPrefix(l, "ERROR"):
				errs++
			case strings.Contains(l, "readable again"):
				back++
			}
		}
		if errs != 1 || back != 1 {
			t.Errorf("log: %q; want one error line and one recovery line", lg.all())
		}
		if got := mon.Metrics().Reopens(); got != 5 {
			t.Errorf("reopens %v, want 5 (one per failed read)", got)
		}
	})
}

// The cursor never runs ahead of the conditions its records set: the state
// is saved at every point between reading a record and the next save (as
// the record is read, while its condition is being set, after), the daemon
// "crashes" there, and a new one starts from what was saved: every kernel
// condition is True, with the transition time of its line, and no event is
// handled twice. Before, the cursor was saved on its own, ahead of the state.
func TestCursorNeverRunsAheadOfTheState(t *testing.T) {
	lines := []string{
		"6,1,1000000,-;ordinary line",
		"3,2,2000000,-;EXT4-fs (vda1): Remounting filesystem read-only",
		"4,3,3000000,-;EXT4-fs warning (device vda1): ext4_end_bio:343: I/O error 10 writing to inode 12",
		"3,4,4000000,-;INFO: task kubelet:1234 blocked for more than 120 seconds.",
		"6,5,5000000,-;another ordinary line",
		"3,6,6000000,-;device-mapper: verity: 252:0: data block 7 is corrupted",
	}
	recs := make([][]byte, len(lines))
	for i, l := range lines {
		recs[i] = []byte(l + "\n")
	}
	bootWall := time.Now().Add(-time.Duration(MonotonicNow()) * time.Microsecond)
	want := map[string]time.Time{ // condition -> its line's time (the reader's wall clock of kernel time)
		"ReadonlyFilesystem": bootWall.Add(2 * time.Second),
		"KernelDeadlock":     bootWall.Add(4 * time.Second),
		"VerityCorruption":   bootWall.Add(6 * time.Second),
	}
	// The crash points, for each record: as the device returns it (all
	// earlier records handled), as the monitor begins to handle it (read,
	// nothing set yet), and inside the store's observer while its condition
	// is being set (set, the cursor not moved yet).
	type point struct {
		rec   int
		where string
	}
	var points []point
	for i, l := range lines {
		points = append(points, point{i, "read"}, point{i, "handle"})
		if !strings.Contains(l, "ordinary") && !strings.Contains(l, "warning") {
			points = append(points, point{i, "set"}) // a record that sets a condition
		}
	}
	for _, p := range points {
		t.Run(fmt.Sprintf("record%d/%s", p.rec+1, p.where), func(t *testing.T) {
			dir := t.TempDir()
			run := func(crash *point) (*report.Store, *eventCounter) {
				store := report.NewStore("boot")
				ev := &eventCounter{}
				store.Observe(ev)
				if _, err := store.Load(dir); err != nil {
					t.Fatal(err)
				}
				mon := NewMonitor(opts(t, store))
				mon.Start(time.Now(), bootWall)
				dev := &fakeDevice{recs: recs}
				ctx, cancel := context.WithCancel(context.Background())
				saved := make(chan struct{})
				save := func() {
					if err := store.Save(dir, time.Now()); err != nil {
						t.Error(err)
					}
					close(saved)
					cancel() // the crash: nothing after this point is saved
				}
				if crash != nil && crash.where == "read" {
					dev.onRead = func(i int) {
						if i == crash.rec {
							save()
						}
					}
				}
				if crash != nil && crash.where == "handle" {
					mon.beforeHandle = func(r Record) {
						if r.Seq == uint64(crash.rec+1) {
							save()
						}
					}
				}
				if crash != nil && crash.where == "set" {
					ev.onChange = func(c report.Condition) {
						if dev.read()-1 == crash.rec && c.Status == report.StatusTrue {
							save()
						}
					}
				}
				rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
					ReadTimeout: 20 * time.Millisecond, Open: func(context.Context, string) (Device, error) { return dev, nil }}
				done := make(chan struct{})
				go func() { rd.Run(ctx); close(done) }()
				if crash != nil {
					select {
					case <-saved:
					case <-time.After(10 * time.Second):
						t.Fatal("no crash point reached")
					}
				} else {
					deadline := time.Now().Add(10 * time.Second)
					for dev.read() < len(recs) && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond) // until the device is drained
					}
					cancel()
				}
				<-done
				return store, ev
			}
			_, before := run(&p)
			store, after := run(nil)
			for ty, at := range want {
				c, _ := store.Get(ty)
				// Each run reads the boot's wall time anew (microseconds apart).
				if d := c.LastTransitionTime.Sub(at); c.Status != report.StatusTrue || d < -10*time.Millisecond || d > 10*time.Millisecond {
					t.Errorf("%s after the restart: %s since %s; want True since %s", ty, c.Status, c.LastTransitionTime, at)
				}
			}
			if after.falseAfterTrue {
				t.Error("a condition went from True to False across the restart")
			}
			// Ext4Warning is record 3: handled exactly once over both runs
			// unless the crash came before the cursor passed it (then the
			// second run handles it, once).
			if n := before.events + after.events; n < 1 || n > 2 || (n == 2 && p.rec > 2) {
				t.Errorf("events: %d before the crash, %d after (crash at %+v)", before.events, after.events, p)
			}
		})
	}
}

func (d *fakeDevice) read() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pos
}

type eventCounter struct {
	mu             sync.Mutex
	events         int // Ext4Warning events
	falseAfterTrue bool
	onChange       func(report.Condition)
}

func (e *eventCounter) ConditionChanged(prev *report.Condition, cur report.Condition) {
	e.mu.Lock()
	if prev != nil && prev.Status == report.StatusTrue && cur.Status != report.StatusTrue {
		e.falseAfterTrue = true
	}
	f := e.onChange
	e.mu.Unlock()
	if f != nil {
		f(cur)
	}
}
func (e *eventCounter) ConditionRestored(report.Condition) {}
func (e *eventCounter) EventEmitted(ev report.Event) {
	if ev.Reason != "Ext4Warning" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events++
}

// What is not a character device is never the kernel log: refused at once
// with what it is, and a FIFO does not block the open (it blocked the
// daemon and its shutdown before); nor is a character device other than
// 1:11 (/dev/null ended, /dev/zero made check hang).
func TestOpenDeviceRefusesWhatIsNotTheKernelLog(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("6,1,1,-;line\n"), 0o644)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{dir: "is a directory", file: "is a regular file", fifo: "is a FIFO"} {
		done := make(chan error, 1)
		go func() { _, err := Open(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want+", not a character device") {
				t.Errorf("%s: %v", path, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("opening %s blocked", path)
		}
	}
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(t0, t0)
	// Character devices that are not the kernel log (they end, or never
	// stop with garbage): refused by their device numbers.
	for _, dev := range []string{"/dev/null", "/dev/zero", "/dev/urandom"} {
		if _, err := Scan(dev, mon); err == nil || !strings.Contains(err.Error(), "not the kernel log (/dev/kmsg is 1:11)") {
			t.Errorf("%s: %v", dev, err)
		}
	}
}

// CheckDevice (config validate's) says what Open says of what is not the
// kernel log, without opening it, and of a path that is not there.
func TestCheckDeviceSaysWhatOpenSays(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("6,1,1,-;line\n"), 0o644)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir, file, fifo, "/dev/null"} {
		_, open := Open(path)
		if err := CheckDevice(path); err == nil || open == nil || err.Error() != open.Error() {
			t.Errorf("CheckDevice(%s) = %v, Open: %v", path, err, open)
		}
	}
	missing := filepath.Join(dir, "nonexistent-kmsg")
	if err := CheckDevice(missing); err == nil || err.Error() != "stat "+missing+": no such file or directory" {
		t.Errorf("CheckDevice(%s) = %v", missing, err)
	}
	// The kernel log itself, where this host shows it (not in a container
	// without devices: there CheckDevice must say it is missing).
	_, statErr := os.Stat("/dev/kmsg")
	if err := CheckDevice("/dev/kmsg"); (err == nil) != (statErr == nil) {
		t.Errorf("CheckDevice(/dev/kmsg) = %v, stat: %v", err, statErr)
	}
}

// A device whose reads work once after each open, then fail: the reader
// never reaches the end of the log, so it keeps backing off (it reset the
// backoff on every good read before: 16 reopens and 58 log lines in 12 s),
// logs the error once, and the kernel conditions stay Unknown.
func TestReaderBacksOffWhenReadsWorkThenFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := report.NewStore("b")
		mon := NewMonitor(opts(t, store))
		mon.Start(t0, t0)
		var opens atomic.Int64
		lg := &countingLog{}
		rd := &Reader{Path: "/dev/flaky", Monitor: mon, Log: slog.New(lg), ReadTimeout: 10 * time.Second, FromStart: true,
			Open: func(context.Context, string) (Device, error) {
				opens.Add(1)
				return &flakyDevice{fakeDevice: fakeDevice{recs: [][]byte{[]byte("6,1,1,-;ordinary\n")}, readErr: syscall.EIO}}, nil
			}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		rd.Run(ctx)
		if n := opens.Load(); n > 30 {
			t.Errorf("%d opens in 10 minutes; want a backoff", n)
		}
		var errs int
		for _, l := range lg.all() {
			if strings.HasPrefix(l, "ERROR") {
				errs++
			}
			if strings.Contains(l, "readable again") {
				t.Errorf("logged recovery of a device that never worked: %q", l)
			}
		}
		if errs != 1 {
			t.Errorf("log: %q; want the error once", lg.all())
		}
		if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusUnknown || c.Reason != report.ReasonCheckFailed {
			t.Errorf("KernelDeadlock while the device fails: %+v", c)
		}
	})
}

// flakyDevice serves its records, then fails every read.
type flakyDevice struct{ fakeDevice }

func (d *flakyDevice) Read(p []byte) (int, error) {
	d.mu.Lock()
	left := d.pos < len(d.recs)
	d.mu.Unlock()
	if left {
		return d.fakeDevice.Read(p)
	}
	return 0, d.readErr
}

// busyDevice never pauses: a record for every read, stamped now.
type busyDevice struct{ seq uint64 }

func (d *busyDevice) Read(p []byte) (int, error) {
	d.seq++
	return copy(p, fmt.Sprintf("6,%d,%d,-;ordinary chatter\n", d.seq, MonotonicNow())), nil
}
func (d *busyDevice) Seek(int64, int) (int64, error)  { return 0, nil }
func (d *busyDevice) SetReadDeadline(time.Time) error { return nil }
func (d *busyDevice) Close() error                    { return nil }

// A kernel log that never pauses (a chatty driver) is still read to its
// end: a record logged after the open means the backlog is done. Before,
// the reader waited for a pause that never came (kernel conditions stayed
// Unknown, and check hung).
func TestBusyLogIsCaughtUp(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(time.Now(), time.Now())
	rd := &Reader{Path: "busy", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
		ReadTimeout: time.Second, Open: func(context.Context, string) (Device, error) { return &busyDevice{}, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.After(10 * time.Second)
	for {
		changed := store.Changed() // before the Get: a change between them still wakes the loop
		if c, _ := store.Get("KernelDeadlock"); c.Status == report.StatusFalse {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			c, _ := store.Get("KernelDeadlock")
			t.Fatalf("a busy log was never read to its end: %+v", c)
		}
	}
}

// overrunDevice is a fakeDevice whose ring buffer overwrote records once:
// the read at record index at fails with EPIPE, as /dev/kmsg's does, and
// the next read returns the oldest record left.
type overrunDevice struct {
	fakeDevice
	at   int
	done bool
}

func (d *overrunDevice) Read(p []byte) (int, error) {
	d.mu.Lock()
	if d.pos == d.at && !d.done {
		d.done = true
		d.mu.Unlock()
		return 0, syscall.EPIPE
	}
	d.mu.Unlock()
	return d.fakeDevice.Read(p)
}

// Records the ring buffer overwrote before the reader got to them (EPIPE,
// then a jump in sequence numbers) are counted exactly, by the gap, and
// logged once; nothing else is lost or counted twice.
func TestReaderCountsOverwrittenRecordsByTheGap(t *testing.T) {
	var recs [][]byte
	for _, seq := range []int{1, 2, 3, 8, 9} { // 4-7 overwritten
		recs = append(recs, fmt.Appendf(nil, "6,%d,%d,-;ordinary chatter\n", seq, seq))
	}
	dev := &overrunDevice{fakeDevice: fakeDevice{recs: recs}, at: 3}
	mon, logs := readAllThenStop(t, report.NewStore("b"), dev, &dev.fakeDevice, true)
	if lost, n := mon.Metrics().Lost(), mon.Metrics().Records(); lost != 4 || n != 5 {
		t.Errorf("lost %v, records %v; want 4 and 5", lost, n)
	}
	if c := strings.Count(logs, "kernel log records were overwritten before they could be read"); c != 1 || !strings.Contains(logs, "lost=4 after_seq=3") {
		t.Errorf("%d warnings:\n%s", c, logs)
	}
}

// A record that does not parse is a parse error, not also lost: its
// sequence number is no gap (it was counted in both, and logged as
// overwritten records, though nothing was overrun). A real overrun after one
// still counts the records overwritten, and only those.
func TestMalformedRecordIsNotCountedLost(t *testing.T) {
	for _, c := range []struct {
		name       string
		recs       []string
		lost, errs float64
		warnings   int
	}{
		{"bad timestamp", []string{"6,1,1,-;ordinary", "6,2,x,-;bad timestamp", "6,3,3,-;ordinary"}, 0, 1, 0},
		{"no header", []string{"6,1,1,-;ordinary", "garbage", "6,3,3,-;ordinary"}, 0, 1, 0},
		{"two in a row", []string{"6,1,1,-;ordinary", "6,2;short header", "6,3,3;short header", "6,4,4,-;ordinary"}, 0, 2, 0},
		// 4 and 5 overwritten after the malformed 3.
		{"then an overrun", []string{"6,1,1,-;ordinary", "6,2,2,-;ordinary", "6,3,3;short header", "6,6,6,-;ordinary"}, 2, 1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var recs [][]byte
			for _, r := range c.recs {
				recs = append(recs, []byte(r+"\n"))
			}
			dev := &fakeDevice{recs: recs}
			mon, logs := readAllThenStop(t, report.NewStore("b"), dev, dev, true)
			if lost, errs := mon.Metrics().Lost(), report.Value(mon.m.parseErrors); lost != c.lost || errs != c.errs {
				t.Errorf("lost %v, parse errors %v; want %v and %v", lost, errs, c.lost, c.errs)
			}
			if n := strings.Count(logs, "kernel log records were overwritten"); n != c.warnings {
				t.Errorf("%d warnings, want %d:\n%s", n, c.warnings, logs)
			}
		})
	}
}

// A storm that overruns the ring buffer every few records: the first gap
// is a journal line at once, the next ones within a minute are summed into
// one line written when the minute has passed; every lost record is
// counted as it is found.
func TestGapWarningsAreBounded(t *testing.T) {
	var g gapLog
	t0 := time.Unix(1_700_000_000, 0)
	if s := g.gap(t0, 4, 3); s != (gapSum{lost: 4, gaps: 1, afterSeq: 3}) {
		t.Fatalf("first gap: %+v", s)
	}
	for i := range 100 {
		if s := g.gap(t0.Add(time.Duration(i)*100*time.Millisecond), 2, uint64(100+10*i)); s.gaps != 0 {
			t.Fatalf("gap %d within the minute logged: %+v", i, s)
		}
	}
	if s := g.flush(t0.Add(59 * time.Second)); s.gaps != 0 {
		t.Fatalf("flushed before the minute: %+v", s)
	}
	if s := g.flush(t0.Add(61 * time.Second)); s != (gapSum{lost: 200, gaps: 100, afterSeq: 100}) {
		t.Fatalf("after the minute: %+v", s)
	}
	if s := g.flush(t0.Add(200 * time.Second)); s.gaps != 0 {
		t.Fatalf("nothing pending, yet: %+v", s)
	}
	if s := g.gap(t0.Add(90*time.Second), 1, 5000); s.gaps != 0 {
		t.Fatalf("a gap 29 s after the last line: %+v", s)
	}
	if s := g.gap(t0.Add(122*time.Second), 1, 6000); s != (gapSum{lost: 2, gaps: 2, afterSeq: 5000}) {
		t.Fatalf("a gap after the minute: %+v", s)
	}

	// Through the reader: three gaps in a row are a line at once and, when
	// the reader stops, one for the other two; all 12 lost records are
	// counted.
	var recs [][]byte
	for _, seq := range []int{1, 2, 3, 8, 9, 14, 15, 20} {
		recs = append(recs, fmt.Appendf(nil, "6,%d,%d,-;ordinary chatter\n", seq, seq))
	}
	dev := &fakeDevice{recs: recs}
	mon, logs := readAllThenStop(t, report.NewStore("b"), dev, dev, true)
	if lost := mon.Metrics().Lost(); lost != 12 {
		t.Errorf("lost %v, want 12", lost)
	}
	if c := strings.Count(logs, "kernel log records were overwritten"); c != 2 || !strings.Contains(logs, "lost=4 after_seq=3") ||
		!strings.Contains(logs, "lost=8 gaps=2 first_after_seq=9") {
		t.Errorf("%d warnings:\n%s", c, logs)
	}
}

// readAllThenStop runs a reader of store's monitor on dev (its records from
// the boot's start when fromStart) until the last of dev's records is read,
// then stops it; it returns the monitor and the reader's log.
func readAllThenStop(t *testing.T, store *report.Store, dev Device, fd *fakeDevice, fromStart bool) (*Monitor, string) {
	t.Helper()
	read := make(chan struct{})
	fd.onRead = func(i int) {
		if i == len(fd.recs)-1 {
			close(read)
		}
	}
	mon := NewMonitor(opts(t, store))
	mon.Start(time.Now(), time.Now())
	var logs testenv.SyncBuffer
	rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(&logs, nil)), FromStart: fromStart,
		ReadTimeout: 8 * time.Second, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the records were not read")
	}
	cancel()
	<-done
	return mon, logs.String()
}

// eventTimes records the time of each event emitted.
type eventTimes struct {
	mu    sync.Mutex
	times map[string]time.Time // reason -> time
}

func (e *eventTimes) ConditionChanged(*report.Condition, report.Condition) {}
func (e *eventTimes) ConditionRestored(report.Condition)                   {}
func (e *eventTimes) EventEmitted(ev report.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.times == nil {
		e.times = map[string]time.Time{}
	}
	e.times[ev.Reason] = ev.Time
}

// shiftedClockReader runs a Reader (in the test's synctest bubble, stopped
// at its end) on a fake device holding first, whose wall clock is the
// bubble's shifted by *shift (a step of the clock, a suspend), with a
// monitor over a store whose events' times evs records.
func shiftedClockReader(t *testing.T, shift *atomic.Int64, first string) (wall func() time.Time, dev *fakeDevice, store *report.Store, evs *eventTimes, mon *Monitor) {
	t.Helper()
	wall = func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	dev = &fakeDevice{recs: [][]byte{[]byte(first)}, more: make(chan struct{}, 1)}
	store = report.NewStore("b")
	evs = &eventTimes{}
	store.Observe(evs)
	mon = NewMonitor(opts(t, store))
	mon.Start(wall(), wall())
	rd := &Reader{Path: "fake", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), FromStart: true,
		ReadTimeout: 10 * time.Second, Wall: wall, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return wall, dev, store, evs, mon
}

// A record's wall time (its condition's lastTransitionTime, its Event's
// timestamps, the status's last record) is the wall clock as it is when the
// record is handled, less the kernel time since: the wall clock stepped
// while the daemon runs (chrony's makestep after a boot whose RTC ran
// ahead, a VM resumed after a pause) does not date every later record off
// by the step. Before, the wall time of kernel time 0 was read once at the
// reader's start: after the clock was stepped back an hour, a kernel
// deadlock found then showed on the Node as True since an hour ahead.
// (synctest's clock moves while the kernel's does not: the records' kernel
// time is MonotonicNow as they are logged, and the minutes the fake clock
// passes add to the step.)
func TestRecordTimesFollowAWallClockStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var step atomic.Int64 // how far the wall clock was stepped
		wall, dev, store, evs, mon := shiftedClockReader(t, &step, "6,1,1,-;ordinary chatter\n")
		time.Sleep(time.Minute) // caught up
		step.Store(int64(-time.Hour))
		time.Sleep(time.Minute)
		usec := MonotonicNow() // the kernel's time of the records: now
		dev.mu.Lock()
		dev.recs = append(dev.recs,
			fmt.Appendf(nil, "3,2,%d,-;INFO: task kubelet:1234 blocked for more than 120 seconds.\n", usec),
			fmt.Appendf(nil, "4,3,%d,-;EXT4-fs warning (device vda1): ext4_end_bio:343: I/O error 10 writing to inode 12\n", usec))
		dev.mu.Unlock()
		dev.more <- struct{}{}
		time.Sleep(time.Second)
		want := wall().Round(0)
		near := func(what string, got time.Time) {
			t.Helper()
			if d := got.Round(0).Sub(want); d < -2*time.Second || d > 2*time.Second {
				t.Errorf("%s: %s, want about %s (the wall clock when the record was logged)", what, got.Round(0), want)
			}
		}
		c, _ := store.Get("KernelDeadlock")
		if c.Status != report.StatusTrue {
			t.Fatalf("KernelDeadlock %s, want True", c.Status)
		}
		near("KernelDeadlock's lastTransitionTime", c.LastTransitionTime)
		evs.mu.Lock()
		at, ok := evs.times["Ext4Warning"]
		evs.mu.Unlock()
		if !ok {
			t.Fatal("no Ext4Warning event")
		}
		near("the Ext4Warning event's time", at)
		_, _, last, _ := mon.LastRecord()
		near("the last record's wall time", last)
	})
}

// A suspend (or a wall clock step) moves the wall clock but not the
// monotonic one, which the kernel's times and the reader's "once a second"
// follow: the records read right after the resume (a suspend freezes the
// daemon just after it read the "PM: suspend entry" lines, so it had read
// the wall clock less than a second of monotonic time before) were dated by
// the wall time of kernel time 0 read before the suspend, as long before as
// the suspend lasted.
func TestRecordTimesFollowASuspend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var suspended atomic.Int64 // how long the node slept: the wall clock moved, the monotonic clock did not
		wall, dev, _, evs, mon := shiftedClockReader(t, &suspended, "6,1,1,-;PM: suspend entry (deep)\n")
		time.Sleep(300 * time.Millisecond) // caught up, well within a second of the last record
		suspended.Store(int64(8 * time.Hour))
		usec := MonotonicNow() // the kernel's time of the record: now
		dev.mu.Lock()
		dev.recs = append(dev.recs,
			fmt.Appendf(nil, "3,2,%d,-;ata1.00: exception Emask 0x10 SAct 0x0 SErr 0x4050000 action 0xe frozen\n", usec))
		dev.mu.Unlock()
		dev.more <- struct{}{}
		synctest.Wait()
		want := wall().Round(0)
		evs.mu.Lock()
		at, ok := evs.times["AtaError"]
		evs.mu.Unlock()
		if !ok {
			t.Fatal("no AtaError event")
		}
		if d := at.Round(0).Sub(want); d < -2*time.Second || d > 2*time.Second {
			t.Errorf("the AtaError event logged after the resume: %s, want about %s (off by %s)", at.Round(0), want, -d)
		}
		_, _, last, _ := mon.LastRecord()
		if d := last.Round(0).Sub(want); d < -2*time.Second || d > 2*time.Second {
			t.Errorf("the last record's wall time: %s, want about %s", last.Round(0), want)
		}
	})
}

// With from_boot_start false the reader starts at the end of the log; when
// it must reopen the device before it has handled a record (a read that
// failed, a device it could not open at first), the records logged since
// the start, during the failure and its backoff, are read after the
// reopen, and those logged before the start are still not. Before, the
// reopen sought to the end again: the kernel error logged meanwhile was
// lost, and counted nowhere. Here the first open never reads the ring
// buffer to its end (it fails, or its first read does), so no sequence
// number says where the start was: the records' stamps do (see
// TestReopenWithoutACursorTellsTheStartBySequence for the first open that
// reads it).
func TestReopenWithoutACursorKeepsTheRecordsSinceTheStart(t *testing.T) {
	for _, c := range []struct {
		name      string
		openFails int64 // opens that fail first
		readFails int64 // reads that fail after the open
		// overwritten: the ring overwrote the first two records logged
		// since the start (seq 3 and 4) before the reopen read them: the
		// gap after the last record of before the start counts them.
		overwritten bool
	}{
		{"a read fails", 0, 1, false},
		{"the first open fails", 1, 0, false},
		{"records since the start overwritten", 0, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := report.NewStore("b")
				mon := NewMonitor(opts(t, store))
				mon.Start(t0, t0)
				var readFails, openFails atomic.Int64
				readFails.Store(c.readFails)
				openFails.Store(c.openFails)
				// Logged before the daemon started (kernel times 1 and 2 µs):
				// from_boot_start false leaves them.
				od := &overrunDevice{fakeDevice: fakeDevice{failReads: &readFails, readErr: syscall.EIO, recs: [][]byte{
					[]byte("3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.\n"),
					[]byte("6,2,2,-;ordinary chatter\n"),
				}}, at: -1}
				dev := &od.fakeDevice
				seq, lost := 3, 0.0
				if c.overwritten {
					od.at = 2 // EPIPE, then seq 5
					seq, lost = 5, 2
				}
				rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
					ReadTimeout: 10 * time.Second,
					Open: func(context.Context, string) (Device, error) {
						if openFails.Add(-1) >= 0 {
							return nil, syscall.ENOENT
						}
						return od, nil
					}}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { rd.Run(ctx); close(done) }()
				synctest.Wait() // the reader waits out its backoff
				usec := MonotonicNow()
				dev.mu.Lock()
				dev.recs = append(dev.recs,
					fmt.Appendf(nil, "6,%d,%d,-;ordinary chatter\n", seq, usec),
					fmt.Appendf(nil, "3,%d,%d,-;EXT4-fs (sda1): Remounting filesystem read-only\n", seq+1, usec+1))
				dev.mu.Unlock()
				time.Sleep(time.Minute)
				synctest.Wait()
				cancel()
				<-done
				if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
					t.Errorf("the remount logged during the backoff: ReadonlyFilesystem %s (%s)", c.Status, c.Message)
				}
				if c, _ := store.Get("KernelDeadlock"); c.Status != report.StatusFalse {
					t.Errorf("a line logged before the start: KernelDeadlock %s, want False (from_boot_start false)", c.Status)
				}
				if n, l := mon.Metrics().Records(), mon.Metrics().Lost(); n != 2 || l != lost {
					t.Errorf("%v records handled, %v lost; want 2 (seq %d and %d) and %v", n, l, seq, seq+1, lost)
				}
			})
		})
	}
}

// A reopen without a cursor (from_boot_start false) that finds no record of
// before the start left in the ring buffer cannot tell how many records
// logged since the start the ring overwrote before they were read (the
// gap's base is gone too): it says so, once, rather than nothing. Before,
// the lost records were neither counted nor said. (The first read of the
// first open fails here: a first open that read the ring to its end knows
// the base's sequence number, and counts the gap from it.)
func TestReopenWithoutACursorSaysWhenTheGapBaseIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mon := NewMonitor(opts(t, report.NewStore("b")))
		mon.Start(t0, t0)
		var readFails atomic.Int64
		readFails.Store(1)
		dev := &fakeDevice{failReads: &readFails, readErr: syscall.EIO, recs: [][]byte{
			[]byte("6,1,1,-;ordinary chatter\n"),
			[]byte("6,2,2,-;ordinary chatter\n"),
		}}
		lg := &countingLog{}
		rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(lg), ReadTimeout: 10 * time.Second,
			Open: func(context.Context, string) (Device, error) { return dev, nil }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rd.Run(ctx); close(done) }()
		synctest.Wait() // the reader waits out its backoff
		// Meanwhile the ring overwrote everything up to seq 8: 1 and 2 of
		// before the start, 3 to 8 of since.
		usec := MonotonicNow()
		dev.mu.Lock()
		dev.recs = [][]byte{
			fmt.Appendf(nil, "6,9,%d,-;ordinary chatter\n", usec),
			fmt.Appendf(nil, "3,10,%d,-;EXT4-fs (sda1): Remounting filesystem read-only\n", usec+1),
		}
		dev.pos = 0
		dev.mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		cancel()
		<-done
		if n := mon.Metrics().Records(); n != 2 {
			t.Errorf("%v records handled, want 2 (seq 9 and 10)", n)
		}
		var said int
		for _, l := range lg.all() {
			if strings.Contains(l, "WARN") && strings.Contains(l, "overwritten") {
				said++
			}
		}
		if said != 1 {
			t.Errorf("%d warnings that records since the start may be overwritten, want 1:\n%s", said, strings.Join(lg.all(), "\n"))
		}
	})
}

// With from_boot_start false, which records a reopen before any record was
// handled reads is told by sequence number, not by the kernel's timestamps:
// the first open reads the ring buffer to its end without handling it, and
// the last record there is the base. The kernel's clock (local_clock) may
// run apart from CLOCK_MONOTONIC by more than a second on a host that has
// been up long (and the two may count a suspend apart): a record logged
// after the first open but stamped before the start is handled, one in the
// ring at the first open but stamped after the start is not, and what the
// ring overwrote after the base is counted lost, even when the base itself
// was overwritten. Before, the reopen compared the stamps with the start
// (less a second): the first was skipped uncounted, the second set a stale
// condition against from_boot_start = false.
func TestReopenWithoutACursorTellsTheStartBySequence(t *testing.T) {
	ahead := MonotonicNow() + uint64(time.Hour/time.Microsecond)
	for _, c := range []struct {
		name string
		// ring: in the ring buffer at the first open; after: the ring
		// when the reader reopens (after a read failed).
		ring, after          []string
		readonly, deadlock   report.Status
		records, lost, warns float64
	}{
		{
			name: "logged after the first open, stamped before the start",
			ring: []string{"3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter"},
			after: []string{"3,1,1,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", "6,2,2,-;ordinary chatter",
				"6,3,3,-;ordinary chatter", "3,4,4,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			readonly: report.StatusTrue, deadlock: report.StatusFalse, records: 2,
		},
		{
			name: "in the ring at the first open, stamped after the start",
			ring: []string{fmt.Sprintf("3,1,%d,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", ahead),
				fmt.Sprintf("3,2,%d,-;EXT4-fs (sda1): Remounting filesystem read-only", ahead+1)},
			after: []string{fmt.Sprintf("3,1,%d,-;INFO: task kubelet:1234 blocked for more than 120 seconds.", ahead),
				fmt.Sprintf("3,2,%d,-;EXT4-fs (sda1): Remounting filesystem read-only", ahead+1),
				fmt.Sprintf("6,3,%d,-;ordinary chatter", ahead+2)},
			readonly: report.StatusFalse, deadlock: report.StatusFalse, records: 1,
		},
		{
			name: "the base overwritten too",
			ring: []string{"6,1,1,-;ordinary chatter", "6,2,2,-;ordinary chatter"},
			// 1 and 2 (of before the start) and 3 and 4 (of since) gone.
			after:    []string{"6,5,5,-;ordinary chatter", "3,6,6,-;EXT4-fs (sda1): Remounting filesystem read-only"},
			readonly: report.StatusTrue, deadlock: report.StatusFalse, records: 2, lost: 2, warns: 1,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := report.NewStore("b")
				mon := NewMonitor(opts(t, store))
				mon.Start(t0, t0)
				var readFails atomic.Int64
				recs := func(lines []string) (rs [][]byte) {
					for _, l := range lines {
						rs = append(rs, []byte(l+"\n"))
					}
					return rs
				}
				dev := &fakeDevice{failReads: &readFails, readErr: syscall.EIO, recs: recs(c.ring)}
				lg := &countingLog{}
				rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(lg), ReadTimeout: 10 * time.Second,
					Open: func(context.Context, string) (Device, error) { return dev, nil }}
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { rd.Run(ctx); close(done) }()
				synctest.Wait() // the first open is done: the reader waits for a record
				// The next read fails; meanwhile the kernel logs (and
				// overwrites).
				readFails.Store(1)
				dev.mu.Lock()
				dev.recs = recs(c.after)
				dev.pos = min(dev.pos, len(dev.recs))
				dev.mu.Unlock()
				time.Sleep(time.Minute)
				synctest.Wait()
				cancel()
				<-done
				if got, _ := store.Get("ReadonlyFilesystem"); got.Status != c.readonly {
					t.Errorf("ReadonlyFilesystem %s (%s), want %s", got.Status, got.Message, c.readonly)
				}
				if got, _ := store.Get("KernelDeadlock"); got.Status != c.deadlock {
					t.Errorf("KernelDeadlock %s (%s), want %s (a line in the ring at the first open)", got.Status, got.Message, c.deadlock)
				}
				if n, l := mon.Metrics().Records(), mon.Metrics().Lost(); n != c.records || l != c.lost {
					t.Errorf("%v records handled, %v lost; want %v and %v", n, l, c.records, c.lost)
				}
				var warns, unknown float64
				for _, l := range lg.all() {
					if strings.Contains(l, "WARN kernel log records were overwritten") {
						warns++
					}
					if strings.Contains(l, "how many is not known") {
						unknown++
					}
				}
				if warns != c.warns || unknown != 0 {
					t.Errorf("%v warnings of overwritten records, %v that how many is not known; want %v and 0:\n%s", warns, unknown, c.warns, strings.Join(lg.all(), "\n"))
				}
			})
		})
	}
}

// busyRing is a busyDevice whose ring buffer holds a thousand records past
// where a read of it stands: a seek to the end passes them.
type busyRing struct{ busyDevice }

func (d *busyRing) Seek(_ int64, whence int) (int64, error) {
	if whence == io.SeekEnd {
		d.seq += 1000
	}
	return 0, nil
}

// A reader that starts at the end of a log written faster than it is read
// (from_boot_start false) does not read the ring buffer to its end forever
// at its first open: after its bound it seeks to the end, and the record
// before the first one read after the seek is the base, so the records the
// seek passed are not counted lost.
func TestFirstOpenOfABusyLogEnds(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(time.Now(), time.Now())
	rd := &Reader{Path: "busy", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: time.Second, skipFor: 20 * time.Millisecond, Open: func(context.Context, string) (Device, error) { return &busyRing{}, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.After(10 * time.Second)
	for {
		changed := store.Changed()
		if c, _ := store.Get("KernelDeadlock"); c.Status == report.StatusFalse {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			c, _ := store.Get("KernelDeadlock")
			t.Fatalf("the first open of a busy log never ended: %+v", c)
		}
	}
	if l := mon.Metrics().Lost(); l != 0 {
		t.Errorf("%v records counted lost; the seek to the end passed records of before the start, none lost", l)
	}
}

// overrunFlood is a log written so much faster than it is read that the
// ring buffer overwrites records between every two reads: a record, then
// EPIPE (the next read returns the oldest record left), and so on. After
// quit every read ends the file, so a reader that never stopped still
// ends once the test is over.
type overrunFlood struct {
	seq, reads uint64
	quit       atomic.Bool
	reading    chan struct{} // if set, closed at the first read
}

func (d *overrunFlood) Read(p []byte) (int, error) {
	if d.quit.Load() {
		return 0, io.EOF
	}
	d.reads++
	if d.reads == 1 && d.reading != nil {
		close(d.reading)
	}
	d.seq++
	if d.reads%2 == 0 {
		return 0, syscall.EPIPE
	}
	return copy(p, fmt.Sprintf("6,%d,%d,-;ordinary chatter\n", d.seq, MonotonicNow())), nil
}
func (d *overrunFlood) Seek(int64, int) (int64, error)  { return 0, nil }
func (d *overrunFlood) SetReadDeadline(time.Time) error { return nil }
func (d *overrunFlood) Close() error                    { return nil }

// The first open of a reader that starts at the end of the log ends at its
// bound (and stops when the daemon does) even when the ring buffer is
// overrun between every two reads, so that every other read fails with
// EPIPE: the bound is looked at every so many reads, not every so many
// records read.
func TestFirstOpenOfAnOverrunLogEnds(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(time.Now(), time.Now())
	dev := &overrunFlood{}
	defer dev.quit.Store(true)
	rd := &Reader{Path: "busy", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: time.Second, skipFor: 20 * time.Millisecond, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	deadline := time.After(10 * time.Second)
	for {
		changed := store.Changed()
		if c, _ := store.Get("KernelDeadlock"); c.Status == report.StatusFalse {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			c, _ := store.Get("KernelDeadlock")
			t.Fatalf("the first open of an overrun log never ended: %+v", c)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not stop when its context ended")
	}
}

// A daemon that stops while the first open reads an overrun log to its end
// (every other read EPIPE) stops its reader: it does not read on until the
// bound.
func TestReaderStopsDuringTheFirstOpenOfAnOverrunLog(t *testing.T) {
	store := report.NewStore("b")
	mon := NewMonitor(opts(t, store))
	mon.Start(time.Now(), time.Now())
	dev := &overrunFlood{reading: make(chan struct{})}
	defer dev.quit.Store(true)
	rd := &Reader{Path: "busy", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ReadTimeout: time.Second, skipFor: time.Hour, Open: func(context.Context, string) (Device, error) { return dev, nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rd.Run(ctx); close(done) }()
	<-dev.reading // the first open reads the ring
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not stop when its context ended, during its first open")
	}
}

// An open that fails with an error no restart of the daemon ends (the
// privileged helper refusing its command line: Reader.Refused) leaves the
// reader down, its metric 0, but its loop still reports progress, each
// beat within the silence the last one allowed (its backoff): /healthz and
// the watchdog do not restart the daemon for it every few minutes, to be
// refused again. Any other open error still stops the progress.
func TestReaderRefusedOpenKeepsProgress(t *testing.T) {
	refused := errors.New("the privileged helper refuses to start: flag provided but not defined: -lvmm")
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{{"refused", refused, true}, {"other", errors.New("connection refused"), false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := report.NewStore("b")
				mon := NewMonitor(opts(t, store))
				type beat struct {
					at      time.Time
					silence time.Duration
				}
				var mu sync.Mutex
				var beats []beat
				rd := &Reader{Path: "/dev/kmsg", Monitor: mon, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
					Progress: func(_ string, d time.Duration) {
						mu.Lock()
						beats = append(beats, beat{time.Now(), d})
						mu.Unlock()
					}, ReadTimeout: 10 * time.Second,
					Open:    func(context.Context, string) (Device, error) { return nil, tc.err },
					Refused: func(err error) bool { return errors.Is(err, refused) }}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				rd.Run(ctx)
				mu.Lock()
				defer mu.Unlock()
				if got := len(beats) > 0; got != tc.want {
					t.Fatalf("progress reported %d times in 10 min of failed opens (%v), want progress %v", len(beats), tc.err, tc.want)
				}
				if tc.want {
					last := beat{start, 0}
					for i, b := range append(beats, beat{time.Now(), 0}) {
						if i > 0 && b.at.Sub(last.at) > last.silence {
							t.Errorf("beat %d came %s after the one before, which allowed %s: the loop is stuck", i, b.at.Sub(last.at), last.silence)
						}
						last = b
					}
				}
				if mon.Metrics().ReaderUp() {
					t.Errorf("the reader is up with its device refused")
				}
			})
		})
	}
}
