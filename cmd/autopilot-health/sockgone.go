package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/systemd"
)

// unitState is daemonUnit's ActiveState and its main process (0: none),
// asked of systemd over D-Bus (never systemctl), which tells any user;
// "", 0 where it cannot be told (no system bus: a container; the unit not
// loaded: not installed; a daemon run by hand beside an installed unit
// sees it inactive or failed), within 2 s. A variable for tests.
var unitState = func() (string, uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m := systemd.NewDBus()
	defer m.Close()
	u, pid, err := m.ServiceMain(ctx, daemonUnit)
	if err != nil || u.LoadState != "loaded" {
		return "", 0
	}
	return u.ActiveState, pid
}

// lockUnreadable reports whether the lock file of the state directory
// stateDir cannot be looked at for want of permission (a user other than
// root: state_dir is 0750, root's), so whether a daemon holds it cannot be
// told from it.
func lockUnreadable(stateDir string) bool {
	_, err := os.Stat(filepath.Join(stateDir, daemon.StateLockName))
	return errors.Is(err, os.ErrPermission)
}

// stateDirOf is the state directory the configuration file at path names
// (the default's where it does not load).
func stateDirOf(path string, explicit bool) string {
	if cfg, _, err := loadConfig(path, explicit); err == nil {
		return cfg.StateDir
	}
	return config.Default().StateDir
}

// socketGone words the sockets nothing answers on (the candidates asked,
// all of them "not running"; at least one) while a daemon holds the lock of the state
// directory stateDir: the daemon runs, so "not running" is false. It says
// which of starting, running and stopping the unit is (over D-Bus) and,
// where it runs, that the socket's file was removed under it; "" where no
// daemon holds the state directory. Where that cannot be told (a user
// other than root: state_dir is root's), the unit's main process, which
// systemd tells any user over D-Bus, is the daemon: the same words with
// that pid, and "" where the unit has none (inactive, failed, not
// installed). control: the control socket (reload, tamper clear), else the
// status socket. The control socket is bound before the state directory
// is locked and removed as the stop begins, the status socket bound once
// the start is done and removed after the lock is let go.
func socketGone(sockets []string, stateDir string, control bool) string {
	pid := daemon.StateLockHolder(stateDir)
	holder := fmt.Sprintf("pid %d holds the lock of its state directory %s", pid, stateDir)
	st, main := "", uint32(0)
	switch {
	case pid > 0:
		st, _ = unitState()
	case !lockUnreadable(stateDir):
		return ""
	default:
		// Before, this user was told "not running" while the unit ran:
		// who holds the lock is root's to read.
		if st, main = unitState(); main == 0 {
			return ""
		}
		pid = int(main)
		holder = fmt.Sprintf("pid %d is its main process, as systemd says; the lock of its state directory %s is root's to read", pid, stateDir)
	}
	which := "status socket"
	if control {
		which = "control socket"
	}
	socket := sockets[0]
	if len(sockets) > 1 {
		// The file's socket, and the default, which a daemon started
		// before the file named another serves (socketCandidates).
		socket += " (nor the default " + strings.Join(sockets[1:], ", ") + ")"
	}
	// Root reads the holder's sockets (another user's pid is the unit's
	// main process, whose descriptors are root's to read).
	if elsewhere := servedElsewhere(pid, sockets, control); main == 0 && len(elsewhere) > 0 {
		key := "status.socket"
		if control {
			key = "control_socket"
		}
		return fmt.Sprintf("a daemon runs (%s) and serves its %s at %s, not at %s: it was started with another %s, which needs a restart to change (systemctl restart autopilot-health); --socket %s asks it meanwhile", holder, which, strings.Join(elsewhere, " and "), socket, key, elsewhere[0])
	}
	removed := "its file was removed while the daemon ran, and the daemon has not bound it again (it does once it sees the file go; journalctl -u autopilot-health says why not); `systemctl restart autopilot-health` makes it again"
	switch {
	case st == "active" || st == "reloading" || control && st == "activating":
		return fmt.Sprintf("%s is %s and its daemon runs (%s), but its %s %s is gone: %s", daemonUnit, st, holder, which, socket, removed)
	case st == "activating":
		return fmt.Sprintf("%s is still starting (%s): its status socket %s is bound once its start is done (systemctl status autopilot-health)", daemonUnit, holder, socket)
	case st == "deactivating" && control:
		return fmt.Sprintf("%s is stopping (%s): its control socket %s is removed as the stop begins; ask again once it runs (systemctl status autopilot-health)", daemonUnit, holder, socket)
	case st == "deactivating":
		return fmt.Sprintf("%s is stopping (%s), and its status socket %s is gone: its file was removed while the daemon ran (it is not bound again during a stop)", daemonUnit, holder, socket)
	case st == "inactive" || st == "failed":
		// The unit has no process: the one that holds the lock was
		// started otherwise (by hand), and neither the unit's journal
		// nor its restart is about it.
		byHand := fmt.Sprintf("a daemon runs (%s), not %s's (the unit is %s: one run by hand?), but nothing answers on its %s %s: ", holder, daemonUnit, st, which, socket)
		gone := fmt.Sprintf("its file was removed while it ran, and it has not bound it again (it does once it sees the file go; its own log says why not); stopping it (kill %d) and starting it again makes it again", pid)
		if control {
			return byHand + "it is stopping (the socket goes as the stop begins), or " + gone
		}
		return byHand + "it is still starting (the socket is bound once its start is done), or " + gone
	case control:
		return fmt.Sprintf("a daemon runs (%s), but nothing answers on its control socket %s: it is stopping (the socket goes as the stop begins), or %s", holder, socket, removed)
	}
	return fmt.Sprintf("a daemon runs (%s), but nothing answers on its status socket %s: it is still starting (the socket is bound once its start is done), or %s", holder, socket, removed)
}

