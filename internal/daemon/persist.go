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

// persist writes the state file after changes (a condition, or the kernel
// log cursor), at most once a second, and beats its liveness. When saving
// fails (a read-only /var) it retries with backoff (1 s doubling to a
// minute) and logs once per change of error, and once when it works again.
func (d *Daemon) persist(ctx context.Context) {
	const loop = "state"
	d.live.Expect(loop, persistEvery)
	defer d.live.Forget(loop)
	t := d.grid().NewTicker(persistEvery)
	defer t.Stop()
	bo := backoff.Backoff{Min: time.Second, Max: persistEvery}
	var retry <-chan time.Time
	var lastErr string
	dirty := false
	for {
		changes := d.store.Dirty()
		if retry != nil {
			changes = nil // the retry saves them
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
		case <-retry:
			retry = nil
		case <-t.C:
		}
		if dirty && retry == nil {
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
				lastErr, dirty = "", false
				bo.Reset()
			}
		}
		d.live.Beat(loop, persistEvery)
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
