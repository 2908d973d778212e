package kmsg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/internal/backoff"
	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/internal/tick"
)

// BufSize is the read buffer: the kernel returns one record per read() and
// fails with EINVAL (losing the record) when the buffer is too small.
const BufSize = 8192

// Device is an open kernel log: one record per Read (the dev-kmsg ABI).
type Device interface {
	Read(p []byte) (int, error)
	Seek(offset int64, whence int) (int64, error)
	SetReadDeadline(t time.Time) error
	Close() error
}

// Reader follows /dev/kmsg and feeds the monitor.
type Reader struct {
	Path    string
	Monitor *Monitor
	Log     *slog.Logger
	// FromStart reads the records still in the ring buffer on a start that
	// has no cursor for this boot (a new boot, or a lost state file) instead
	// of starting at the end.
	FromStart bool
	// Progress is called at most once a second while reads succeed (a read
	// that waits ReadTimeout for a record counts); a reader that cannot open
	// or read the device stops calling it, which fails /healthz and the
	// watchdog (but see Refused). Its maxSilence is ReadTimeout, with no margin: the daemon's
	// liveness adds the same slack to every loop.
	Progress    func(loop string, maxSilence time.Duration)
	ReadTimeout time.Duration
	// Grid lines the read timeout up with the daemon's other periodic
	// wake-ups: once the backlog is read, a read that waits for a record
	// ends at the next point of ReadTimeout's grid (at most ReadTimeout
	// after the last deadline passed). Zero Grid: ReadTimeout after it.
	Grid tick.Grid
	// Gather is how long the reader sleeps to let records gather, instead
	// of waking for each, while they come at 1.5 or more per Gather (0:
	// off; the daemon uses GatherTime; see kmsgFile). It applies to the
	// kernel log device, not to what a test's Open returns.
	Gather time.Duration
	// Open opens the device (default: the kernel log device, read-only,
	// refusing what is not /dev/kmsg); tests replace it. It is given the
	// reader's context and must return once that is done: an open that
	// waits (the privileged helper's, up to its 30 s) would hold the
	// stop, and with it the Event writer's last send and the final save,
	// behind it (Run awaits the reader first).
	Open func(ctx context.Context, path string) (Device, error)
	// Refused, if set, tells an open error that no restart of the daemon
	// ends (the privileged helper refusing its command line: it is
	// refused again at each start). While the open fails with one, the
	// reader is down as for any other error (its metric 0, the kernel
	// conditions Unknown with the error), but its loop reports progress
	// through each backoff: /healthz and the watchdog would restart the
	// daemon for it every few minutes, to no end.
	Refused func(error) bool
	// Backoff bounds the wait before a reopen after an open or read error
	// (default 1 s doubling to 1 min).
	BackoffMin, BackoffMax time.Duration
	// Wall reads the wall clock that records' wall times are taken from
	// (default time.Now); tests step it.
	Wall func() time.Time

	mu  sync.Mutex
	cur cursor
	// unsaved are the gaps of lost records found while the state file's
	// writes are told (report.Store.WritesReported) and not yet in
	// autopilot_health_kmsg_lost_records_total: each is counted once a
	// write that holds the cursor's move past the record after it ended
	// (written), so that a restart from the state file (a SIGKILL, a crash)
	// either finds the move and does not count the gap again, or finds the
	// cursor of before it and counts it, which this run then never did.
	// Guarded by mu.
	unsaved []unsavedGap
	// skipFor bounds the first open's read of the ring buffer to its end
	// (default ringSkipLimit; see skipRing); tests shorten it.
	skipFor time.Duration
}

// CursorKey is the name under which the reader's cursor is kept in the
// state file, beside the conditions its records set (report.Store.Keep).
const CursorKey = "kmsg"

// cursor is where the reader is in this boot's kernel log.
type cursor struct {
	// Seq is the last record handled, or, before the first one, the last
	// record in the ring buffer when a start at the end (from_boot_start
	// false) first read it to its end (those it left); Have says whether
	// there is one.
	Seq  uint64
	Have bool
	// Start is the kernel time before which a start at the end took the
	// records for ones of before it (skipBefore; HaveStart: there is one),
	// kept until Have: a restart before the first open read the ring
	// buffer to its end leaves the records stamped before it, as a reopen
	// does, not those logged since.
	Start     uint64
	HaveStart bool
	// ReadFrom is the kernel time (µs) at which a start at the end of the
	// log (from_boot_start false) began in this boot, ReadFromWall its wall
	// time as the kernel conditions' False names it; HaveReadFrom: there
	// was one. Kept for the boot, also once Have, unlike Start: every later
	// run of the boot that goes on from the cursor says, as the first did,
	// that the records logged before it were not read, naming the same
	// time. Before, a restart after the cursor was saved but before the
	// False was (the first second after the start) said this boot's records
	// were read.
	ReadFrom     uint64
	ReadFromWall time.Time
	HaveReadFrom bool
	// IOErrors are the disk I/O errors in DisksFailure's window (kernel
	// time and device), so a restart within the boot does not forget them.
	IOErrors []ioError
	// Suppressed are the I/O error lines the kernel's rate limit dropped
	// in the window (see countSuppressed), so that a restart still says
	// the count is a lower bound.
	Suppressed []suppression
	// LastSite is the kernel time of the last I/O error line handled (of
	// any device; 0: none), which dates a count of suppressed lines that
	// comes after a restart (see countSuppressed).
	LastSite uint64
	// windowErr: the saved window could not be read (the cursor could);
	// suppressedErr: the saved counts of suppressed I/O error lines could
	// not be (the window could).
	windowErr, suppressedErr error
}

