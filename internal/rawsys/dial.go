package rawsys

import (
	"context"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Dial connects as a zero net.Dialer does (http.Transport's default) and
// wraps the connection (Wrap). The address of a unix socket's path, or an
// IP address and a port (no name to look up, no zone), is connected by raw
// system calls: socket(2) (SOCK_NONBLOCK, SOCK_CLOEXEC), connect(2), and
// getsockopt(2) of SO_ERROR where the connect is in progress; a failed
// connect's close(2) is raw too. A probe of a service that is not there
// (a refused connect, a unix socket's path that does not exist: on the
// idle benchmark's node kube-proxy's and the tunnel agent's metrics and
// cilium-agent's socket, 18 dials a minute) so makes no system call that
// enters the runtime's syscall state, and wakes no monitor thread (see the
// package doc; TestDialRefusedMakesNoOrdinarySystemCall). Its error is
// the one net.Dialer gives, word for word ("dial tcp 127.0.0.1:9587:
// connect: connection refused", "dial unix PATH: connect: no such file or
// directory"; TestDialErrorsReadAsNetDialers). A connect that has not
// finished when connect(2) returns (a SYN unanswered yet) waits in the
// runtime's poller, and the context's deadline and cancellation hold as
// net.Dialer's; a connection made is handed to net (net.FileConn), which
// makes ordinary calls (dup, fcntl, epoll_ctl): kept connections make a
// dial rare where the service answers. Any other address (a name, a zone,
// an abstract unix socket) is dialled by net.Dialer.
func Dial(ctx context.Context, network, address string) (net.Conn, error) {
	if d, ok := rawTarget(network, address); ok {
		return dialRaw(ctx, network, d)
	}
	return dialNet(ctx, network, address)
}

// dialNet is a zero net.Dialer's dial, wrapped.
var dialNet = DialWith(&net.Dialer{})

// rawDest is an address Dial connects by raw calls: its socket's family,
// the sockaddr and its length, and the address errors name.
type rawDest struct {
	family int
	sa     []byte // the sockaddr's bytes
	addr   net.Addr
}

// rawTarget is the raw destination of network and address, ok false when
// net.Dialer must dial it.
func rawTarget(network, address string) (rawDest, bool) {
	switch network {
	case "unix":
		// A path (not an abstract name, '@'), short enough for sun_path
		// with its NUL.
		var sa unix.RawSockaddrUnix
		if address == "" || address[0] == '@' || len(address) >= len(sa.Path) {
			return rawDest{}, false
		}
		sa.Family = unix.AF_UNIX
		for i := 0; i < len(address); i++ {
			sa.Path[i] = int8(address[i])
		}
		// The length as net's: the family and the path with its NUL.
		n := int(unsafe.Offsetof(sa.Path)) + len(address) + 1
		b := unsafe.Slice((*byte)(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
		return rawDest{family: unix.AF_UNIX, sa: append([]byte(nil), b[:n]...), addr: &net.UnixAddr{Name: address, Net: "unix"}}, true
	case "tcp", "tcp4", "tcp6":
		ap, err := netip.ParseAddrPort(address)
		if err != nil || ap.Addr().Zone() != "" || ap.Addr().Is4In6() {
			return rawDest{}, false
		}
		ip := ap.Addr()
		if (network == "tcp4" && !ip.Is4()) || (network == "tcp6" && !ip.Is6()) {
			return rawDest{}, false
		}
		addr := net.TCPAddrFromAddrPort(ap)
		if ip.Is4() {
			sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ip.As4()}
			putPort(&sa.Port, ap.Port())
			b := unsafe.Slice((*byte)(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
			return rawDest{family: unix.AF_INET, sa: append([]byte(nil), b...), addr: addr}, true
		}
		sa := unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ip.As16()}
		putPort(&sa.Port, ap.Port())
		b := unsafe.Slice((*byte)(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
		return rawDest{family: unix.AF_INET6, sa: append([]byte(nil), b...), addr: addr}, true
	}
	return rawDest{}, false
}

// putPort writes port into a sockaddr's port field, in network byte order.
func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

// dialRaw connects to d (Dial).
func dialRaw(ctx context.Context, network string, d rawDest) (net.Conn, error) {
	fail := func(err error) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: d.addr, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return fail(ctxError(err))
	}
	r, _, e := syscall.RawSyscall(unix.SYS_SOCKET, uintptr(d.family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if e != 0 {
		return fail(os.NewSyscallError("socket", e))
	}
	fd := r
	_, _, e = syscall.RawSyscall(unix.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&d.sa[0])), uintptr(len(d.sa)))
	switch e {
	case 0, syscall.EISCONN:
		return connOf(ctx, network, fd, d, nil)
	case syscall.EINPROGRESS, syscall.EALREADY, syscall.EINTR:
		// Where the peer is this host, its answer (a refusal, an accept)
		// has mostly come by the time connect returns: ask before waiting.
		switch done, err := connectDone(fd); {
		case err != nil:
			closeRaw(fd)
			return fail(err)
		case done:
			return connOf(ctx, network, fd, d, nil)
		}
		return waitConnect(ctx, network, fd, d)
	default:
		closeRaw(fd)
		return fail(os.NewSyscallError("connect", e))
	}
}

// connectDone tells whether fd's connect in progress has finished: true
// when connected, an error (as net's: "connect: ...") when it failed,
// false and nil while in progress. Raw calls, as net's after its wait:
// SO_ERROR, then getpeername(2) for a connection made.
func connectDone(fd uintptr) (bool, error) {
	var v int32
	l := uint32(4)
	_, _, e := syscall.RawSyscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_ERROR, uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return false, os.NewSyscallError("getsockopt", e)
	}
	switch errno := syscall.Errno(v); errno {
	case syscall.EINPROGRESS, syscall.EALREADY, syscall.EINTR:
		return false, nil
	case syscall.EISCONN:
		return true, nil
	case 0:
		var sa unix.RawSockaddrAny
		sl := uint32(unsafe.Sizeof(sa))
		_, _, e := syscall.RawSyscall(unix.SYS_GETPEERNAME, fd, uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&sl)))
		return e == 0, nil
	default:
		return false, os.NewSyscallError("connect", errno)
	}
}

// waitConnect waits in the runtime's poller for fd's connect to finish,
// within ctx, as net.Dialer does.
func waitConnect(ctx context.Context, network string, fd uintptr, d rawDest) (net.Conn, error) {
	f := os.NewFile(fd, d.addr.String()) // non-blocking: in the poller
	fail := func(err error) (net.Conn, error) {
		f.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Addr: d.addr, Err: err}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return fail(err)
	}
	if dl, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		done, err := connectDone(fd)
		cerr = err
		return done || err != nil
	})
	if !stop() || (werr != nil && ctx.Err() != nil) {
		// The context ended the wait, or ended as the connect finished
		// (net's issue 16523: the deadline set may have poisoned it).
		return fail(ctxError(ctx.Err()))
	}
	switch {
	case werr != nil:
		return fail(werr)
	case cerr != nil:
		return fail(cerr)
	}
	f.SetWriteDeadline(time.Time{})
	return connOf(ctx, network, fd, d, f)
}

