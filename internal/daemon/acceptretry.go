package daemon

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/backoff"
)

// The listeners of autopilot_health_accept_failures_total.
const (
	listenerMetrics = "metrics"
	listenerStatus  = "status"
	listenerControl = "control"
)

// retryListener is a socket's listener whose failed accepts are tried
// again with backoff, not returned: out of descriptors (EMFILE, ENFILE) or
// socket memory (ENOBUFS, ENOMEM) every accept fails at once, the
// connection staying in the backlog, for as long as that lasts. net/http's
// Serve retries the errors it calls temporary (EMFILE, ENFILE) after 5 ms
// doubling to 1 s but logs each try (a line a second for as long as it
// lasts, to stderr, past the daemon's logger) and returns at the first
// error it does not (ENOBUFS, ENOMEM, a connection's pending error):
// the socket would then be gone until a restart. So every failure but a
// closed listener's is counted (autopilot_health_accept_failures_total),
// waited on (net/http's 5 ms doubling to 1 s) and tried again; it is
// logged once per kind (errno) of a run of failures, and once when an
// accept works again. Close ends a wait at once.
type retryListener struct {
	net.Listener
	name     string
	log      *slog.Logger
	failures prometheus.Counter

	done      chan struct{}
	closeOnce sync.Once

	// The run of failed accepts (only the serving goroutine calls
	// Accept).
	run backoff.Failures
}

func newRetryListener(ln net.Listener, name string, log *slog.Logger, failures prometheus.Counter) *retryListener {
	return &retryListener{Listener: ln, name: name, log: log, failures: failures, done: make(chan struct{}),
		run: backoff.Failures{Backoff: backoff.Backoff{Min: acceptRetryMin, Max: acceptRetryMax}}}
}

func (l *retryListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (l *retryListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if n := l.run.Worked(); n > 0 {
				l.log.Info(l.name+" socket accepting again", "failed_accepts", n)
			}
			return c, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		select {
		case <-l.done:
			return nil, err
		default:
		}
		if l.failures != nil {
			l.failures.Inc()
		}
		wait, first := l.run.Failed(err)
		if first {
			l.log.Warn(l.name+" socket: accepting a connection failed; retrying with backoff", "err", err, "retry_in", wait.Round(time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-l.done:
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// acceptFailures is listener's series of
// autopilot_health_accept_failures_total (nil: a Daemon not made by New).
func (d *Daemon) acceptFailures(listener string) prometheus.Counter {
	if d.gate == nil || d.gate.acceptFailures == nil {
		return nil
	}
	return d.gate.acceptFailures.WithLabelValues(listener)
}
