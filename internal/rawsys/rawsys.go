// Package rawsys makes the system calls of the daemon's periodic probes in
// the raw form, which does not wake the Go runtime's monitor thread.
//
// A system call made the usual way (net.Conn's Read and Write, os.Stat)
// enters the runtime's syscall state, and entering it wakes the monitor
// thread (sysmon) when it sleeps. Woken that way, sysmon then polls every
// 20 µs while the process has work, and on a VM each of its wake-ups costs
// more CPU than the probe's own work: on the 2-vCPU machine of README's
// figures, a GET of /healthz on a kept connection to another process, every
// 10 ms on one processor, cost 361-372 µs of the process's CPU and 7.7-7.9
// thread wake-ups through net/http on a plain connection, and 210-222 µs
// and 2.8 on a Conn of this package (BenchmarkProbeGET). The calls here do
// not wait: a Conn is only made of a non-blocking stream socket (Wrap),
// Stat is for paths whose lookup stays in memory (InMemory), and
// ReadPseudoFile reads raw only a file of procfs or sysfs, made in memory
// when read (a sysctl, a PCI function's vendor: 5 system calls and no
// epoll_ctl a read, against os.ReadFile's 9 and 2, BenchmarkPseudoRead).
// That is what makes the raw form safe; the kernel may still take a few µs on a lock or
// on reclaiming memory, as for any call.
package rawsys

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is a connection whose reads and writes are raw system calls, waiting
// in the runtime's poller as the connection's own would (its deadlines
// hold). Everything else (Close, the addresses, the deadlines) is the
// wrapped connection's. A read or write error is a *net.OpError, as the
// wrapped connection's would be: a deadline's is os.ErrDeadlineExceeded (a
// net.Error whose Timeout is true), a closed connection's net.ErrClosed, a
// reset's the errno in an *os.SyscallError. A Write is whole or failed, and
// holds the connection's write lock throughout, as net's does: concurrent
// Writes do not interleave.
type Conn struct {
	net.Conn
	rc      syscall.RawConn
	network string
}

// Wrap returns c with raw reads and writes, or c itself when that is not
// safe: c has no descriptor (syscall.Conn), or it is not a non-blocking
// stream socket (a blocking descriptor would hold the thread, and with it
// the daemon's one processor, in the kernel; a datagram's empty message is
// not an end of file).
func Wrap(c net.Conn) net.Conn { return wrap(c, "") }

func wrap(c net.Conn, network string) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	safe := false
	rc.Control(func(fd uintptr) {
		typ, err1 := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE)
		fl, err2 := unix.FcntlInt(fd, unix.F_GETFL, 0)
		safe = err1 == nil && err2 == nil && typ == unix.SOCK_STREAM && fl&unix.O_NONBLOCK != 0
	})
	if !safe {
		return c
	}
	if network == "" && c.LocalAddr() != nil {
		network = c.LocalAddr().Network()
	}
	return &Conn{Conn: c, rc: rc, network: network}
}

// Unwrap is the wrapped connection.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		n, errno = rawIO(unix.SYS_READ, fd, p)
		return errno != syscall.EAGAIN
	})
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p in one hold of the connection's write lock (the
// poller's, held while it waits for room too): its callback writes until
// done.
func (c *Conn) Write(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	short := false
	err := c.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			n, e := rawIO(unix.SYS_WRITE, fd, p[written:])
			switch {
			case e == syscall.EAGAIN:
				return false
			case e != 0:
				errno = e
				return true
			case n <= 0 || n > len(p)-written:
				// A write that wrote nothing and said nothing, or said
				// it wrote more than it was given (net's guard too).
				short = true
				return true
			}
			written += n
		}
		return true
	})
	switch {
	case err != nil:
		return written, c.opError("write", err)
	case short:
		return written, c.opError("write", io.ErrUnexpectedEOF)
	case errno != 0:
		return written, c.opError("write", os.NewSyscallError("write", errno))
	}
	return written, nil
}

