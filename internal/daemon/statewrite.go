package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// stateWriteBlockedAfter is how long a write of the state file may take
// before it counts as blocked in I/O. A write is a file of a few KiB and
// two fsyncs: milliseconds, a second or two on a busy disk. One that has
// not returned after this is in the kernel on a failing or hung disk (a
// dying drive, a thin pool out of space that queues I/O, a hung NFS or
// iSCSI /var), where no context reaches it.
const stateWriteBlockedAfter = 10 * time.Second

// finalSaveWait bounds the save at SIGTERM (Run): a write that has not
// returned by then is left to the kernel, and the daemon stops without it.
const finalSaveWait = 5 * time.Second

// stateWriter writes the state file, each write on a goroutine of its own,
// so that a write blocked in the kernel holds that goroutine only: the
// state writer's loop goes on beating (a write blocked in I/O is not the
// daemon stuck, and systemd's watchdog must not restart, on the day its
// disk fails, a daemon that cannot even die while the write hangs), and
// starts no other write until that one returns, as the disk check asks a
// hung statfs again only once it returned (checks.stuckCalls): one
// goroutine per hung write at most. The zero value is ready to use.
//
// The write itself (a temp file in the same directory, fsync, rename,
// fsync of the directory) is report.WriteFileAtomic, the one the tamper
// state's writer (tamper.Keeper) calls too, and report.RemoveTemps removes
// both files' temps at a start. The two writers around it differ for
// what drives each file's saves: the state file is the whole store encoded
// afresh at each save by the persister's loop, which holds the changes
// made while a write is in flight (the store's Dirty signal) and saves them
// once it returns, retries a failed save with backoff, and finds a write
// blocked in I/O itself (markBlocked), counting and logging it. tamper.json
// has no such loop: the keeper numbers its changes, and a write's return
// starts the next with those made meanwhile; a change waits
// tamper.SaveWait for its own write (NotSavedError), the next change or
// Flush writes again after a failed write, and a timer of its own marks
// the write blocked. It is written 0600, the state file 0644.
type stateWriter struct {
	// write replaces report.WriteFileAtomic (tests).
	write func(path string, data []byte, perm os.FileMode) error

	mu  sync.Mutex
	cur *stateWrite // the write that has not returned; nil when none
	// started is the generation of the newest encoding whose write began
	// (Store.EncodeWrite numbers them): an older one is not written.
	started uint64
}

// stateWrite is one write of the state file; err is set before done is
// closed.
type stateWrite struct {
	path string
	// gen numbers the store's encoding it writes (Store.EncodeWrite),
	// whose end countWrite tells the store (Store.WriteEnded).
	gen   uint64
	since time.Time
	done  chan struct{}
	err   error
	// blocked: it has not returned within stateWriteBlockedAfter (guarded
	// by stateWriter.mu).
	blocked bool
	// counted: its result is in autopilot_health_state_writes_total
	// (countWrite): the persister and a clear's save may both wait for it.
	counted atomic.Bool
}

// countWrite counts sw's result once, whoever waited for it, and tells
// the store that the write ended.
func (d *Daemon) countWrite(sw *stateWrite) {
	if sw.counted.CompareAndSwap(false, true) {
		d.metrics.StateWrite(sw.err)
		d.store.WriteEnded(sw.gen, sw.err)
	}
}

// BlockedWrite is a write of the state file blocked in I/O: since when, on
// which file (status, /healthz).
type BlockedWrite struct {
	Path  string    `json:"path"`
	Since time.Time `json:"since"`
}

