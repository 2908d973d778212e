package daemon

import (
	"context"
	"time"
)

// watchdog pings systemd at half the watchdog interval, only while every
// loop makes progress: a stuck daemon is restarted by systemd.
func (d *Daemon) watchdog(ctx context.Context, interval time.Duration) {
	period := interval / 2
	if period <= 0 {
		period = 15 * time.Second // no systemd watchdog: still refresh the health gauge
	}
	t := time.NewTicker(period)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := d.Healthy(); err != nil {
			if err.Error() != lastErr {
				d.log.Error("not healthy; withholding the watchdog ping", "err", err)
			}
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		if interval > 0 {
			d.notify.Watchdog()
		}
	}
}
