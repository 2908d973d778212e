package daemon

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/report"
)

// Notifier speaks the sd_notify(3) protocol to systemd over the datagram
// socket in NOTIFY_SOCKET. Without that variable (not run by systemd) every
// call is a no-op.
type Notifier struct{}

// notifyMax is the most systemd reads of one notification
// (NOTIFY_BUFFER_MAX, PIPE_BUF): a longer one is ignored whole, READY=1
// and RELOADING=1 with it.
const notifyMax = 4096

// fitNotify escapes state's backslashes and cuts it to notifyMax bytes (on
// a rune boundary, ending in "..."): every notification ends with its
// STATUS=, which is what is cut.
//
// systemd splits a notification into its lines with extract_first_word
// (strv_split_newlines), which takes a backslash as escaping the next
// character: a status line's `\x01` (a control character the daemon made
// printable), a regular expression's `\d` or `\(` in a refused reload's
// error showed as `x01`, `d`, `(` in `systemctl status` (seen in systemd
// 252; notify_recv_strv splits so since). Each backslash is sent doubled,
// which the split turns back into one. A cut line ends in "...", never in
// a lone backslash (one at the very end of a notification is an error of
// that split, read from systemd's code, not measured); a pair the cut
// splits costs a dot of the "...", not the line.
func fitNotify(state string) string {
	return report.Cut(strings.ReplaceAll(state, `\`, `\\`), notifyMax, "...")
}

func (Notifier) send(state string) error {
	state = fitNotify(state)
	if sendRaw(state) {
		return nil
	}
	// go-systemd: a new connection to the socket, whose error says why.
	_, err := sddaemon.SdNotify(false, state)
	return err
}

// notifySock is a datagram socket kept open for the notifications, sent to
// NOTIFY_SOCKET by a raw sendto(2): go-systemd dials a new connection for
// each, whose ordinary system calls (socket, connect, the poller's
// registration, write, close) wake the runtime's monitor thread (sysmon) with
// the watchdog's ping every minute (README, Cost). Non-blocking: a full
// queue at systemd's end (EAGAIN), like any other failure, falls back to
// go-systemd, which waits and returns the error.
var notifySock struct {
	mu   sync.Mutex
	env  string // the NOTIFY_SOCKET the socket and address are for
	open bool   // fd is open
	fd   int
	addr unix.RawSockaddrUnix
	alen uintptr
	made int // sockets made (tests)
}

// sendRaw sends state on notifySock; false when it could not (go-systemd
// is then used).
func sendRaw(state string) bool {
	ns := &notifySock
	ns.mu.Lock()
	defer ns.mu.Unlock()
	env := os.Getenv("NOTIFY_SOCKET")
	if env == "" || state == "" {
		return false
	}
	if env != ns.env || !ns.open {
		// A new NOTIFY_SOCKET, or no socket made yet (one that failed,
		// EMFILE, is tried again at the next send).
		if ns.open {
			unix.Close(ns.fd)
		}
		ns.env, ns.open = env, false
		// A path, or a name in the abstract namespace ("@name").
		if len(env) < len(ns.addr.Path) && (env[0] == '/' || env[0] == '@') {
			ns.addr = unix.RawSockaddrUnix{Family: unix.AF_UNIX}
			for i := range len(env) {
				ns.addr.Path[i] = int8(env[i])
			}
			if env[0] == '@' {
				ns.addr.Path[0] = 0
			}
			ns.alen = unsafe.Offsetof(ns.addr.Path) + uintptr(len(env))
			if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0); err == nil {
				ns.fd, ns.open = fd, true
				ns.made++
			}
		}
	}
	if !ns.open {
		return false
	}
	b := unsafe.Slice(unsafe.StringData(state), len(state))
	for {
		n, _, e := syscall.RawSyscall6(unix.SYS_SENDTO, uintptr(ns.fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
			unix.MSG_NOSIGNAL, uintptr(unsafe.Pointer(&ns.addr)), ns.alen)
		if e == syscall.EINTR {
			continue
		}
		return e == 0 && int(n) == len(b)
	}
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

// ExtendStart tells systemd that the start may take d more from now
// (EXTEND_TIMEOUT_USEC=): a start timeout (TimeoutStartSec=) that ends
// earlier is moved to then; a later one stays as it is.
func (n Notifier) ExtendStart(d time.Duration) error {
	return n.send(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", d.Microseconds()))
}

// Watchdog pings the service watchdog.
func (n Notifier) Watchdog() error { return n.send(sddaemon.SdNotifyWatchdog) }

// Stopping says the daemon is shutting down.
func (n Notifier) Stopping() error { return n.send(sddaemon.SdNotifyStopping) }

// tell sends one notification to systemd (send, with d.notify) unless the
// daemon has said STOPPING=1: nothing follows that. A reload in flight when
// SIGTERM came (a SIGHUP's, the control socket's) would send its READY=1
// after it, a unit reloaded and running to systemd after it was told the
// unit stops, as would a first pass that ends then. The notifications are
// sent under the lock, so none passes STOPPING=1 on its way.
func (d *Daemon) tell(send func(Notifier) error) error {
	d.sdMu.Lock()
	defer d.sdMu.Unlock()
	if d.sdStopping {
		return nil
	}
	return send(d.notify)
}

// tellStopping sends STOPPING=1, the daemon's last notification.
func (d *Daemon) tellStopping() {
	d.sdMu.Lock()
	defer d.sdMu.Unlock()
	d.sdStopping = true
	d.notify.Stopping()
}

// WatchdogInterval returns the watchdog timeout systemd expects pings within
// (WatchdogSec=), or 0 when the watchdog is off or meant for another process.
func WatchdogInterval() time.Duration {
	d, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0
	}
	return d
}
