package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// socketWatchMask: the removal or rename of an entry of a socket's
// directory, an entry renamed onto one of its names (mv x.sock
// control.sock: the file it replaces is gone, and no IN_DELETE says so),
// and the removal or rename of the directory itself. Nothing else:
// connections, the daemon's own binds and what else is written there wake
// nothing.
const socketWatchMask = unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// parentWatchMask: an entry of the directory that holds a socket's
// directory removed, renamed or made. The directory's own removal is not
// told by its watch while something holds it (the sockets bound in it
// hold it, as long as they are open: IN_DELETE_SELF comes when the last
// reference goes), and a directory made there again (by this daemon's
// rebind, by another daemon's start) is another inode, watched once it is
// seen.
const parentWatchMask = unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_ONLYDIR

// watchSockets binds the control socket and the status socket again when
// their files are removed while the daemon runs (rm -rf
// /run/autopilot-health/*, the directory itself removed or renamed): an
// inotify watch of their directories, which wakes only when an entry there
// is removed or renamed, and of the directories that hold them, when an
// entry there is removed, renamed or made (no timer; the idle daemon does
// not wake for it).
// Each socket whose file is no longer the one its bind made is bound again
// (socketListener.rebind: not where another daemon answers, nor over
// anything that is not a stale socket), logged once per removal: bound
// again, or why not; so is the status socket that was not bound at the
// start, something not a socket at its path (serveStatus), once that is
// gone (logged, not counted as a rebind). The watches are added before it returns (Run's
// READY=1 comes after them); the function it returns reads them until ctx
// is done (the stop: no socket is bound again then), at once where there
// is no socket, or no inotify (logged: a removed socket is then gone until
// a restart).
func (d *Daemon) watchSockets() func(ctx context.Context) {
	var names, dirs []string
	if ln, ok := d.control.(*socketListener); ok {
		names = append(names, ln.path)
	}
	if d.cfg.Status.Socket != "" {
		names = append(names, d.cfg.Status.Socket)
	}
	masks := map[string]uint32{}
	for _, p := range names {
		dir := filepath.Dir(p)
		masks[dir] |= socketWatchMask
		masks[filepath.Dir(dir)] |= parentWatchMask
		names = append(names, dir) // an event of its name in its parent
	}
	for dir := range masks {
		dirs = append(dirs, dir)
	}
	slices.Sort(dirs)
	if len(dirs) == 0 {
		return func(context.Context) {}
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		d.log.Warn("the sockets' directories are not watched: a socket file removed while the daemon runs is not bound again until it restarts", "err", os.NewSyscallError("inotify_init1", err))
		return func(context.Context) {}
	}
	// Non-blocking: read through the runtime's poller (the goroutine
	// sleeps until an event), and Close ends a blocked Read.
	f := os.NewFile(uintptr(fd), "inotify")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return func(context.Context) {}
	}
	// watch adds the watches (again: a directory removed and made anew
	// is another inode; adding a watched one again changes nothing).
	watch := func() {
		rc.Control(func(fd uintptr) {
			for _, dir := range dirs {
				if _, err := unix.InotifyAddWatch(int(fd), dir, masks[dir]); err != nil {
					d.log.Debug("a socket's directory is not watched", "dir", dir, "err", err)
				}
			}
		})
	}
	watch()
	return func(ctx context.Context) {
		defer f.Close()
		defer d.quietSockets()
		stop := context.AfterFunc(ctx, func() { f.Close() })
		defer stop()
		// A removal between the bind and the watch.
		d.rebindSockets()
		d.readSocketWatch(ctx, f, rc, names, watch)
	}
}