// unsavedGap is a gap of lost records before the record seq, not counted
// yet (Reader.unsaved).
type unsavedGap struct {
	seq, lost uint64
	at        time.Time // when it was found
}

// unsavedFor bounds how long a gap waits for its save (countStale): a
// write of the state file blocked in I/O (a hung disk under state_dir), or
// writes that are no longer told, must not hold the lost records from
// the counter, and the alerts on it, for as long as they last. A crash
// after that counts such a gap again, as before.
const unsavedFor = 10 * time.Second

// maxUnsaved bounds Reader.unsaved: a storm that overruns the ring buffer
// every few records finds many gaps in the second before a save; past this
// many, a gap is summed into the last one (counted with the later of the
// two records: still once).
const maxUnsaved = 64

// written is told the end of a write of the state file that held the
// cursor c (report.Store.OnWritten): the gaps before the records it
// handled up to c.Seq are counted now. A write that failed counts them
// too: a state file that cannot be written would hold them from the
// counter for good, and a restart from it counts them again, as a start
// without a state file would.
func (rd *Reader) written(v any, _ error) {
	c, ok := v.(cursor)
	if !ok || !c.Have {
		return
	}
	rd.countUnsavedWhile(func(g unsavedGap) bool { return g.seq <= c.Seq })
}

// countStale counts the gaps found unsavedFor or longer before now whose
// save has not ended.
func (rd *Reader) countStale(now time.Time) {
	rd.countUnsavedWhile(func(g unsavedGap) bool { return now.Sub(g.at) >= unsavedFor })
}

// countUnsaved counts the gaps not counted yet, as the reader stops: a
// reader built again within the run (a reload) resumes from the cursor in
// memory, past them, and would never count them.
func (rd *Reader) countUnsaved() {
	rd.countUnsavedWhile(func(unsavedGap) bool { return true })
}

// countUnsavedWhile counts the gaps of rd.unsaved, in the order found,
// while counts holds for them, and drops them from it.
func (rd *Reader) countUnsavedWhile(counts func(unsavedGap) bool) {
	rd.mu.Lock()
	var lost uint64
	n := 0
	for n < len(rd.unsaved) && counts(rd.unsaved[n]) {
		lost += rd.unsaved[n].lost
		n++
	}
	if n > 0 {
		rd.unsaved = append(rd.unsaved[:0], rd.unsaved[n:]...)
	}
	rd.mu.Unlock()
	if lost > 0 {
		rd.Monitor.m.lost.Add(float64(lost))
	}
}

type ioError struct {
	Usec uint64 `json:"usec"`
	Dev  string `json:"dev"`
}

// cursorJSON is the cursor in the state file. The window is one string
// (encodeWindow): as an array of objects, which the state file's indented
// JSON puts four lines to an entry, a full window of 1,024 errors made the
// file 85 KB, written up to once a second (now once in 10 s while only
// DisksFailure's count changes) while a failing disk floods the log; as a
// string, 1,024 errors of one device a millisecond apart are
// under 7 KB. ioErrors, the array, is read from a state file written before.
type cursorJSON struct {
	Seq      uint64    `json:"seq"`
	Have     bool      `json:"have"`
	Window   string    `json:"ioErrorWindow,omitempty"`
	IOErrors []ioError `json:"ioErrors,omitempty"`
	// Suppressed: "usec:n" for each count of suppressed I/O error lines,
	// space-separated.
	Suppressed string `json:"ioErrorSuppressed,omitempty"`
	// LastSite: the kernel time (µs) of the last I/O error line handled.
	LastSite uint64 `json:"ioErrorLastLine,omitempty"`
	// Start: cursor.Start, where HaveStart.
	Start *uint64 `json:"startUsec,omitempty"`
	// ReadFrom: cursor.ReadFrom and ReadFromWall, where HaveReadFrom.
	ReadFrom *readFromJSON `json:"startAtEnd,omitempty"`
}

// readFromJSON is a start at the end of the log in the state file.
type readFromJSON struct {
	Usec uint64    `json:"usec"`
	Wall time.Time `json:"wall"`
}

func (c cursor) MarshalJSON() ([]byte, error) {
	j := cursorJSON{Seq: c.Seq, Have: c.Have, Window: encodeWindow(c.IOErrors), Suppressed: encodeSuppressed(c.Suppressed), LastSite: c.LastSite}
	if c.HaveStart && !c.Have {
		j.Start = &c.Start
	}
	if c.HaveReadFrom {
		j.ReadFrom = &readFromJSON{Usec: c.ReadFrom, Wall: c.ReadFromWall}
	}
	return json.Marshal(j)
}

// encodeSuppressed writes the suppressions as "usec:n" tokens.
func encodeSuppressed(ss []suppression) string {
	var b []byte
	for i, s := range ss {
		if i > 0 {
			b = append(b, ' ')
		}
		b = strconv.AppendUint(b, s.Usec, 10)
		b = append(b, ':')
		b = strconv.AppendUint(b, s.N, 10)
	}
	return string(b)
}

// decodeSuppressed reads what encodeSuppressed wrote.
func decodeSuppressed(str string) ([]suppression, error) {
	var ss []suppression
	for _, tok := range strings.Fields(str) {
		u, n, ok := strings.Cut(tok, ":")
		usec, err1 := strconv.ParseUint(u, 10, 64)
		cnt, err2 := strconv.ParseUint(n, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("suppressed I/O error lines: %q is not usec:count", tok)
		}
		ss = append(ss, suppression{Usec: usec, N: cnt})
	}
	return ss, nil
}

