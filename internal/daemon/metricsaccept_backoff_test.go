package daemon

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// emfileListener's every Accept fails with EMFILE, as accept4 fails when
// the daemon has as many descriptors open as its limit (the connection
// stays in the backlog), until Close.
type emfileListener struct {
	accepts atomic.Int64
	closed  atomic.Bool
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.accepts.Add(1) > 1000 {
		// A caller that spins: let the bubble's clock move on, so that
		// the count says so rather than the test hanging.
		time.Sleep(time.Second)
	}
	if l.closed.Load() {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
	}
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}
func (l *emfileListener) Close() error { l.closed.Store(true); return nil }
func (l *emfileListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 20257}
}

// Out of descriptors (EMFILE; ENFILE alike), the metrics listener's accept
// fails at once for as long as it lasts: it is tried again with backoff up
// to a second, not in a loop that spins a core, and said once, not once per
// try; the listener closed (a stop, a reload that rebinds) while it waits
// ends the wait at once.
func TestAcceptOutOfDescriptorsBacksOffAndEndsAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs testenv.SyncBuffer
		g := newMetricsGate(slog.New(slog.NewTextHandler(&logs, nil)), nil)
		inner := &emfileListener{}
		ln := g.listener(inner)
		done := make(chan error, 1)
		go func() {
			_, err := ln.Accept()
			done <- err
		}()
		start := time.Now()
		time.Sleep(time.Minute) // virtual: the bubble's clock
		synctest.Wait()
		// 5 ms doubling to 1 s, each wait drawn in [step/2, step]: at
		// most 8 + 2*60 tries in a minute; a spin makes millions.
		if n := inner.accepts.Load(); n < 60 || n > 8+2*60+1 {
			t.Errorf("%d accepts in a minute of EMFILE; want one per 0.5-1 s after the first 8", n)
		}
		if n := strings.Count(logs.String(), "accepting a connection failed"); n != 1 {
			t.Errorf("the failing accepts logged %d times in a minute, want once:\n%s", n, logs.String())
		}
		// Closed while waiting between tries: Accept returns now.
		tries := inner.accepts.Load()
		closedAt := time.Now()
		ln.Close()
		synctest.Wait()
		select {
		case err := <-done:
			if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, net.ErrClosed) {
				t.Errorf("Accept after Close: %v", err)
			}
		default:
			t.Fatal("Accept has not returned after the listener was closed during its wait")
		}
		if d := time.Since(closedAt); d != 0 {
			t.Errorf("Accept returned %v after Close; want at once", d)
		}
		if inner.accepts.Load() != tries {
			t.Errorf("accepts tried after Close: %d", inner.accepts.Load()-tries)
		}
		t.Logf("%d accepts in %v of EMFILE", tries, closedAt.Sub(start))
	})
}