// readSocketWatch reads the watch's events until ctx is done, and binds
// the sockets again on an event of theirs.
func (d *Daemon) readSocketWatch(ctx context.Context, f *os.File, rc syscall.RawConn, names []string, watch func()) {
	buf := make([]byte, 16*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := f.Read(buf)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.log.Warn("the sockets' directories are no longer watched: a socket file removed while the daemon runs is not bound again until it restarts", "err", err)
			return
		}
		ours := false
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := string(buf[off+unix.SizeofInotifyEvent : min(n, off+unix.SizeofInotifyEvent+size)])
			off += unix.SizeofInotifyEvent + size
			name = strings.TrimRight(name, "\x00") // the kernel pads it
			switch {
			case mask&unix.IN_MOVE_SELF != 0:
				// The directory renamed, with the sockets in it:
				// its watch follows it; the path is watched anew.
				rc.Control(func(fd uintptr) { unix.InotifyRmWatch(int(fd), uint32(wd)) })
				ours = true
			case mask&(unix.IN_DELETE_SELF|unix.IN_IGNORED|unix.IN_Q_OVERFLOW) != 0:
				ours = true
			case slices.ContainsFunc(names, func(p string) bool { return filepath.Base(p) == name }):
				ours = true
			}
		}
		if !ours {
			continue // another file of the directory
		}
		d.rebindSockets()
		watch()
		if d.socketEvent != nil {
			d.socketEvent()
		}
	}
}

// rebindSockets binds the control socket and the status socket again
// where their files are gone, each logged: bound again, or why not (once
// until the reason changes or a rebind works).
func (d *Daemon) rebindSockets() {
	d.mu.Lock()
	status := d.statusLn
	d.mu.Unlock()
	control, _ := d.control.(*socketListener)
	for _, s := range []struct {
		what, name string
		ln         *socketListener
		lost       string
	}{
		{"control socket", listenerControl, control, "tamper clear and reload (systemctl reload) are not possible until it is (kill -HUP still reloads)"},
		{"status socket", listenerStatus, status, "autopilot-health status does not answer until it is"},
	} {
		if s.ln == nil {
			continue
		}
		// Not bound at the start (something not a socket was at its
		// path): bound once that is gone, said so, and not counted
		// (the metric counts sockets bound again after their files
		// were removed).
		first := s.ln.unbound()
		lostWords := "the " + s.what + "'s file was removed while the daemon ran, and is not bound again: "
		if first {
			lostWords = "the " + s.what + ", not bound at the start (something not a socket was at its path), is not bound yet: "
		}
		bound, err := s.ln.rebind(d.log)
		switch {
		case err == errClosedListener:
		case errors.Is(err, errRemovedAsBound):
			// Removed again as it was bound: that removal's
			// event binds it again, and says so.
			d.log.Debug("the "+s.what+"'s file was removed again as it was bound; binding it again", "socket", s.ln.path)
		case err != nil:
			// Once per reason: each removal there tries again. A
			// reason said again after a rebind that worked is said
			// once a window (rebindLog).
			if err.Error() != s.ln.failed {
				s.ln.failed = err.Error()
				s.ln.said.say(err.Error(), func() {
					d.log.Error(lostWords+s.lost+"; it is tried again when a file there is removed, and at the next start", "socket", s.ln.path, "err", err)
				}, func(more int, over time.Duration) {
					d.log.Error(fmt.Sprintf("the %s could not be bound again %s in the last %s, each after a rebind that worked (its file removed while the daemon ran; logged once a window): %s", s.what, timesWords(more), spanWords(over), s.lost), "socket", s.ln.path, "err", err, "not_logged", more)
				})
			}
		case bound && first:
			s.ln.failed = ""
			d.log.Warn("the "+s.what+"'s path is free, what was there at the start gone; bound it", "socket", s.ln.path)
		case bound:
			s.ln.failed = ""
			if d.rebinds != nil {
				d.rebinds.WithLabelValues(s.name).Inc()
			}
			s.ln.said.say("", func() {
				d.log.Warn("the "+s.what+"'s file was removed while the daemon ran; bound it again", "socket", s.ln.path)
			}, func(more int, over time.Duration) {
				d.log.Warn(fmt.Sprintf("bound the %s again %s in the last %s, its file removed each time while the daemon ran (logged once a window; autopilot_health_socket_rebinds_total counts each)", s.what, timesWords(more), spanWords(over)), "socket", s.ln.path, "not_logged", more)
			})
		}
	}
}

// quietSockets says what the sockets' rebind logs hold, and ends their
// timers (the socket watch ends: the daemon stops).
func (d *Daemon) quietSockets() {
	d.mu.Lock()
	status := d.statusLn
	d.mu.Unlock()
	control, _ := d.control.(*socketListener)
	for _, ln := range []*socketListener{control, status} {
		if ln != nil {
			ln.said.stop()
		}
	}
}