// UnmarshalJSON reads the cursor; a window that does not decode costs the
// window alone (windowErr says why), never the position.
func (c *cursor) UnmarshalJSON(b []byte) error {
	var j cursorJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = cursor{Seq: j.Seq, Have: j.Have, IOErrors: j.IOErrors, LastSite: j.LastSite}
	if j.Start != nil && !j.Have {
		c.Start, c.HaveStart = *j.Start, true
	}
	if j.ReadFrom != nil {
		c.ReadFrom, c.ReadFromWall, c.HaveReadFrom = j.ReadFrom.Usec, j.ReadFrom.Wall, true
	}
	if j.Window != "" {
		es, err := decodeWindow(j.Window)
		if err != nil {
			c.IOErrors, c.windowErr = nil, err
		} else {
			c.IOErrors = es
		}
	}
	if ss, err := decodeSuppressed(j.Suppressed); err != nil {
		c.suppressedErr = err
	} else {
		c.Suppressed = ss
	}
	return nil
}

// encodeWindow writes the window in order as space-separated tokens: "@dev"
// names the device of the entries after it (written when it changes), and
// each entry is its kernel time in microseconds, the first absolute and
// each next one as the difference to the one before (signed: "-5").
func encodeWindow(es []ioError) string {
	var b []byte
	dev, prev := "", uint64(0)
	for i, e := range es {
		if i > 0 {
			b = append(b, ' ')
		}
		if i == 0 || e.Dev != dev {
			// Escaped as a URL path: a custom rule's dev group may catch
			// blanks, or nothing ("@" alone).
			b = append(b, '@')
			b = append(b, url.PathEscape(e.Dev)...)
			b = append(b, ' ')
			dev = e.Dev
		}
		switch {
		case i == 0:
			b = strconv.AppendUint(b, e.Usec, 10)
		case e.Usec >= prev:
			b = strconv.AppendUint(b, e.Usec-prev, 10)
		default:
			b = append(b, '-')
			b = strconv.AppendUint(b, prev-e.Usec, 10)
		}
		prev = e.Usec
	}
	return string(b)
}

