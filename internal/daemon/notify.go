package daemon

import (
	"fmt"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// Notifier speaks the sd_notify(3) protocol to systemd over the datagram
// socket in NOTIFY_SOCKET. Without that variable (not run by systemd) every
// call is a no-op.
type Notifier struct{}

func (Notifier) send(state string) error {
	_, err := sddaemon.SdNotify(false, state)
	return err
}

// Ready says the daemon finished starting, with a status line.
func (n Notifier) Ready(status string) error { return n.send("READY=1\nSTATUS=" + status) }

// Status sets the line `systemctl status` shows.
func (n Notifier) Status(status string) error { return n.send("STATUS=" + status) }

// Reloading says the daemon is reloading its configuration (systemd's
// reload protocol: RELOADING=1 with the CLOCK_MONOTONIC time in
// microseconds, then READY=1 when done, whatever the outcome).
func (n Notifier) Reloading(status string) error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return err
	}
	return n.send(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d\nSTATUS=%s", ts.Nano()/1000, status))
}

// Watchdog pings the service watchdog.
func (n Notifier) Watchdog() error { return n.send(sddaemon.SdNotifyWatchdog) }

// Stopping says the daemon is shutting down.
func (n Notifier) Stopping() error { return n.send(sddaemon.SdNotifyStopping) }

// WatchdogInterval returns the watchdog timeout systemd expects pings within
// (WatchdogSec=), or 0 when the watchdog is off or meant for another process.
func WatchdogInterval() time.Duration {
	d, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0
	}
	return d
}
