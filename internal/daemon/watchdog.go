package daemon

import (
	"context"
	"regexp"
	"time"

	"github.com/syself/autopilot-health/internal/tick"
)

var digits = regexp.MustCompile(`[0-9.]+`)

// watchdog pings systemd at half the watchdog interval, only while every
// loop makes progress: a stuck daemon is restarted by systemd.
func (d *Daemon) watchdog(ctx context.Context, interval time.Duration) {
	period := interval / 2
	if period <= 0 {
		period = 15 * time.Second // no systemd watchdog: still refresh the health gauge
	}
	t := d.grid().NewTicker(period)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := d.Healthy(); err != nil {
			// Once per change of which loops are stuck, not per ping
			// period (the "no progress for N s" in the text grows).
			if key := digits.ReplaceAllString(err.Error(), "#"); key != lastErr {
				d.log.Error("not healthy; withholding the watchdog ping", "err", err)
				lastErr = key
			}
			continue
		}
		lastErr = ""
		if interval > 0 {
			d.tell(Notifier.Watchdog)
		}
	}
}

// grid lines up the daemon's periodic wake-ups (tick.Grid); the zero Grid
// (lines nothing up) for a daemon built without its parts (tests).
func (d *Daemon) grid() tick.Grid {
	if d.parts == nil {
		return tick.Grid{}
	}
	return d.parts.Grid
}