// start begins writing data, the store's encoding gen, to path and
// returns the write; nil when the previous write has not returned (no
// second write on top of it), or when a newer encoding's write began: the
// persister encodes, then starts, and a save of another (saveStateNow)
// can encode, write and end in between; the older bytes written after it
// took the state file back (a tamper clear's save undone, a lost-records
// gap told saved while the file held the cursor of before it) until the
// next save. The newer write holds all the older one did.
func (w *stateWriter) start(path string, data []byte, gen uint64) *stateWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != nil || gen <= w.started {
		return nil
	}
	w.started = gen
	write := w.write
	if write == nil {
		write = report.WriteFileAtomic
	}
	sw := &stateWrite{path: path, gen: gen, since: time.Now(), done: make(chan struct{})}
	w.cur = sw
	go func() {
		err := write(path, data, 0o644)
		w.mu.Lock()
		sw.err = err
		w.cur = nil
		w.mu.Unlock()
		close(sw.done)
	}()
	return sw
}

// pending is the write that has not returned; nil when none.
func (w *stateWriter) pending() *stateWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

// markBlocked records that sw is blocked in I/O; false when it returned
// meanwhile.
func (w *stateWriter) markBlocked(sw *stateWrite) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != sw {
		return false
	}
	sw.blocked = true
	return true
}

// blocked is the write blocked in I/O, if any.
func (w *stateWriter) blocked() (BlockedWrite, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil || !w.cur.blocked {
		return BlockedWrite{}, false
	}
	return BlockedWrite{Path: w.cur.path, Since: w.cur.since}, true
}

// statePath is the state file.
func (d *Daemon) statePath() string { return filepath.Join(d.cfg.StateDir, report.StateFileName) }

// stateWriteNote is what systemd's status line and /healthz say of a write
// of the state file, or of the tamper state (tamperWriteBlocked), blocked
// in I/O ("" while none is). It names the time, not a duration: the status
// line is sent again only when it changes.
func (d *Daemon) stateWriteNote() string {
	var notes []string
	if b, ok := d.stateW.blocked(); ok {
		notes = append(notes, b.note("state"))
	}
	if b, ok := d.tamperWriteBlocked(); ok {
		notes = append(notes, b.note("tamper state"))
	}
	return strings.Join(notes, "; ")
}

// note says that what is not saved because its write is blocked in I/O.
func (b BlockedWrite) note(what string) string {
	return fmt.Sprintf("%s not saved: the write of %s has been blocked in I/O since %s", what, b.Path, b.Since.UTC().Format(time.RFC3339))
}

// tamperWriteBlocked is the write of the tamper state (tamper.json)
// blocked in I/O, if any: the keeper writes it on a goroutine of its own,
// one write at a time, and the tamper checks and the operator's clear work
// on from memory meanwhile (tamper.Keeper.Update).
func (d *Daemon) tamperWriteBlocked() (BlockedWrite, bool) {
	k := d.currentEnv().Tamper
	if k == nil {
		return BlockedWrite{}, false
	}
	since, ok := k.WriteBlocked()
	if !ok {
		return BlockedWrite{}, false
	}
	return BlockedWrite{Path: k.Path(), Since: since}, true
}

// watchTamperWrites logs a write of the tamper state found blocked in I/O
// (once, at error level, as the state file's) and its return, and sends
// the status line again each time.
func (d *Daemon) watchTamperWrites() {
	k := d.currentEnv().Tamper
	if k == nil || k.ReadOnly() {
		return
	}
	k.OnWriteBlocked(func(since time.Time, blocked bool, err error) {
		if blocked {
			d.log.Error("saving the tamper state is blocked in I/O; the tamper checks work on from memory (their findings are set on the Node), a clear is applied but not saved, and no other write starts until this one returns",
				"path", k.Path(), "since", since.UTC().Format(time.RFC3339))
		} else {
			d.log.Info("the blocked tamper state write returned; the changes made meanwhile are written now", "path", k.Path(), "took", time.Since(since).Round(time.Second), "err", err)
		}
		d.wakeStatus()
	})
}

