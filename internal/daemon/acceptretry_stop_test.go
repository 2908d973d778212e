package daemon

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/testenv"
)

// scriptedListener answers its accepts from script: an errno fails the
// accept, 0 hands out one end of a pipe; past the script it waits for
// Close, then fails with net.ErrClosed.
type scriptedListener struct {
	script  []syscall.Errno
	accepts int
	closed  chan struct{}
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	l.accepts++
	if l.accepts <= len(l.script) {
		if e := l.script[l.accepts-1]; e != 0 {
			return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", e)}
		}
		c, p := net.Pipe()
		p.Close()
		return c, nil
	}
	<-l.closed
	return nil, &net.OpError{Op: "accept", Net: "unix", Err: net.ErrClosed}
}
func (l *scriptedListener) Close() error   { close(l.closed); return nil }
func (l *scriptedListener) Addr() net.Addr { return &net.UnixAddr{Name: "status.sock", Net: "unix"} }

// Close during a wait between failed accepts ends it at once, no time
// passing: the daemon's stop (Run waits for the status socket, and for
// serveControl) is not held up to a second by a socket out of
// descriptors. The test of the backoff (TestRetryListenerBacksOff...)
// waited for Accept after Close with the clock free to run, so it held
// with Close not ending the wait.
func TestRetryListenerCloseEndsAWaitAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &failingListener{n: 1 << 30, errno: syscall.EMFILE, closed: make(chan struct{})}
		ln := newRetryListener(inner, listenerStatus, slog.New(slog.DiscardHandler), nil)
		done := make(chan error, 1)
		go func() { _, err := ln.Accept(); done <- err }()
		time.Sleep(time.Minute + 500*time.Millisecond) // mid-way through a 1 s wait
		synctest.Wait()
		start := time.Now()
		ln.Close()
		synctest.Wait()
		select {
		case err := <-done:
			if err == nil {
				t.Error("Accept after Close: no error")
			}
		default:
			<-done
			t.Errorf("Accept returned %v after Close, not at once", time.Since(start))
		}
	})
}

// A closed listener's accept (net.ErrClosed) ends Accept at once: not
// counted, not logged, no wait.
func TestRetryListenerClosedIsNoFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "accept_failures_total"})
		inner := &scriptedListener{closed: make(chan struct{})}
		ln := newRetryListener(inner, listenerControl, slog.New(slog.NewTextHandler(&logs, nil)), c)
		close(inner.closed) // closed under the wrapper, as a Close racing the accept
		done := make(chan error, 1)
		go func() { _, err := ln.Accept(); done <- err }()
		synctest.Wait()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("Accept of a closed listener: %v, want net.ErrClosed", err)
			}
		default:
			t.Error("Accept of a closed listener did not return at once")
			ln.closeOnce.Do(func() { close(ln.done) })
			<-done
		}
		if got := testutil.ToFloat64(c); got != 0 {
			t.Errorf("a closed listener counted %v failures", got)
		}
		if logs.String() != "" {
			t.Errorf("a closed listener logged:\n%s", logs.String())
		}
	})
}

// Kinds that alternate in a run of failures are each said once in it (not
// at each change); a run after an accept that worked says its kinds again,
// and the accept that ends a run is said once.
func TestRetryListenerAlternatingKindsEachSaidOncePerRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "accept_failures_total"})
		E, B := syscall.EMFILE, syscall.ENOBUFS
		inner := &scriptedListener{script: []syscall.Errno{E, B, E, B, E, B, 0, B, E, B, 0}, closed: make(chan struct{})}
		ln := newRetryListener(inner, listenerControl, slog.New(slog.NewTextHandler(&logs, nil)), c)
		for range 2 {
			conn, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			conn.Close()
		}
		out := logs.String()
		if n := strings.Count(out, "control socket: accepting a connection failed"); n != 4 {
			t.Errorf("%d lines for two runs of two kinds alternating, want 4:\n%s", n, out)
		}
		for _, k := range []string{"too many open files", "no buffer space available"} {
			if n := strings.Count(out, k); n != 2 {
				t.Errorf("%q said %d times in two runs, want 2:\n%s", k, n, out)
			}
		}
		if n := strings.Count(out, "control socket accepting again"); n != 2 {
			t.Errorf("%d lines say the accepts work again after two runs, want 2:\n%s", n, out)
		}
		if got := testutil.ToFloat64(c); got != 9 {
			t.Errorf("counted %v failures, want 9", got)
		}
		ln.Close()
	})
}

