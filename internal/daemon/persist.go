package daemon

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/syself/autopilot-health/internal/backoff"
)

// persistEvery bounds how long the persister loop waits without a change.
const persistEvery = time.Minute

// persistLater is how long at most a change that may wait
// (Store.TouchLater: the kernel log's cursor moving, a condition's new
// message with its status and reason unchanged) waits for the state file,
// unless a save for another change comes first: until the next point of
// its grid (tick.Grid), where the 10 s checks wake the daemon anyway. While the kernel logs a line every second or
// more often, the state file is written once in this time instead of once
// a second (a write is a JSON encoding, a file write and two fsyncs: about
// 1 ms of CPU on the machine of README's figures), and a crash hands the
// records of up to this long to the reader again: their events are sent
// again, their conditions are set to what they are.
const persistLater = 10 * time.Second

// persist writes the state file after changes: at most a second after a
// condition's status or reason, or a value the checks keep, changed
// (Store.Touch), at most persistLater after a change that may wait
// (Store.TouchLater), and beats its liveness. Each save takes every change
// made before it, so the requests it answered are dropped. When saving
// fails (a read-only /var) it retries with backoff (1 s doubling to a
// minute) and logs once per change of error, and once when it works again.
//
// The store is encoded here, and the file written on a goroutine of its
// own (stateWriter): the loop goes on beating while the write is in the
// kernel, so a write blocked in I/O (a failing or hung disk under
// state_dir) is not the daemon stuck; it is logged once, named on the
// status line, in status and /healthz, and in
// autopilot_health_state_write_blocked_seconds, and no other write starts
// until it returns. A loop blocked anywhere else (the store's lock) still
// stops beating, and is stuck.
func (d *Daemon) persist(ctx context.Context) {
	const loop = "state"
	d.live.Expect(loop, persistEvery)
	defer d.live.Forget(loop)
	t := d.grid().NewTicker(persistEvery)
	defer t.Stop()
	bo := backoff.Backoff{Min: time.Second, Max: persistEvery}
	var retry, laterDue, blockedDue <-chan time.Time
	dirty := false
	// writing: the write in flight; its changes, and those made while it
	// runs, wait for it. adopted: it is a write another began
	// (saveStateNow, a tamper clear's save): watched as this loop's own,
	// so that it too is reported when blocked in I/O, but the changes this
	// loop holds are saved after it.
	var writing *stateWrite
	adopted := false
	// failed retries a failed save with backoff, logged once per change
	// of error.
	failed := func(err error) {
		wait := bo.Next()
		// The first failure, or another error (saveErrKey): status and
		// the journal say it; a retry of the same says nothing new.
		if d.stateW.setFailed(d.statePath(), err, time.Now()) {
			d.log.Error("saving state failed; retrying with backoff", "dir", d.cfg.StateDir, "err", err, "retry_in", wait.Round(time.Millisecond))
			d.wakeStatus()
		}
		retry = time.After(wait)
	}
	for {
		if writing == nil {
			if p := d.stateW.pending(); p != nil {
				writing, adopted = p, true
				blockedDue = time.After(max(0, stateWriteBlockedAfter-time.Since(p.since)))
			}
		}
		changes, later, due := d.store.Dirty(), d.store.Later(), laterDue
		if retry != nil || writing != nil {
			changes, later, due = nil, nil, nil // the retry, or the save after the write, saves them
		}
		if laterDue != nil {
			later = nil // a save is already due
		}
		var written chan struct{}
		if writing != nil {
			written = writing.done
		}
		select {
		case <-ctx.Done():
			// A write in flight is the final save's to wait for.
			return
		case <-changes:
			dirty = true
			// Coalesce bursts of changes.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		case <-later:
			// At the next point of persistLater's grid, not persistLater
			// from now: a kernel record wakes the reader off the grid, and
			// its save then wakes the daemon together with the checks, not
			// a second time on its own.
			laterDue = time.After(d.grid().Until(time.Now(), persistLater))
		case <-due:
			laterDue, dirty = nil, true
		case <-retry:
			retry = nil
		case <-blockedDue:
			blockedDue = nil
			if d.stateW.markBlocked(writing) {
				d.metrics.StateWriteBlocked(writing.since)
				d.log.Error("saving state is blocked in I/O; the daemon works on, and starts no other write until this one returns",
					"path", writing.path, "since", writing.since.UTC().Format(time.RFC3339))
				d.wakeStatus()
			}
		case <-written:
			err, blocked := writing.err, writing.blocked
			if blocked {
				d.metrics.StateWriteBlocked(time.Time{})
				d.log.Info("the blocked state write returned", "path", writing.path, "took", time.Since(writing.since).Round(time.Second), "err", err)
				d.wakeStatus()
			}
			wasAdopted := adopted
			d.countWrite(writing)
			writing, blockedDue, adopted = nil, nil, false
			switch {
			case err != nil:
				failed(err)
			default:
				if d.stateW.saved() {
					d.log.Info("saving state works again", "dir", d.cfg.StateDir)
					d.wakeStatus()
				}
				bo.Reset()
				if !wasAdopted {
					// This save took what the due one would have; after
					// another's write, what this loop holds is saved next.
					dirty, laterDue = false, nil
				}
			}
		case <-t.C:
		}
		if dirty && retry == nil && writing == nil {
			// The save takes every change made so far: requests for them
			// need no save of their own (one made after this still
			// gets one).
			drainToken(d.store.Dirty())
			drainToken(d.store.Later())
			data, gen, err := d.store.EncodeWrite(time.Now())
			if err == nil {
				writing = d.stateW.start(d.statePath(), data, gen)
			}
			switch {
			case err != nil:
				// Not written: counted and retried as a failed write.
				d.metrics.StateWrite(err)
				failed(err)
			case writing != nil:
				blockedDue = time.After(stateWriteBlockedAfter)
			}
		}
		d.live.Beat(loop, persistEvery)
	}
}

// drainToken takes the token waiting on c, if any.
func drainToken(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// saveErrKey is what tells one save failure from another: the same failure
// names a new temp file each time, so the cause counts (read-only file
// system, no space left), not the path.
func saveErrKey(err error) string {
	if pe := (*os.PathError)(nil); errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}
