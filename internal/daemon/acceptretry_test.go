package daemon

import (
	"errors"
	"log/slog"
	"net"
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

// failingListener fails its first n accepts with errno, then hands out
// one end of a pipe per accept; a closed one fails with net.ErrClosed.
type failingListener struct {
	n       int
	errno   syscall.Errno
	accepts int
	closed  chan struct{}
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.accepts++
	if l.accepts <= l.n {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", l.errno)}
	}
	<-l.closed
	return nil, &net.OpError{Op: "accept", Net: "unix", Err: net.ErrClosed}
}
func (l *failingListener) Close() error   { close(l.closed); return nil }
func (l *failingListener) Addr() net.Addr { return &net.UnixAddr{Name: "status.sock", Net: "unix"} }

// An accept of the status or control socket that fails with an error
// net/http does not call temporary (ENOBUFS, ENOMEM: out of socket memory)
// or one it does (EMFILE) is tried again with backoff, counted each time
// and logged once per kind, not returned: net/http's Serve returned at
// ENOBUFS, ending the status socket until a restart, and logged every
// EMFILE try. A minute of ENOBUFS takes at most 8 + 2*60 tries.
func TestRetryListenerBacksOffOnEveryErrorAndSaysEachKindOnce(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.ENOBUFS, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE} {
		t.Run(errno.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs testenv.SyncBuffer
				c := prometheus.NewCounter(prometheus.CounterOpts{Name: "accept_failures_total"})
				inner := &failingListener{n: 1 << 30, errno: errno, closed: make(chan struct{})}
				ln := newRetryListener(inner, listenerStatus, slog.New(slog.NewTextHandler(&logs, nil)), c)
				done := make(chan error, 1)
				go func() { _, err := ln.Accept(); done <- err }()
				time.Sleep(time.Minute)
				synctest.Wait()
				if inner.accepts < 60 || inner.accepts > 8+2*60+1 {
					t.Errorf("%d accepts in a minute of %v; want one per 0.5-1 s after the first 8", inner.accepts, errno)
				}
				if got := testutil.ToFloat64(c); int(got) != inner.accepts {
					t.Errorf("counted %v failures of %d", got, inner.accepts)
				}
				if n := strings.Count(logs.String(), "status socket: accepting a connection failed"); n != 1 {
					t.Errorf("logged %d times, want once:\n%s", n, logs.String())
				}
				select {
				case err := <-done:
					t.Fatalf("Accept returned while failing: %v", err)
				default:
				}
				ln.Close()
				synctest.Wait()
				if err := <-done; err == nil {
					t.Error("Accept after Close: no error")
				} else if !errors.Is(err, errno) && !errors.Is(err, net.ErrClosed) {
					t.Errorf("Accept after Close: %v", err)
				}
			})
		})
	}
}