// connOf makes a net.Conn of the connected fd (f: its *os.File, or nil),
// wrapped; fd is closed in any case (net.FileConn keeps a dup).
func connOf(ctx context.Context, network string, fd uintptr, d rawDest, f *os.File) (net.Conn, error) {
	if f == nil {
		f = os.NewFile(fd, d.addr.String())
	}
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: d.addr, Err: err}
	}
	if err := ctx.Err(); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Addr: d.addr, Err: ctxError(err)}
	}
	return wrap(c, network), nil
}

// closeRaw closes fd by a raw close(2): a socket that never connected, in
// no poller, whose close does not wait.
func closeRaw(fd uintptr) { syscall.RawSyscall(unix.SYS_CLOSE, fd, 0, 0) }

// ctxError is a context's error as net.Dialer says it: a deadline's "i/o
// timeout" (a net.Error whose Timeout is true), a cancellation's
// "operation was canceled" (errors.Is context.Canceled).
func ctxError(err error) error {
	switch err {
	case context.DeadlineExceeded:
		return os.ErrDeadlineExceeded
	case context.Canceled:
		return canceledError{}
	}
	return err
}

// canceledError is net's errCanceled.
type canceledError struct{}

func (canceledError) Error() string        { return "operation was canceled" }
func (canceledError) Is(target error) bool { return target == context.Canceled }
