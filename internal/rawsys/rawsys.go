// Package rawsys makes the system calls of the daemon's periodic probes in
// the raw form, which does not wake the Go runtime's monitor thread.
//
// A system call made the usual way (net.Conn's Read and Write, os.Stat)
// enters the runtime's syscall state, and entering it wakes the monitor
// thread (sysmon) when it sleeps. Woken that way, sysmon then polls every
// 20 µs while the process has work, and on a VM each of its wake-ups costs
// more CPU than the probe's own work: on the 2-vCPU machine of README's
// figures, a GET of /healthz every 10 s on a kept connection took ~660 µs
// of CPU through net/http on a plain connection, with ~10 sysmon wake-ups,
// and ~260 µs on a Conn of this package, with none (a program doing only
// that, every 500 ms for 40 s). The calls here never block (a
// connection's descriptor is non-blocking, a stat of a socket's path does
// no I/O), which is what makes the raw form safe.
package rawsys

import (
	"context"
	"io"
	"net"
	"os"
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
// reset's the errno in an *os.SyscallError.
type Conn struct {
	net.Conn
	rc syscall.RawConn
}

// Wrap returns c with raw reads and writes, or c itself when it has no
// descriptor (syscall.Conn).
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, rc: rc}
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

func (c *Conn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		var n int
		var errno syscall.Errno
		err := c.rc.Write(func(fd uintptr) bool {
			n, errno = rawIO(unix.SYS_WRITE, fd, p[written:])
			return errno != syscall.EAGAIN
		})
		switch {
		case err != nil:
			return written, c.opError("write", err)
		case errno != 0:
			return written, c.opError("write", os.NewSyscallError("write", errno))
		}
		written += n
	}
	return written, nil
}

// rawIO is read(2) or write(2) of p on fd, again after EINTR.
func rawIO(nr, fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(nr, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return int(n), 0
		}
	}
}

// opError is err as the wrapped connection's read or write says it; the
// poller's own errors (a deadline, a closed connection) come as
// "raw-read" and "raw-write" ones.
func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err
	}
	e := &net.OpError{Op: op, Err: err}
	if a := c.LocalAddr(); a != nil {
		e.Net, e.Source = a.Network(), a
	}
	e.Addr = c.RemoteAddr()
	return e
}

// atFDCWD is AT_FDCWD (-100) as the system call takes it.
var atFDCWD = func() uintptr { fd := unix.AT_FDCWD; return uintptr(fd) }()

// FileID is what tells a file apart from another (os.SameFile's test):
// its device and inode.
type FileID struct{ Dev, Ino uint64 }

// Stat is the FileID of the file at path (following symbolic links), by a
// raw newfstatat(2). It is for paths whose lookup does no I/O (a socket
// under /run): a stat that had to read a disk would hold the daemon's one
// processor for that long.
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
func Dial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// MonotonicMicros is CLOCK_MONOTONIC in µs (the kernel log's clock), by a
// raw clock_gettime(2): x/sys's ClockGettime is a system call made the usual
// way (not the vDSO), which the kernel log reader's read timeout made every
// 10 s.
func MonotonicMicros() uint64 {
	var ts unix.Timespec
	syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0)
	return uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3
}