// decodeWindow reads what encodeWindow wrote.
func decodeWindow(s string) ([]ioError, error) {
	var es []ioError
	dev, prev, haveDev := "", uint64(0), false
	for _, tok := range strings.Fields(s) {
		if name, ok := strings.CutPrefix(tok, "@"); ok {
			var err error
			if dev, err = url.PathUnescape(name); err != nil {
				return nil, fmt.Errorf("I/O error window: device %q: %w", name, err)
			}
			haveDev = true
			continue
		}
		if !haveDev {
			return nil, fmt.Errorf("I/O error window: %q before a device", tok)
		}
		neg := strings.HasPrefix(tok, "-")
		v, err := strconv.ParseUint(strings.TrimPrefix(tok, "-"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("I/O error window: %q: %w", tok, err)
		}
		switch {
		case len(es) == 0:
			if neg {
				return nil, fmt.Errorf("I/O error window: a negative first time %q", tok)
			}
			prev = v
		case neg:
			if v > prev {
				return nil, fmt.Errorf("I/O error window: %q goes before time 0", tok)
			}
			prev -= v
		default:
			if prev+v < prev {
				return nil, fmt.Errorf("I/O error window: %q goes past the largest time", tok)
			}
			prev += v
		}
		es = append(es, ioError{Usec: prev, Dev: dev})
	}
	return es, nil
}

// snapshot returns a copy of the cursor (called by the store at Save, under
// its lock).
func (rd *Reader) snapshot() any {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	c := rd.cur
	c.IOErrors = slices.Clone(c.IOErrors)
	c.Suppressed = slices.Clone(c.Suppressed)
	return c
}

// MonotonicNow returns CLOCK_MONOTONIC in microseconds, the clock of the
// kernel log's timestamps.
func MonotonicNow() uint64 { return rawsys.MonotonicMicros() }

// BootWall returns the wall time of kernel time 0.
func BootWall() time.Time { return bootWallOf(time.Now()) }

// bootWallOf is the wall time of kernel time 0 by the wall clock's reading
// now.
func bootWallOf(now time.Time) time.Time {
	return now.Add(-time.Duration(MonotonicNow()) * time.Microsecond)
}

// bootWallEvery is how often at most the reader reads the wall time of
// kernel time 0 again (see Run's bootWall), unless the wall clock jumped.
const bootWallEvery = time.Second

// wallJump is how far the wall clock may move apart from the monotonic one
// between two reads of the wall time of kernel time 0 before the next
// record reads it again: a step of the wall clock, or a suspend, which the
// wall clock counts and the monotonic one (the kernel's times) does not.
const wallJump = 10 * time.Millisecond

// bootWall is the wall time of kernel time 0 by the reader's wall clock.
func (rd *Reader) bootWall() time.Time {
	if rd.Wall != nil {
		return bootWallOf(rd.Wall())
	}
	return BootWall()
}

// wallAt is the wall clock's reading at now, a time.Now() (rd.Wall's
// reading instead when a test sets it).
func (rd *Reader) wallAt(now time.Time) time.Time {
	if rd.Wall != nil {
		return rd.Wall()
	}
	return now
}

// caughtUp: every record the kernel held at the open is read, so what did
// not match is healthy. Only now is the device trusted again (the backoff
// resets, recovery is logged once): a device whose reads work once and then
// fail keeps backing off.
func (rd *Reader) caughtUp(bo *backoff.Backoff, lastErr *string) {
	rd.Monitor.CaughtUp(MonotonicNow(), time.Now())
	bo.Reset()
	if *lastErr != "" {
		rd.Log.Info("kernel log readable again", "path", rd.Path)
		*lastErr = ""
	}
}

// errEOF: the kernel log never ends; a device that does is not it.
func errEOF(path string) error {
	return fmt.Errorf("read %s: end of file (the kernel log never ends: is this /dev/kmsg?)", path)
}

// GatherTime is the daemon's Reader.Gather: a matching line of a busy log
// reaches the store at most this much later than it would, and a log
// written every millisecond wakes the reader once per GatherTime, not once
// per few records (see kmsgFile).
const GatherTime = 10 * time.Millisecond

// startSlack is how long before the start a record may be stamped and
// still be read after a reopen of a reader that started at the end of the
// log before it handled a record, where the first open did not read the
// ring buffer to its end (it failed; see Run): the kernel stamps its
// records with its own clock (local_clock), which runs a little apart from
// CLOCK_MONOTONIC (a millisecond or so), so a record logged just after the
// start is not taken for one of before it. It is the fallback only: the
// two clocks may drift apart by more than that on a host up for long.
const startSlack = time.Second

// ringSkipLimit bounds how long the first open of a reader that starts at
// the end of the log reads the ring buffer to its end (see skipRing): a
// record costs ~2 µs (2,334 records, a 6.x kernel's, in 4 ms), so a ring
// of a few thousand takes a few milliseconds and the bound about a million;
// a log written faster than it is read has no end to reach, and the reader
// then seeks to the end.
const ringSkipLimit = 2 * time.Second

// ringBase is what the first open of a reader that starts at the end of the
// log learned of the records it left (skipRing).
type ringBase struct {
	// seq is the last record read and left (have: there was one).
	seq  uint64
	have bool
	// exact: seq is the last record in the ring buffer at the first open
	// (it read to the end); every later record is one of since the start.
	exact bool
	// pending: the read stopped at its bound and sought to the end; the
	// record before the first one read next is the base.
	pending bool
}

// skipRing reads the ring buffer from where f is (its start) to the first
// read that would wait, handling nothing: the records in it at the first
// open of a reader that starts at the end of the log (from_boot_start
// false). The sequence number of the last is the base: a reopen before a
// record was handled leaves every record up to it and reads every one
// after it, counting a gap from it as lost. Sequence numbers, not the
// kernel's timestamps, which may run apart from CLOCK_MONOTONIC by more
// than any slack. A read of the ring that has not reached its end after
// rd.skipFor (a log written faster than it is read) seeks to the end
// instead: the record before the next one read is the base (pending).
func (rd *Reader) skipRing(ctx context.Context, f Device, buf []byte) (ringBase, error) {
	var b ringBase
	limit := rd.skipFor
	if limit == 0 {
		limit = ringSkipLimit
	}
	// A deadline that has passed: a read with no record ready returns at
	// once.
	f.SetReadDeadline(time.Now())
	began := MonotonicNow()
	for i := 1; ; i++ {
		// Every 64th read, whatever the last ones returned: a ring
		// overrun between every two reads makes every other one EPIPE.
		if i%64 == 0 {
			if ctx.Err() != nil {
				return b, ctx.Err()
			}
			if MonotonicNow()-began >= uint64(limit/time.Microsecond) {
				if _, err := f.Seek(0, io.SeekEnd); err != nil {
					return b, err
				}
				b.pending = true
				return b, nil
			}
		}
		n, err := f.Read(buf)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			b.exact = true
			return b, nil
		case errors.Is(err, syscall.EPIPE):
			// Overwritten before read: older than what comes next.
			continue
		case (err == nil && n == 0) || errors.Is(err, io.EOF):
			return b, errEOF(rd.Path)
		case err != nil:
			return b, err
		}
		// A record that does not parse is left uncounted, as the
		// records before the start always were; it moves nothing.
		if rec, perr := ParseRecord(buf[:n]); perr == nil {
			b.seq, b.have = rec.Seq, true
		}
	}
}

// waitCounter is a Device that counts its reads that found no record
// ready and waited (kmsgFile.waits): one had read the ring buffer to its
// end.
type waitCounter interface{ waitsBegun() int }

// catchUpWait is how long a read waits for the next record while the
// reader works through the backlog: when none comes, the end is reached.
const catchUpWait = 250 * time.Millisecond