// finalSave saves the state at SIGTERM, waiting finalSaveWait at most: for
// the write in flight (blocked in I/O, begun just before the stop, or a
// clear's save still running), then for its own (saveStateNow). A save
// that fails or does not return in time is logged at error level, and the
// daemon stops anyway: a write blocked in the kernel would otherwise hold
// the stop until TimeoutStopSec and the SIGKILL, which a task in D state
// does not answer either. It says whether a write is left in flight (one
// that did not return).
func (d *Daemon) finalSave() (inFlight bool) {
	var nr *writeNotReturnedError
	err := d.saveStateNow(finalSaveWait)
	switch {
	case errors.As(err, &nr) && nr.previous:
		d.log.Error("state not saved on shutdown: the previous write is blocked in I/O; stopping anyway", "path", nr.sw.path, "since", nr.sw.since.UTC().Format(time.RFC3339), "waited", finalSaveWait)
	case errors.As(err, &nr):
		d.log.Error("state not saved on shutdown: the write is blocked in I/O; stopping anyway", "path", nr.sw.path, "waited", finalSaveWait)
	case err != nil:
		// A state that cannot be saved (a read-only /var) is logged and
		// counted, not a failed stop: systemd would mark the unit failed
		// on every stop and restart, and the persister has said so since
		// the first failed save. The next start restores the last saved
		// state.
		d.log.Error("saving state on shutdown failed; stopping anyway", "dir", d.cfg.StateDir, "err", err)
	}
	return nr != nil
}

// writeNotReturnedError: a write of the state file did not return within
// saveStateNow's wait; previous: it is the write that was in flight
// before, not the save's own.
type writeNotReturnedError struct {
	sw       *stateWrite
	previous bool
}

func (e *writeNotReturnedError) Error() string {
	return fmt.Sprintf("the write of %s has not returned since %s", e.sw.path, e.sw.since.UTC().Format(time.RFC3339))
}

// saveStateNow writes the state file as it is now and waits for the write,
// wait at most: for the write in flight first (begun before the caller's
// change), then for its own. The persister's loop, finding a write in
// flight, leaves its changes for a later save, which this one has taken.
// The write's result, or a state that does not encode, is counted in
// autopilot_health_state_writes_total; a write that has not returned in
// time is a *writeNotReturnedError.
func (d *Daemon) saveStateNow(wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if prev := d.stateW.pending(); prev != nil {
			select {
			case <-prev.done:
			case <-t.C:
				return &writeNotReturnedError{sw: prev, previous: true}
			}
		}
		data, gen, err := d.store.EncodeWrite(time.Now())
		if err != nil {
			d.metrics.StateWrite(err)
			return err
		}
		sw := d.stateW.start(d.statePath(), data, gen)
		if sw == nil {
			continue // another began one meanwhile: wait for it, then write
		}
		select {
		case <-sw.done:
			d.countWrite(sw)
			return sw.err
		case <-t.C:
			return &writeNotReturnedError{sw: sw}
		}
	}
}

// finalTamperSave waits, finalSaveWait at most, for the changes of the
// tamper state not written yet (a write of tamper.json blocked in I/O holds
// them) and logs, at error level, what it could not save: a finding not in
// tamper.json is taken back from the Node at the next start, a clear not
// in it is lost and must be made again.
func (d *Daemon) finalTamperSave() (inFlight bool) {
	k := d.currentEnv().Tamper
	if k == nil || k.ReadOnly() {
		return false
	}
	var ns *tamper.NotSavedError
	err := k.Flush(finalSaveWait)
	switch {
	case errors.As(err, &ns):
		d.log.Error("tamper state not saved on shutdown: its write is blocked in I/O; stopping anyway (a clear made since its last save must be made again)", "path", ns.Path, "since", ns.Since.UTC().Format(time.RFC3339), "waited", finalSaveWait)
	case err != nil:
		d.log.Error("tamper state not saved on shutdown; stopping anyway (a clear made since its last save must be made again)", "path", k.Path(), "err", err)
	}
	return ns != nil
}
