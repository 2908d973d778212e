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

// persistLater is how long a change that may wait (Store.TouchLater: the
// kernel log's cursor moving, a condition's new message with its status
// and reason unchanged) waits for the state file, unless a save for
// another change comes first. While the kernel logs a line every second or
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
func (d *Daemon) persist(ctx context.Context) {
	const loop = "state"
	d.live.Expect(loop, persistEvery)
	defer d.live.Forget(loop)
	t := d.grid().NewTicker(persistEvery)
	defer t.Stop()
	bo := backoff.Backoff{Min: time.Second, Max: persistEvery}
	var retry, laterDue <-chan time.Time
	var lastErr string
	dirty := false
	for {
		changes, later := d.store.Dirty(), d.store.Later()
		if retry != nil {
			changes, later = nil, nil // the retry saves them
		}
		if laterDue != nil {
			later = nil // a save is already due
		}
		select {
		case <-ctx.Done():
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
			laterDue = time.After(persistLater)
		case <-laterDue:
			laterDue, dirty = nil, true
		case <-retry:
			retry = nil
		case <-t.C:
		}
		if dirty && retry == nil {
			// The save takes every change made so far: requests for them
			// need no save of their own (one made after this still
			// gets one).
			drainToken(d.store.Dirty())
			drainToken(d.store.Later())
			err := d.store.Save(d.cfg.StateDir, time.Now())
			d.metrics.StateWrite(err)
			switch {
			case err != nil:
				wait := bo.Next()
				if key := saveErrKey(err); key != lastErr {
					d.log.Error("saving state failed; retrying with backoff", "dir", d.cfg.StateDir, "err", err, "retry_in", wait.Round(time.Millisecond))
					lastErr = saveErrKey(err)
				}
				retry = time.After(wait)
			default:
				if lastErr != "" {
					d.log.Info("saving state works again", "dir", d.cfg.StateDir)
				}
				// This save took what the due one would have.
				lastErr, dirty, laterDue = "", false, nil
				bo.Reset()
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