// Run reads until ctx is done, reopening the device with backoff after
// open and read errors. It never returns early: a monitor that cannot read
// says so in the log (once per change of error) and the metrics, and stops
// reporting progress.
//
// The cursor (the last record handled, and the I/O error window) is kept in
// the monitor's store and saved in the same atomic write as the conditions,
// updated only after a record's conditions are set: a crash at any moment
// leaves a saved cursor that never runs ahead of the saved conditions, so a
// restart neither skips a line whose condition was not saved nor flaps.
func (rd *Reader) Run(ctx context.Context) {
	if rd.ReadTimeout == 0 {
		rd.ReadTimeout = 10 * time.Second
	}
	if rd.Open == nil {
		rd.Open = openDevice
	}
	bo := backoff.Backoff{Min: rd.BackoffMin, Max: rd.BackoffMax}
	if bo.Min == 0 {
		bo.Min = time.Second
	}
	if bo.Max == 0 {
		bo.Max = time.Minute
	}
	store := rd.Monitor.o.Store
	var cur cursor
	kept, err := store.MemoErr(CursorKey, &cur)
	if kept && err != nil {
		rd.Log.Warn("the saved kernel log cursor is unreadable; reading as a start without one does", "err", err, "from_boot_start", rd.FromStart)
		cur = cursor{}
	}
	if kept && err == nil {
		if cur.windowErr != nil {
			rd.Log.Warn("the saved disk I/O error window is unreadable; DisksFailure counts the errors from now on", "err", cur.windowErr)
			cur.windowErr = nil
		}
		if cur.suppressedErr != nil {
			rd.Log.Warn("the saved counts of I/O error lines the kernel suppressed are unreadable; DisksFailure's message counts those it reads from now on", "err", cur.suppressedErr)
			cur.suppressedErr = nil
		}
		rd.Monitor.restoreWindow(cur.IOErrors, cur.Suppressed)
		rd.Monitor.lastSiteUsec = cur.LastSite
		// What the window kept (not an ignored device's errors) is what
		// the next save writes.
		cur.IOErrors = rd.Monitor.windowEntries(nil)
		cur.Suppressed = slices.Clone(rd.Monitor.suppressedIO)
	}
	if rd.FromStart {
		// A start at the end's kept start (see below) is not a position
		// from_boot_start true resumes at: it reads the ring buffer.
		cur.Start, cur.HaveStart = 0, false
		if !cur.Have {
			// Nor is its time: this start reads the records before it.
			cur.ReadFrom, cur.ReadFromWall, cur.HaveReadFrom = 0, time.Time{}, false
		}
	}
	rd.mu.Lock()
	rd.cur = cur
	rd.mu.Unlock()
	store.Keep(CursorKey, rd.snapshot)
	// Gaps are counted once the state file holds the move past them, where
	// its writes are told (see unsaved); else as they are found.
	store.OnWritten(CursorKey, rd.written)
	defer rd.countUnsaved()
	last, haveLast := cur.Seq, cur.Have
	// handled: a record was handled since the start (last is one).
	handled := haveLast
	winGen := rd.Monitor.winGen

	// bootWall is the wall time of kernel time 0, to which a record's
	// kernel time is added for its wall time (its condition's transition,
	// its Event's timestamps). It is read again before a record is handled
	// once bootWallEvery has passed since it was last read: the wall clock
	// may be stepped while the daemon runs (chrony's makestep after a boot
	// whose RTC was off, a VM resumed after a pause), and read once at the
	// start it dated every later record off by the step. Not for each
	// record: a flood pays a clock read a second, not one a record. Nor
	// only once a second: the time read after each read(2) (now) holds the
	// wall and the monotonic clock, and when the wall clock has moved
	// apart from the monotonic one since the last read (a step; a suspend,
	// which only the wall clock counts, so that a reader frozen less than a
	// second after its last read found it "not a second yet" at the resume
	// and dated the resume's records as long before as the node slept),
	// the next record reads it again.
	bootWall, bootWallAt := rd.bootWall(), time.Now()
	bootWallWall := rd.wallAt(bootWallAt).Round(0)
	buf := make([]byte, BufSize)
	var lastErr string
	warnedGather := false
	// gaps: the warnings about overwritten records, kept across reopens;
	// what is still summed when the reader stops is logged then.
	var gaps gapLog
	defer func() { rd.logGaps(gaps.pending) }()
	// fail logs an error once per change of its text and waits out the
	// backoff; it reports false when ctx ended.
	fail := func(msg string, err error) bool {
		rd.Monitor.m.up.Set(0)
		rd.Monitor.Blind(err, time.Now())
		wait := bo.Next()
		if rd.Refused != nil && rd.Progress != nil && rd.Refused(err) {
			rd.Progress("kmsg", wait+rd.ReadTimeout)
		}
		if text := msg + ": " + err.Error(); text != lastErr {
			rd.Log.Error(msg+"; kernel conditions are not being evaluated", "path", rd.Path, "err", err, "retry_in", wait.Round(time.Millisecond))
			lastErr = text
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
			return true
		}
	}
	// A start at the end (from_boot_start false, no cursor) reads the
	// ring buffer to its end at the first open, handling nothing, and
	// takes the last record's sequence number for the base (skipRing):
	// last is set to it, so a reopen before a record was handled (a read
	// that failed) reads from the start of the ring and leaves every
	// record up to the base, as a restart with a cursor does, and a gap
	// after it is counted lost. It sought to the end again before, and the
	// records logged during the failure and its backoff were lost, counted
	// nowhere. Where the first open did not reach the end (it failed, a
	// read failed during it), a reopen leaves, of the records after what
	// it read, those stamped before skipBefore, the kernel time of the
	// start less startSlack: no sequence number says where the start was.
	//
	// Both are kept in the cursor, saved soon (Touch) like a handled
	// record's: the base as its Seq, the start until then as its Start. A
	// restart (a crash, SIGKILL, systemctl restart) before a record was
	// handled resumes after the base, as a reopen does, or leaves the
	// records stamped before the kept start, as a reopen whose first open
	// did not reach the end does. Before, both lived in memory alone: the
	// restart had no cursor and started at the end again, and the records
	// logged between the two starts were neither read nor counted lost.
	atEnd := !haveLast && !rd.FromStart
	startedAtEnd := atEnd
	var base ringBase
	var skipBefore uint64
	switch {
	case atEnd && cur.HaveStart:
		// An earlier start in this boot began at the end and stopped
		// before its first open read the ring buffer to its end: this one
		// goes on from it as a reopen.
		skipBefore, atEnd = cur.Start, false
		if !cur.HaveReadFrom {
			// A state file of a version that kept the start alone.
			usec := cur.Start + uint64(startSlack/time.Microsecond)
			cur.ReadFrom, cur.ReadFromWall, cur.HaveReadFrom = usec, bootWall.Add(time.Duration(usec)*time.Microsecond), true
			rd.mu.Lock()
			rd.cur.ReadFrom, rd.cur.ReadFromWall, rd.cur.HaveReadFrom = cur.ReadFrom, cur.ReadFromWall, true
			rd.mu.Unlock()
		}
	case atEnd:
		now := MonotonicNow()
		skipBefore = now - min(now, uint64(startSlack/time.Microsecond))
		cur.ReadFrom, cur.ReadFromWall, cur.HaveReadFrom = now, bootWall.Add(time.Duration(now)*time.Microsecond), true
		rd.mu.Lock()
		rd.cur.Start, rd.cur.HaveStart = skipBefore, true
		rd.cur.ReadFrom, rd.cur.ReadFromWall, rd.cur.HaveReadFrom = cur.ReadFrom, cur.ReadFromWall, true
		rd.mu.Unlock()
		store.Touch()
	}
	// The start at the end of this boot, this run's or a run's before it
	// whose cursor this one goes on from (the first second after a start,
	// before the state file took the kernel conditions' False, included):
	// its False and DisksFailure's count say the records before it were
	// not read.
	if cur.HaveReadFrom {
		rd.Monitor.readFrom, rd.Monitor.readFromUsec = cur.ReadFromWall, cur.ReadFrom
	}
	for ctx.Err() == nil {
		// skipping: this open reads records of before the start that no
		// sequence number tells (the first open did not reach the end),
		// which are not handled.
		skipping := startedAtEnd && !atEnd && !handled && !base.exact
		// A reopen reads from the start: its first record is not the one
		// after a seek to the end.
		base.pending = false
		var skipErr error
		f, err := rd.Open(ctx, rd.Path)
		if err == nil && ctx.Err() != nil {
			// Opened as the stop came: no record is read after it.
			f.Close()
			return
		}
		if err == nil {
			_, err = f.Seek(0, io.SeekStart)
			if err == nil && atEnd {
				base, skipErr = rd.skipRing(ctx, f, buf)
				if base.have {
					last, haveLast = base.seq, true
				}
				if base.have && base.exact {
					// The start's position, kept as a record's is:
					// a restart resumes after it (see above).
					rd.mu.Lock()
					rd.cur.Seq, rd.cur.Have = base.seq, true
					rd.mu.Unlock()
					store.Touch()
				}
			}
			if err != nil || skipErr != nil {
				f.Close()
			}
		}
		atEnd = false
		if err != nil && ctx.Err() != nil {
			// The open ended by the stop: not a failure to report (the
			// kernel conditions Unknown in the final save).
			return
		}
		if err != nil {
			if !fail("cannot open the kernel log", explainOpen(err, rd.Monitor.o.Proc)) {
				return
			}
			continue
		}
		if skipErr != nil {
			if ctx.Err() != nil {
				return
			}
			rd.Monitor.m.reopens.Inc()
			if !fail("reading the kernel log failed", skipErr) {
				return
			}
			continue
		}
		if kf, ok := f.(*kmsgFile); ok && rd.Gather > 0 {
			if err := kf.gatherFor(rd.Gather); err != nil && !warnedGather {
				rd.Log.Warn("kernel log records are read as each comes, not gathered", "err", err)
				warnedGather = true
			}
		}
		// waited: the reads of this open that found no record ready
		// (waitCounter), where the device tells them: such a read had
		// reached the end of the ring buffer.
		wc, _ := f.(waitCounter)
		waitsAtOpen := 0
		if wc != nil {
			waitsAtOpen = wc.waitsBegun()
		}
		stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()) })
		// deadlineSet: when the read deadline was last set; deadlineAt: the
		// deadline on the grid.
		var beat, deadlineSet, deadlineAt time.Time
		var deadlineWait time.Duration
		now := time.Now()
		var readErr error
		// unparsed: the records since the last one handled that did not
		// parse (they took sequence numbers too).
		var unparsed uint64
		opened, caughtUp := false, false
		// maxRead: the largest sequence number of a record this open read
		// and parsed (readAny: one was).
		var maxRead uint64
		readAny := false
		// A record logged after this open means the backlog is read, even
		// when the log never pauses long enough for a read to time out.
		openUsec := MonotonicNow()
		// goOnAfter takes the cursor back to the ring buffer's last record,
		// to: a cursor of this boot that is ahead of the kernel's log (a
		// state file edited or put back by hand) would leave every record
		// until the kernel's numbers pass it. The reader goes on after
		// that record instead.
		goOnAfter := func(to uint64) {
			rd.Log.Warn("the saved kernel log cursor is ahead of the last record in the kernel's ring buffer (the state file was edited or put back); reading on after that record",
				"path", rd.Path, "saved_seq", last, "last_seq", to)
			last = to
			rd.mu.Lock()
			rd.cur.Seq = last
			rd.mu.Unlock()
			store.Touch()
		}
		for ctx.Err() == nil {
			// Until the backlog is read, a short wait for the next record
			// tells that the end is reached.
			wait := rd.ReadTimeout
			if !caughtUp {
				wait = min(wait, catchUpWait)
			}
			// The deadline is set anew when the wait changes, not for every
			// record of a flood. Until the backlog is read, it is moved
			// once an eighth of the wait has passed (a read waits between
			// 7/8 of the wait and the whole of it: no record for that long
			// is the end). Then it is the next point of the wait's grid,
			// set again once passed, so the read timeout wakes the daemon
			// together with its other periodic work.
			switch {
			case !caughtUp && (wait != deadlineWait || now.Sub(deadlineSet) >= wait/8):
				deadlineSet, deadlineWait = now, wait
				f.SetReadDeadline(now.Add(wait))
			case caughtUp && (wait != deadlineWait || !now.Before(deadlineAt)):
				deadlineAt, deadlineWait = rd.Grid.Next(now, wait), wait
				f.SetReadDeadline(deadlineAt)
			}
			if ctx.Err() != nil {
				// The stop set the deadline to now just before the line
				// above set another: it would wait that out.
				break
			}
			n, err := f.Read(buf)
			now = time.Now()
			if (err == nil && n == 0) || errors.Is(err, io.EOF) {
				err = errEOF(rd.Path)
			}
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, syscall.EPIPE) {
				readErr = err
				break
			}
			// A read that returned a record, waited for one, or learned of
			// an overrun: the device works.
			if !opened {
				opened = true
				rd.Monitor.m.up.Set(1)
				switch {
				case lastErr != "":
				case handled:
					rd.Log.Info("kernel log monitor resuming after its saved cursor (the last record handled, or left at the start)", "seq", last)
				case rd.FromStart:
					rd.Log.Info("kernel log monitor reading this boot's records still in the ring buffer")
				}
			}
			if !caughtUp && errors.Is(err, os.ErrDeadlineExceeded) {
				caughtUp = true
				if readAny && haveLast && maxRead < last {
					// The ring buffer is read to its end and its last
					// record is before the cursor.
					goOnAfter(maxRead)
				}
				rd.caughtUp(&bo, &lastErr)
			}
			// Progress at most once a second: in a flood this loop turns
			// for every record.
			if rd.Progress != nil && now.Sub(beat) >= time.Second {
				rd.Progress("kmsg", rd.ReadTimeout)
				beat = now
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				rd.Monitor.Tick(MonotonicNow(), now)
				rd.logGaps(gaps.flush(now))
				rd.countStale(now)
				continue
			}
			if errors.Is(err, syscall.EPIPE) {
				// The ring buffer overwrote records we had not read; the
				// next read returns the oldest one left. The gap in the
				// sequence numbers says how many were lost.
				continue
			}
			rec, perr := ParseRecord(buf[:n])
			if perr != nil {
				// Counted as a parse error, not also as lost: the next
				// record's gap is less the records that did not parse. Its
				// header's sequence number is not trusted to move last (a
				// wrong one would skip every record up to it).
				rd.Monitor.m.parseErrors.Inc()
				unparsed++
				continue
			}
			prevMax, prevAny := maxRead, readAny
			if !readAny || rec.Seq > maxRead {
				maxRead, readAny = rec.Seq, true
			}
			if base.pending {
				// The first record after the seek to the end that ended
				// skipRing: the one before it is the base.
				last, haveLast = rec.Seq-1, true
				base.pending, base.exact = false, true
			}
			if haveLast && rec.Seq <= last {
				if wc == nil || wc.waitsBegun() == waitsAtOpen {
					unparsed = 0
					continue // handled before the restart, or left at the start
				}
				// A read of this open waited for a record: it had read
				// the ring buffer to its end, and this record, at or
				// before the cursor, was logged since. A log that never
				// pauses for catchUpWait would not tell it by the read
				// timeout: the cursor is ahead, and this record is the
				// first after the ring's last one.
				to := rec.Seq - 1
				if prevAny {
					to = prevMax
				}
				goOnAfter(to)
			}
			if skipping && !handled && rec.Usec < skipBefore {
				// Logged before the start: left, as the first open left
				// it; its sequence number is where a gap is counted from.
				last, haveLast, unparsed = rec.Seq, true, 0
				continue
			}
			if skipping && !handled && !haveLast && rec.Seq > 0 {
				// The ring holds no record of before the start: the
				// overrun took the gap's base too, so what it took of
				// the records since the start is not known (once: the
				// record is handled next).
				rd.Log.Warn("kernel log records logged since the start may have been overwritten before they could be read; how many is not known (the ring buffer holds no record of before the start)", "path", rd.Path, "first_seq", rec.Seq)
			}
			// counted: a gap before this record was counted lost; its
			// move is saved within a second, not with the 10 s of a
			// handled record's (below).
			counted := false
			if haveLast && rec.Seq > last+1 {
				if lost := rec.Seq - last - 1 - min(unparsed, rec.Seq-last-1); lost > 0 {
					if store.WritesReported() {
						rd.mu.Lock()
						if len(rd.unsaved) == maxUnsaved {
							g := &rd.unsaved[len(rd.unsaved)-1]
							g.seq, g.lost = rec.Seq, g.lost+lost
						} else {
							rd.unsaved = append(rd.unsaved, unsavedGap{seq: rec.Seq, lost: lost, at: now})
						}
						rd.mu.Unlock()
						rd.countStale(now) // a storm's reads never time out
					} else {
						rd.Monitor.m.lost.Add(float64(lost))
					}
					rd.logGaps(gaps.gap(now, lost, last))
					counted = true
				}
			}
			unparsed = 0
			if mono := now.Sub(bootWallAt); mono >= bootWallEvery || (rd.wallAt(now).Round(0).Sub(bootWallWall)-mono).Abs() > wallJump {
				bootWall, bootWallAt = rd.bootWall(), now
				bootWallWall = rd.wallAt(now).Round(0)
			}
			rd.Monitor.Handle(rec, bootWall.Add(time.Duration(rec.Usec)*time.Microsecond))
			last, haveLast, handled = rec.Seq, true, true
			if !caughtUp && rec.Usec >= openUsec {
				caughtUp = true
				rd.caughtUp(&bo, &lastErr)
			}
			// The cursor moves only after the record's conditions are in
			// the store (see Run's doc).
			rd.mu.Lock()
			rd.cur.Seq, rd.cur.Have = last, true
			// An ignored device's I/O error line moves it too, and not
			// the window.
			rd.cur.LastSite = rd.Monitor.lastSiteUsec
			if g := rd.Monitor.winGen; g != winGen {
				winGen = g
				// snapshot copies it under rd.mu: the slice can be reused.
				rd.cur.IOErrors = rd.Monitor.windowEntries(rd.cur.IOErrors[:0])
				rd.cur.Suppressed = append(rd.cur.Suppressed[:0], rd.Monitor.suppressedIO...)
			}
			rd.mu.Unlock()
			if counted {
				// A restart from the cursor of before the gap would
				// count the same records lost again (an alert on the
				// lost counter fires twice for one loss): the move past
				// it is saved soon, as the start's position is. Gaps are
				// rare; a quiet, healthy log writes nothing for them.
				store.Touch()
			} else {
				store.TouchLater()
			}
		}
		stop()
		f.Close()
		rd.logGaps(gaps.flush(time.Now()))
		rd.Monitor.m.up.Set(0)
		if readErr != nil {
			rd.Monitor.m.reopens.Inc()
			if !fail("reading the kernel log failed", readErr) {
				return
			}
		}
	}
}