// controlNotASocket words what is at the control socket's path, not a
// socket (ns), where a daemon holds the lock of the state directory
// stateDir: that daemon runs, so "not running, ... and does not start"
// (NotASocketError) is false. A start refuses such a path (listenControl),
// so it was put there while the daemon ran (a file renamed onto the
// socket's name, which removes the socket without a trace of it but the
// daemon's log line); the daemon leaves it and binds its socket again once
// it is removed. reload adds that SIGHUP reloads meanwhile (the daemon's
// log line says so too). "" where no daemon holds the lock, or that cannot
// be told (a user other than root: the words of NotASocketError then).
func controlNotASocket(ns daemon.NotASocketError, stateDir string, reload bool) string {
	pid := daemon.StateLockHolder(stateDir)
	if pid <= 0 {
		return ""
	}
	words := fmt.Sprintf("a daemon runs (pid %d holds the lock of its state directory %s), but its control socket %s is not a socket but %s, put there while the daemon ran (a start refuses it): the daemon leaves it as it is and binds its socket again once it is removed: move it away (journalctl -u autopilot-health says so)", pid, stateDir, ns.Socket, ns.What)
	if reload {
		words += fmt.Sprintf("; kill -HUP %d reloads meanwhile, without an answer", pid)
	}
	return words
}

// answersElsewhere is, where nothing answers on the socket given with
// --socket (given), a candidate socket of the configuration
// (socketCandidates) that a daemon listens on (a connect that is taken;
// nothing is sent, which a daemon's socket of either kind answers with
// nothing but a close); "" where none does. The socket given may be no
// daemon's at all (a typo, an old path): "not running" is then false, and
// so is "its socket is gone" of the daemon that holds the state directory,
// whose restart it advises.
func answersElsewhere(given string, candidates []string) string {
	for _, c := range candidates {
		if c == given {
			continue
		}
		if conn, err := net.DialTimeout("unix", c, time.Second); err == nil {
			conn.Close()
			return c
		}
	}
	return ""
}

// elsewhereWords words answersElsewhere's socket for cmd.
func elsewhereWords(cmd, given, other string) string {
	return fmt.Sprintf("autopilot-health %s: nothing answers on %s, the socket --socket gives, but a daemon answers on %s: leave --socket out, or give that one", cmd, given, other)
}

// servedElsewhere is the sockets of the kind asked (control: the control
// socket, else the status socket) that the daemon pid listens on, other
// than those asked (sockets), each a socket file at its path: the daemon
// was started with another socket than the configuration names now (the
// socket keys need a restart to change), and "its socket is gone" would
// be false. nil where it listens on one of those asked (its file removed:
// the kernel keeps the name), or on none other of that kind.
func servedElsewhere(pid int, sockets []string, control bool) []string {
	if pid <= 0 {
		return nil
	}
	var out []string
	for _, p := range daemon.ListeningSockets(pid) {
		if slices.Contains(sockets, p) {
			return nil
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSocket {
			continue
		}
		if k := socketKind(p); k == "control" && control || k == "status" && !control {
			out = append(out, p)
		}
	}
	return out
}

// socketKind tells the daemon's two sockets apart by the first bytes of
// their answer to a status request, within a second: "status" for HTTP,
// "control" for a line of JSON (the control socket's refusal of a request
// that is not one, which it does not log), "" for anything else.
func socketKind(path string) string {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "GET "+daemon.StatusPath+" HTTP/1.0\r\nHost: autopilot-health\r\n\r\n"); err != nil {
		return ""
	}
	b := make([]byte, 5)
	n, _ := io.ReadFull(c, b)
	switch {
	case n == 5 && string(b) == "HTTP/":
		return "status"
	case n > 0 && b[0] == '{':
		return "control"
	}
	return ""
}

// socketNotKnown words, where nothing answered on asked, the default
// socket of its kind ("status" or "control") asked because the
// configuration file cfgPath (given: by --config) names none this user
// learns: one this user may not read (the daemon may serve the file's
// socket: run with sudo), or a --config that is not there (a typo). ""
// where the file was read, or is the default one absent: "not running"
// holds then.
func socketNotKnown(cfgPath string, given bool, kind, asked string) string {
	_, err := config.ReadFile(cfgPath)
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Sprintf("%s: permission denied: the %s socket it names is not known (run with sudo); nothing answers on %s", cfgPath, kind, asked)
	case errors.Is(err, os.ErrNotExist) && given && cfgPath != config.DefaultPath:
		return fmt.Sprintf("%s: no such file: the %s socket it names is not known; nothing answers on %s", cfgPath, kind, asked)
	}
	return ""
}
