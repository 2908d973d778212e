package daemon

import (
	"context"
	"time"
)

// persistEvery bounds how long the persister loop waits without a change.
const persistEvery = time.Minute

// persist writes the state file after changes (a condition, or the kernel
// log cursor), at most once a second, and beats its liveness.
func (d *Daemon) persist(ctx context.Context) {
	const loop = "state"
	d.live.Expect(loop, persistEvery)
	defer d.live.Forget(loop)
	t := time.NewTicker(persistEvery)
	defer t.Stop()
	dirty := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.store.Dirty():
			dirty = true
			// Coalesce bursts of changes.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		case <-t.C:
		}
		if dirty {
			err := d.store.Save(d.cfg.StateDir, time.Now())
			d.metrics.StateWrite(err)
			if err != nil {
				d.log.Error("saving state failed", "dir", d.cfg.StateDir, "err", err)
			} else {
				dirty = false
			}
		}
		d.live.Beat(loop, persistEvery)
	}
}