// Scan reads every record still in the ring buffer once (for the one-shot
// check) and returns how many it handled.
func Scan(path string, mon *Monitor) (int, error) {
	dev, err := Open(path)
	if err != nil {
		return 0, explainOpen(err, mon.o.Proc)
	}
	defer dev.Close()
	f := dev.(*kmsgFile)
	bootWall := BootWall()
	buf := make([]byte, BufSize)
	n := 0
	startUsec := MonotonicNow()
	for {
		// The device is non-blocking: a read with nothing left waits for
		// the poller; a deadline already past turns that into "caught up".
		f.SetReadDeadline(time.Now().Add(catchUpWait))
		k, err := f.Read(buf)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			mon.CaughtUp(MonotonicNow(), time.Now())
			return n, nil
		case errors.Is(err, syscall.EPIPE):
			continue
		case err == nil && k == 0, errors.Is(err, io.EOF):
			return n, errEOF(path)
		case err != nil:
			return n, err
		}
		rec, perr := ParseRecord(buf[:k])
		if perr != nil {
			mon.m.parseErrors.Inc()
			continue
		}
		mon.Handle(rec, bootWall.Add(time.Duration(rec.Usec)*time.Microsecond))
		n++
		if rec.Usec >= startUsec {
			// Logged after the scan began: the ring as it was is read (a
			// busy log never pauses for the read to time out).
			mon.CaughtUp(MonotonicNow(), time.Now())
			return n, nil
		}
	}
}