// The daemon's own stops during a wait: serveControl returns as its
// context ends (context.AfterFunc closes the retryListener), and the
// status socket's http.Server returns as Shutdown closes it, both with no
// time passing.
func TestSocketsStopDuringABackoffAtOnce(t *testing.T) {
	t.Run("control", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			d := &Daemon{log: slog.New(slog.DiscardHandler)}
			inner := &failingListener{n: 1 << 30, errno: syscall.ENFILE, closed: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); d.serveControl(ctx, inner) }()
			time.Sleep(time.Minute + 500*time.Millisecond)
			synctest.Wait()
			start := time.Now()
			cancel()
			synctest.Wait()
			select {
			case <-done:
			default:
				<-done
				t.Errorf("serveControl returned %v after its context ended, not at once", time.Since(start))
			}
		})
	})
	t.Run("status", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			inner := &failingListener{n: 1 << 30, errno: syscall.ENOBUFS, closed: make(chan struct{})}
			ln := newRetryListener(inner, listenerStatus, slog.New(slog.DiscardHandler), nil)
			srv := newServer(http.NotFoundHandler())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			time.Sleep(time.Minute + 500*time.Millisecond)
			synctest.Wait()
			start := time.Now()
			sdone := make(chan error, 1)
			go func() { sdone <- srv.Shutdown(context.Background()) }()
			synctest.Wait()
			select {
			case err := <-done:
				if !errors.Is(err, http.ErrServerClosed) {
					t.Errorf("Serve after Shutdown: %v", err)
				}
			default:
				<-done
				t.Errorf("Serve returned %v after Shutdown, not at once", time.Since(start))
			}
			<-sdone
		})
	})
}

// autopilot_health_accept_failures_total has the listeners README names,
// metrics, status and control, each from 0, and each listener's failures
// are counted under its own: the control socket's (serveControl) under
// control, the metrics listener's (gateListener) under metrics.
func TestAcceptFailuresSeriesAreREADMEs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		log := slog.New(slog.DiscardHandler)
		d := &Daemon{log: log, gate: newMetricsGate(log, reg)}
		series := func() map[string]float64 {
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, mf := range mfs {
				if mf.GetName() != "autopilot_health_accept_failures_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					for _, lp := range m.GetLabel() {
						got[lp.GetName()+"="+lp.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
			return got
		}
		want := map[string]float64{"listener=metrics": 0, "listener=status": 0, "listener=control": 0}
		if got := series(); !maps.Equal(got, want) {
			t.Errorf("at start: %v, want %v", got, want)
		}
		ctl := &scriptedListener{script: []syscall.Errno{syscall.EMFILE, syscall.EMFILE, syscall.ENOBUFS}, closed: make(chan struct{})}
		ctx, cancel := context.WithCancel(context.Background())
		cdone := make(chan struct{})
		go func() { defer close(cdone); d.serveControl(ctx, ctl) }()
		met := d.gate.listener(&scriptedListener{script: []syscall.Errno{syscall.ENFILE, syscall.ENOMEM}, closed: make(chan struct{})})
		mdone := make(chan struct{})
		go func() { defer close(mdone); met.Accept() }()
		time.Sleep(time.Second)
		synctest.Wait()
		want = map[string]float64{"listener=metrics": 2, "listener=status": 0, "listener=control": 3}
		if got := series(); !maps.Equal(got, want) {
			t.Errorf("after 3 failed accepts of the control socket and 2 of the metrics listener: %v, want %v", got, want)
		}
		cancel()
		met.Close()
		<-cdone
		<-mdone
	})
}