// opError is err as the wrapped connection's read or write says it; the
// poller's own errors (a deadline, a closed connection) come as
// "raw-read" and "raw-write" ones.
func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	e := &net.OpError{Op: op, Net: c.network, Err: err}
	if a := c.LocalAddr(); a != nil {
		e.Source = a
	}
	e.Addr = c.RemoteAddr()
	return e
}

// Pending reports whether the socket under c has bytes to read now
// (ioctl SIOCINQ, raw: it does not wait), false where it cannot tell (c
// has no descriptor, or is closed). A reader that keeps a connection
// between requests asks it for what the peer sent meanwhile.
func Pending(c net.Conn) bool {
	if w, ok := c.(*Conn); ok {
		c = w.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int32
	var e syscall.Errno
	if rc.Control(func(fd uintptr) {
		_, _, e = syscall.RawSyscall(unix.SYS_IOCTL, fd, unix.SIOCINQ, uintptr(unsafe.Pointer(&n)))
	}) != nil {
		return false
	}
	return e == 0 && n > 0
}

// atFDCWD is AT_FDCWD (-100) as the system call takes it.
var atFDCWD = func() uintptr { fd := unix.AT_FDCWD; return uintptr(fd) }()

// FileID is what tells a file apart from another (os.SameFile's test):
// its device and inode.
type FileID struct{ Dev, Ino uint64 }

// Stat is the FileID of the file at path (following symbolic links), by a
// raw newfstatat(2). It is for paths whose lookup stays in memory
// (InMemory: a socket under /run): a stat that had to read a disk would
// hold the thread, and the daemon's one processor, for that long.
func Stat(path string) (FileID, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return FileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	var st unix.Stat_t
	for {
		_, _, e := syscall.RawSyscall6(unix.SYS_NEWFSTATAT, atFDCWD, uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&st)), 0, 0, 0)
		switch e {
		case 0:
			return FileID{Dev: st.Dev, Ino: st.Ino}, nil
		case syscall.EINTR:
			continue
		default:
			return FileID{}, &os.PathError{Op: "stat", Path: path, Err: e}
		}
	}
}

// Dial connects as a zero net.Dialer does (http.Transport's default) and
// wraps the connection.
var Dial = DialWith(&net.Dialer{})

// DialWith returns a dial function that connects with d and wraps the
// connection.
func DialWith(d *net.Dialer) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return wrap(c, network), nil
	}
}

// InMemory reports whether a lookup of path stays in memory, so that Stat
// of it cannot hold the thread on a disk: no symbolic link on the way (the
// path is its own EvalSymlinks) and its directory on a tmpfs (/run). It
// makes ordinary system calls: ask it when a connection is made, not at
// every probe.
func InMemory(path string) bool {
	if !filepath.IsAbs(path) {
		return false
	}
	if real, err := filepath.EvalSymlinks(path); err != nil || real != filepath.Clean(path) {
		return false
	}
	var fs unix.Statfs_t
	return unix.Statfs(filepath.Dir(path), &fs) == nil && fs.Type == unix.TMPFS_MAGIC
}

// MonotonicMicros is CLOCK_MONOTONIC in µs (the kernel log's clock), read
// as the runtime reads its own clock: clock_gettime(CLOCK_MONOTONIC) in the
// vDSO, without entering the kernel. x/sys's ClockGettime is a system call
// made the usual way, which wakes the runtime's monitor thread; a raw
// clock_gettime(2) does not, but is still a kernel entry, which on a
// paravirtualized VM is a trip through the hypervisor, and the kernel log
// reader's read timeout and the monitor read this clock every 10 s.
func MonotonicMicros() uint64 { return uint64(nanotime()) / 1e3 }

// nanotime is the runtime's monotonic clock: CLOCK_MONOTONIC by the vDSO on
// Linux (runtime·nanotime1), the one time.Now's monotonic reading comes
// from. The runtime keeps the name for packages that link to it
// (go.dev/issue/67401).
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64
