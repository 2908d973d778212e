package rawsys

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"golang.org/x/sys/unix"
)

// refusedPort is a loopback TCP port nothing listens on: one a listener
// held, closed again.
func refusedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// The dials of the absent services the idle daemon probes (a refused TCP
// connect, a unix socket's path that does not exist, a socket file no
// one listens on) make no ordinary system call: they do not wake the
// runtime's monitor thread. net.Dialer's make several (connect,
// getsockopt, close, epoll_ctl's fcntl), counted here too so that the
// count is seen to work.
func TestDialRefusedMakesNoOrdinarySystemCall(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // the file stays, no one listens: ECONNREFUSED
	targets := []struct{ network, address string }{
		{"tcp", refusedPort(t)},
		{"unix", filepath.Join(dir, "absent.sock")},
		{"unix", stale},
	}
	for _, tg := range targets {
		var err error
		netCalls := testenv.ThreadOrdinarySyscalls(t, func() {
			_, err = (&net.Dialer{}).DialContext(context.Background(), tg.network, tg.address)
		})
		if err == nil {
			t.Fatalf("net.Dialer's dial of %s %s connected", tg.network, tg.address)
		}
		if netCalls == 0 {
			t.Fatalf("net.Dialer's refused dial of %s %s counted no ordinary system call: the count does not work", tg.network, tg.address)
		}
		// The fewest of three: a stray call of the runtime (a GC's) is not the dial's.
		least := int64(-1)
		for range 3 {
			n := testenv.ThreadOrdinarySyscalls(t, func() { _, err = Dial(context.Background(), tg.network, tg.address) })
			if err == nil {
				t.Fatalf("Dial of %s %s connected", tg.network, tg.address)
			}
			if least < 0 || n < least {
				least = n
			}
		}
		if least != 0 {
			t.Errorf("Dial of %s %s (refused: %v) made %d ordinary system calls, want 0 (net.Dialer: %d)", tg.network, tg.address, err, least, netCalls)
		}
	}
}

// A refused dial's error reads as net.Dialer's, word for word, and is the
// same kind of error (errors.Is of the errno, a *net.OpError): the
// probes' condition messages quote it.
func TestDialErrorsReadAsNetDialers(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	notSocket := filepath.Join(dir, "file")
	os.WriteFile(notSocket, nil, 0o600)
	port := refusedPort(t)
	cases := []struct {
		network, address string
		errno            syscall.Errno
	}{
		{"tcp", port, syscall.ECONNREFUSED},
		{"tcp4", port, syscall.ECONNREFUSED},
		{"unix", filepath.Join(dir, "absent.sock"), syscall.ENOENT},
		{"unix", stale, syscall.ECONNREFUSED},
		{"unix", notSocket, syscall.ECONNREFUSED},
	}
	for _, c := range cases {
		if _, ok := rawTarget(c.network, c.address); !ok {
			t.Fatalf("%s %s is not dialled raw", c.network, c.address)
		}
		_, want := (&net.Dialer{}).DialContext(context.Background(), c.network, c.address)
		_, got := Dial(context.Background(), c.network, c.address)
		if want == nil || got == nil || got.Error() != want.Error() {
			t.Errorf("Dial(%s, %s): %v, want net.Dialer's %v", c.network, c.address, got, want)
		}
		var oe *net.OpError
		if !errors.As(got, &oe) || !errors.Is(got, c.errno) {
			t.Errorf("Dial(%s, %s): %#v, want a *net.OpError of %v", c.network, c.address, got, c.errno)
		}
	}
	// A cancelled or expired context, as net.Dialer's.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, ctx := range []context.Context{cancelled, expired} {
		_, want := (&net.Dialer{}).DialContext(ctx, "tcp", port)
		_, got := Dial(ctx, "tcp", port)
		if want == nil || got == nil || got.Error() != want.Error() || errors.Is(got, context.Canceled) != errors.Is(want, context.Canceled) {
			t.Errorf("Dial with %v: %v, want net.Dialer's %v", ctx.Err(), got, want)
		}
		var ne net.Error
		if errors.As(want, &ne) && ne.Timeout() && !(errors.As(got, &ne) && ne.Timeout()) {
			t.Errorf("Dial with %v: %v is no timeout, net.Dialer's is", ctx.Err(), got)
		}
	}
}

