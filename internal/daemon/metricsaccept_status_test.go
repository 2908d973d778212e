package daemon

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// switchedAccepts is a listener whose Accepts fail with EMFILE while
// failing is set, as accept4 fails while the daemon has as many
// descriptors open as its limit, and accept a connection of conns
// otherwise (until Close).
type switchedAccepts struct {
	failing atomic.Bool
	tries   atomic.Int64
	conns   chan net.Conn
	done    chan struct{}
}

func newSwitchedAccepts() *switchedAccepts {
	return &switchedAccepts{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *switchedAccepts) Accept() (net.Conn, error) {
	l.tries.Add(1)
	if l.failing.Load() {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: net.ErrClosed}
	}
}
func (l *switchedAccepts) Close() error { close(l.done); return nil }
func (l *switchedAccepts) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 20257}
}

const emfile = "accept tcp 127.0.0.1:20257: accept4: too many open files"

// A run of failed accepts that lasts (acceptFailingAfter, 10 s) is said,
// with its error, its start and its count, and the status line woken for
// it, once; a shorter one is not; the first accept that works again clears
// it, and wakes the status line again.
func TestLastingFailedAcceptsAreSaidUntilOneWorks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newMetricsGate(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		var wakes atomic.Int32
		g.wake = func() { wakes.Add(1) }
		inner := newSwitchedAccepts()
		inner.failing.Store(true)
		ln := g.listener(inner)
		defer ln.Close()
		accepted := make(chan net.Conn)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
		start := time.Now()
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if st, ok := g.acceptFailure(); ok || wakes.Load() != 0 {
			t.Errorf("after 9 s of failed accepts: said %+v, %d wakes; want nothing yet", st, wakes.Load())
		}
		time.Sleep(3 * time.Second) // a try within 1 s after the 10 s
		synctest.Wait()
		st, ok := g.acceptFailure()
		if !ok || st.err != emfile || !st.since.Equal(start) || int64(st.failed) != inner.tries.Load() {
			t.Errorf("after 12 s of failed accepts: %+v, %v (%d tries)", st, ok, inner.tries.Load())
		}
		if n := wakes.Load(); n != 1 {
			t.Errorf("the status line woken %d times, want once", n)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := wakes.Load(); n != 1 {
			t.Errorf("the status line woken %d times over a minute more of the same failure, want once", n)
		}
		// Accepts work again: the next connection clears it.
		inner.failing.Store(false)
		c1, c2 := net.Pipe()
		defer c2.Close()
		inner.conns <- c1
		c := <-accepted
		defer c.Close()
		if st, ok := g.acceptFailure(); ok {
			t.Errorf("an accept worked, still said: %+v", st)
		}
		if n := wakes.Load(); n != 2 {
			t.Errorf("the status line woken %d times, want 2 (the run, its end)", n)
		}
	})
}

// While the metrics listener's accepts keep failing, systemd's status
// line and the status report say so (before: "Metrics: serving", no
// note), and both clear once an accept works.
func TestFailedAcceptsInStatusLineAndReport(t *testing.T) {
	defer func(d time.Duration) { acceptFailingAfter = d }(acceptFailingAfter)
	acceptFailingAfter = 0 // the 10 s: TestLastingFailedAcceptsAreSaidUntilOneWorks
	sock := notifySocket(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &failingAccepts{Listener: tcp, err: os.NewSyscallError("accept4", syscall.EMFILE)}
	ln.n.Store(1 << 30)
	cfg := testConfig(t)
	cfg.Status.Socket = filepath.Join(t.TempDir(), "status.sock")
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	failure := "accept tcp " + tcp.Addr().String() + ": accept4: too many open files"
	next(t, sock, "a status line naming the failed accepts", func(m string) bool {
		return strings.Contains(m, "STATUS=metrics connections not accepted: "+failure+" (retrying); ")
	})
	var st StatusReport
	await(t, d, "the status report's answer", func() bool {
		st, err = getStatus(t, cfg.Status.Socket)
		return err == nil
	})
	if m := st.Metrics; !m.Serving || m.AcceptError != failure || m.AcceptFailingSince.IsZero() || m.FailedAccepts < 1 {
		t.Errorf("status while accepts fail: %+v", m)
	}
	ln.n.Store(0)
	client := http.Client{Timeout: time.Second}
	await(t, d, "an accept that works", func() bool {
		resp, err := client.Get("http://" + tcp.Addr().String() + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	// The line may come in the datagram of READY=1 (READY=1\nSTATUS=...): where
	// the first pass ends after the accept worked, READY carries the line
	// without the note and no STATUS= alone follows (a CI run at f581bcd).
	next(t, sock, "a status line without the failed accepts", func(m string) bool {
		return strings.Contains(m, "STATUS=") && !strings.Contains(m, "not accepted")
	})
	if st, err := getStatus(t, cfg.Status.Socket); err != nil || st.Metrics.AcceptError != "" || st.Metrics.FailedAccepts != 0 || !st.Metrics.AcceptFailingSince.IsZero() {
		t.Errorf("status once an accept worked: %+v, %v", st.Metrics, err)
	}
}
