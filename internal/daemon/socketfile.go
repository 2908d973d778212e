package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// The daemon's Unix sockets (the control socket, the status socket) and
// their files. A socket's file is only its name: removed while the daemon
// runs (an operator's rm -rf /run/autopilot-health/*, a tmpfiles clean),
// the daemon still holds the socket, but nothing can connect to it, and
// `autopilot-health status`, `reload` (the unit's ExecReload=) and `tamper
// clear` found no daemon. The daemon binds such a socket again
// (socketListener.rebind, when watchSockets sees the file go), and a file
// at the path that is not the one its bind made (another daemon's, after
// this one's was removed) is never removed by it: not when it binds again,
// where something answers there, and not when it stops (removeIfID).

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// socketID is the identity of the socket file at path; false when nothing,
// or something other than a socket, is there.
func socketID(path string) (fileID, bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		return fileID{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, true
}

// removeIfID removes the socket file at path when it is the one id names
// (the one this process's bind made): a file put there since (another
// daemon's socket, bound once this one's was removed) is left.
func removeIfID(path string, id fileID) {
	if cur, ok := socketID(path); ok && cur == id {
		os.Remove(path)
	}
}

// bindSocket binds a Unix socket at path, mode 0600, and returns it with
// the identity of the file its bind made. Its Close does not remove the
// file (Go's listener does, whoever's file is at the path by then): the
// socketListener that holds it removes its own only.
func bindSocket(path string) (*net.UnixListener, fileID, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fileID{}, err
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	id, _ := socketID(path)
	if afterBind != nil {
		afterBind(path)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ul.Close()
		removeIfID(path, id)
		if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("%w: %w", errRemovedAsBound, err)
		}
		return nil, fileID{}, err
	}
	return ul, id, nil
}

// afterBind, where set (tests), runs between a socket's bind and its
// chmod.
var afterBind func(path string)

// errRemovedAsBound: the file a bind made was gone before its chmod, removed
// again at once (a loop removing the directory's files). At a rebind that
// is no failure to say: the removal's own event binds it again.
var errRemovedAsBound = errors.New("its file was removed again as it was bound")

// socketListener is the listener of one of the daemon's sockets, which
// rebind can bind again at its path: its Accept goes on with the new
// socket, so whoever serves it (serveControl, the status server) serves on
// without knowing. Its Close removes the socket's file only when it is the
// one its last bind made.
type socketListener struct {
	path string

	mu     sync.Mutex
	cur    *net.UnixListener
	id     fileID
	closed bool

	// failed: why the last rebind did not bind ("" once one did; the
	// socket watch's goroutine's own), logged once until it changes.
	failed string
	// said: the socket watch's lines for this socket, each reason said
	// once a window.
	said rebindLog
	// late: closed by the rebind that binds a listener made unbound
	// (newUnboundListener: something not a socket was at its path at the
	// start), for its server to serve it from then.
	late chan struct{}
}

// newUnboundListener is a listener of path that no bind made yet (cur nil:
// something not a socket was at the path at the start, failed says what):
// rebind binds it once that is gone, as it binds a socket whose file was
// removed, and closes late. Not served until then.
func newUnboundListener(path, failed string) *socketListener {
	return &socketListener{path: path, failed: failed, late: make(chan struct{})}
}

// unbound reports whether no bind made the listener yet
// (newUnboundListener).
func (l *socketListener) unbound() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur == nil
}

func newSocketListener(path string, ln *net.UnixListener, id fileID) *socketListener {
	return &socketListener{path: path, cur: ln, id: id}
}

func (l *socketListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		cur := l.cur
		l.mu.Unlock()
		c, err := cur.Accept()
		if err == nil {
			return c, nil
		}
		l.mu.Lock()
		replaced := l.cur != cur && !l.closed
		l.mu.Unlock()
		if !replaced {
			return nil, err
		}
		// rebind closed it for a new one: accepted on from that.
	}
}

func (l *socketListener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return net.ErrClosed
	}
	l.closed = true
	cur, id := l.cur, l.id
	l.mu.Unlock()
	if cur == nil {
		return nil // never bound: no socket, no file of its own
	}
	err := cur.Close()
	removeIfID(l.path, id)
	return err
}

func (l *socketListener) Addr() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur.Addr()
}

// bound reports whether the file at the path is the one the last bind
// made (false once closed).
func (l *socketListener) bound() bool {
	l.mu.Lock()
	closed, id := l.closed, l.id
	l.mu.Unlock()
	cur, ok := socketID(l.path)
	return !closed && ok && cur == id
}

// errClosedListener: rebind of a listener closed (the daemon stops).
var errClosedListener = errors.New("the daemon is stopping")

// rebind binds the socket again at its path when the file its last bind
// made is gone (removed, renamed, its directory removed), as listenControl
// binds at start: the directory made where it is gone (0700), under its
// exclusive lock (a daemon starting holds it: none is bound then), nothing
// bound where a daemon answers at the path, a stale socket replaced,
// anything else there left. The socket it replaces is closed (the
// connections it accepted are answered). It returns whether it bound;
// false, nil where the file is still the one bound.
func (l *socketListener) rebind(log *slog.Logger) (bool, error) {
	if l.bound() {
		return false, nil
	}
	dir := filepath.Dir(l.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	unlock, err := lockStart(dir, log)
	if err != nil {
		return false, err
	}
	defer unlock()
	if l.bound() {
		return false, nil
	}
	// Something not a socket there (a symlink to this daemon's other
	// socket) is named, not connected to (daemonAnswers looks first).
	nl, id, err := takeSocket(l.path, "another daemon answers on it")
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		nl.Close()
		removeIfID(l.path, id)
		return false, errClosedListener
	}
	old := l.cur
	l.cur, l.id = nl, id
	l.mu.Unlock()
	if old == nil {
		close(l.late) // the first bind: served from now
		return true, nil
	}
	old.Close()
	return true, nil
}