// A raw dial connects (TCP on both families, a unix socket) and its
// connection carries bytes both ways, with raw reads and writes (Conn), the
// remote address the one dialled.
func TestDialConnects(t *testing.T) {
	dir := t.TempDir()
	var lns []net.Listener
	for _, l := range []struct{ network, address string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}, {"unix", filepath.Join(dir, "s.sock")}} {
		ln, err := net.Listen(l.network, l.address)
		if err != nil {
			if l.network == "tcp6" {
				continue // no IPv6 loopback here
			}
			t.Fatal(err)
		}
		defer ln.Close()
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
	}
	for _, ln := range lns {
		network := ln.Addr().Network()
		if _, ok := rawTarget(network, ln.Addr().String()); !ok {
			t.Fatalf("%s %s is not dialled raw", network, ln.Addr())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := Dial(ctx, network, ln.Addr().String())
		cancel() // the connection outlives the dial's context
		if err != nil {
			t.Fatalf("Dial %s %s: %v", network, ln.Addr(), err)
		}
		if _, ok := c.(*Conn); !ok {
			t.Errorf("Dial %s: a %T, want a *Conn", network, c)
		}
		if network != "unix" && c.RemoteAddr().String() != ln.Addr().String() {
			t.Errorf("Dial %s: remote %v, want %v", network, c.RemoteAddr(), ln.Addr())
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("Dial %s: read %q, %v", network, buf, err)
		}
		c.Close()
	}
}

// fullListener is a loopback TCP address whose listener never accepts and
// whose accept queue is full (listen(2)'s backlog 0, filled by dials of
// net.Dialer until one times out): the kernel drops the SYNs of a further
// connect, which stays in progress.
func fullListener(t *testing.T) (string, int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*unix.SockaddrInet4).Port))
	for range 8 {
		c, err := (&net.Dialer{Timeout: 200 * time.Millisecond}).Dial("tcp", addr)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return addr, fd
			}
			t.Fatalf("filling the accept queue of %s: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Fatalf("the accept queue of %s does not fill", addr)
	return "", 0
}

// A connect that does not finish (fullListener) waits in the poller and
// gives up at the context's deadline, as net.Dialer's: "i/o timeout", a
// net.Error whose Timeout is true; a cancellation ends it with "operation
// was canceled", errors.Is context.Canceled. One whose SYN is answered
// at last (the queue drained, the SYN sent again) connects.
func TestDialWaitHoldsTheContext(t *testing.T) {
	addr, lfd := fullListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, "tcp", addr)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || err.Error() != "dial tcp "+addr+": i/o timeout" {
		t.Errorf("Dial past its deadline: %v, want dial tcp %s: i/o timeout", err, addr)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = Dial(ctx, "tcp", addr)
	if !errors.Is(err, context.Canceled) || err.Error() != "dial tcp "+addr+": operation was canceled" {
		t.Errorf("Dial cancelled: %v, want dial tcp %s: operation was canceled", err, addr)
	}
	// The queue drained while a dial waits (its first SYN dropped, 100 ms
	// in: the kernel's, not observable here): the SYN, sent again after
	// the first retransmission timeout (1 s), is answered.
	if err := unix.SetNonblock(lfd, true); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, func() {
		for {
			nfd, _, err := unix.Accept(lfd)
			if err != nil {
				return // EAGAIN: drained
			}
			unix.Close(nfd)
		}
	})
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("Dial of a listener whose queue drained: %v", err)
	}
	if c.RemoteAddr().String() != addr {
		t.Errorf("Dial: remote %v, want %s", c.RemoteAddr(), addr)
	}
	c.Close()
}