// gapLog bounds the warnings about records the ring buffer overwrote before
// the reader got to them: while a storm overruns the buffer every few
// records, each gap would be a journal line. A gap a minute or more after
// the last line is logged at once; the gaps within gapLogEvery of a line
// are summed into one, written at the first gap, read timeout or reopen
// after that time, or when the reader stops. Every lost record is counted
// in the metric, once the state file holds the move past its gap where
// the store's writes are told (Reader.unsaved), else as it is found.
type gapLog struct {
	last    time.Time // when a line was last written
	pending gapSum    // gaps since, not logged yet
}

// gapSum is what one warning says.
type gapSum struct {
	lost, gaps uint64
	afterSeq   uint64 // where the first of the gaps was
}

const gapLogEvery = time.Minute

// gap records a gap of lost records after seq afterSeq, and returns what
// to log now (gaps 0: nothing).
func (g *gapLog) gap(now time.Time, lost, afterSeq uint64) gapSum {
	if g.pending.gaps == 0 {
		g.pending.afterSeq = afterSeq
	}
	g.pending.lost += lost
	g.pending.gaps++
	return g.flush(now)
}

// flush returns the gaps not logged yet once gapLogEvery has passed since
// the last line, and forgets them.
func (g *gapLog) flush(now time.Time) gapSum {
	if g.pending.gaps == 0 || (!g.last.IsZero() && now.Sub(g.last) < gapLogEvery) {
		return gapSum{}
	}
	out := g.pending
	g.pending, g.last = gapSum{}, now
	return out
}

// logGaps writes the warning for s, if any.
func (rd *Reader) logGaps(s gapSum) {
	switch {
	case s.gaps == 0:
	case s.gaps == 1:
		rd.Log.Warn("kernel log records were overwritten before they could be read", "lost", s.lost, "after_seq", s.afterSeq)
	default:
		rd.Log.Warn("kernel log records were overwritten before they could be read", "lost", s.lost, "gaps", s.gaps,
			"first_after_seq", s.afterSeq)
	}
}
