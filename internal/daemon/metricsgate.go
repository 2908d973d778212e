package daemon

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/backoff"
	"github.com/syself/autopilot-health/report"
)

// metricsMaxConns bounds the connections of the metrics listener open at
// once. The listener is on every interface of every node: a client that
// opens connections in a loop and sends each request slowly (within the
// 10 s the server allows) held a goroutine and ~10 KiB of heap of the
// daemon per connection, without bound. Prometheus keeps one connection
// per scraper; 256 is far more than the scrapers of a cluster, and ~3 MiB
// at most (README, "Metrics (port 20257)").
const metricsMaxConns = 256

// metricsStallAfter is how long the writes of an answer may wait for its
// client to read it, in all, before its connection counts as not being
// answered. A
// scrape's page is tens of KB, in the socket's buffers at once; a client
// that asks and does not read (many requests pipelined, a small receive
// buffer) held its connection being answered for the 30 s a write may
// take. A variable for tests.
var metricsStallAfter = time.Second

// metricsGate bounds what the clients of the metrics listener can hold:
// the open connections (metricsMaxConns). A new connection over the bound
// closes the oldest open one whose request is not being answered (one
// still sending its request, or idle between requests): a flood of slow
// or idle connections costs only its own, while a request sent at once
// (a scrape, a probe of /healthz) is answered. An answer whose writes have
// waited metricsStallAfter in all for its client to read it is not being
// answered. Only when every open connection is being answered is the new
// one refused, with a 503.
type metricsGate struct {
	log     *slog.Logger
	refused *prometheus.CounterVec
	// acceptFailures: autopilot_health_accept_failures_total{listener}.
	acceptFailures *prometheus.CounterVec

	mu    sync.Mutex
	conns list.List // of *gateConn, oldest first
	// over: the bound was reached and connections closed for it, since
	// the last time the open connections fell to half of it; closed: how
	// many since.
	over   bool
	closed int
	// accepts: the listener's run of failed accepts; wake (set before
	// Serve) is called, outside mu, when the run is said and when it ends.
	accepts acceptRun
	wake    func()
}

// acceptRun is a run of accepts of the metrics listener that failed in a
// row (under metricsGate.mu).
type acceptRun struct {
	err    string    // the last failure's error
	since  time.Time // the first failure's time
	failed int       // how many
	// said: the run has lasted acceptFailingAfter; status and systemd's
	// status line say it until an accept works.
	said bool
}

// acceptFailingAfter is how long a run of failed accepts lasts before
// status and systemd's status line say it: a connection's pending network
// error (EPROTO, ...) fails one accept and the next works, while a daemon
// out of descriptors (EMFILE) or memory fails every try, about once a
// second, and no scrape is answered. A variable for tests.
var acceptFailingAfter = 10 * time.Second

// acceptFailed records a failed accept; it reports whether the run is to
// be said anew (it has just lasted acceptFailingAfter, or its error
// changed while said).
func (g *metricsGate) acceptFailed(err string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := &g.accepts
	if r.failed == 0 {
		r.since = now
	}
	r.failed++
	changed := r.said && err != r.err
	r.err = err
	if !r.said && now.Sub(r.since) >= acceptFailingAfter {
		r.said = true
		return true
	}
	return changed
}

// acceptsEnded ends the run of failed accepts (one worked, or the listener
// closed); it reports whether the run was said.
func (g *metricsGate) acceptsEnded() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	said := g.accepts.said
	g.accepts = acceptRun{}
	return said
}

// acceptFailure is the run of failed accepts while it is said.
func (g *metricsGate) acceptFailure() (acceptRun, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.accepts, g.accepts.said
}

func (g *metricsGate) wakeStatus() {
	if g.wake != nil {
		g.wake()
	}
}

// The reasons of autopilot_health_http_refused_total.
const refusedConnections = "connections"

func newMetricsGate(log *slog.Logger, reg prometheus.Registerer) *metricsGate {
	g := &metricsGate{log: log, refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "http_refused_total",
		Help: "Connections of the metrics listener closed or refused unanswered for a bound, by reason: connections (more than 256 open: the oldest without a request being answered closed, or the new one refused with a 503).",
	}, []string{"reason"})}
	g.refused.WithLabelValues(refusedConnections)
	g.acceptFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "accept_failures_total",
		Help: "Accepts of a listener that failed (EMFILE, ENFILE, ENOBUFS, ENOMEM, a connection's pending error) and were tried again with backoff, by listener: metrics, status, control.",
	}, []string{"listener"})
	for _, l := range []string{listenerMetrics, listenerStatus, listenerControl} {
		g.acceptFailures.WithLabelValues(l)
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: report.Namespace, Name: "http_connections_open",
		Help: "Connections of the metrics listener open now (at most 256).",
	}, func() float64 {
		g.mu.Lock()
		defer g.mu.Unlock()
		return float64(g.conns.Len())
	})
	if reg != nil {
		reg.MustRegister(g.refused, g.acceptFailures, open)
	}
	return g
}

// gateConn is a connection the gate counts.
type gateConn struct {
	net.Conn
	g    *metricsGate
	elem *list.Element // nil once out of the gate's list (under g.mu)
	// busy: a request of it is being answered, from the handler's start
	// until the server has written the whole answer (StateIdle); under g.mu.
	busy bool
	// writing: since when (UnixNano) a Write of c waits for the client
	// to read; 0 while none. waited: how long (ns) the finished writes of
	// the answer in progress have waited, from the handler's start.
	writing atomic.Int64
	waited  atomic.Int64
	once    sync.Once
}

func (c *gateConn) Write(p []byte) (int, error) {
	start := time.Now()
	c.writing.Store(start.UnixNano())
	n, err := c.Conn.Write(p)
	// writing 0 first: stalledAt may miss this write a moment, never
	// count it twice.
	c.writing.Store(0)
	c.waited.Add(int64(time.Since(start)))
	return n, err
}

// stalledAt: at now, the writes of the answer in progress of c have waited
// metricsStallAfter or more for the client to read, in all: one client that
// does not read, or one that reads a few KiB now and then, holding its
// connection being answered for the 30 s a write may take.
func (c *gateConn) stalledAt(now time.Time) bool {
	d := time.Duration(c.waited.Load())
	if w := c.writing.Load(); w != 0 {
		d += now.Sub(time.Unix(0, w))
	}
	return d >= metricsStallAfter
}

func (c *gateConn) Close() error {
	c.once.Do(c.g.release(c))
	return c.Conn.Close()
}

// CloseWrite ends what c sends (a TCP connection's FIN), as net/http does
// before it closes a connection whose request it has not read (431, a body
// too large): the client reads the answer whole, then its end, before the
// close resets the connection. Not promoted from the embedded net.Conn:
// without it net/http skipped the FIN, and the client read a reset where
// the answer ended.
func (c *gateConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// release takes c out of the gate's count.
func (g *metricsGate) release(c *gateConn) func() {
	return func() {
		g.mu.Lock()
		if c.elem != nil {
			g.conns.Remove(c.elem)
			c.elem = nil
		}
		var done bool
		var closed int
		if g.over && g.conns.Len() <= metricsMaxConns/2 {
			done, closed, g.over, g.closed = true, g.closed, false, 0
		}
		g.mu.Unlock()
		if done {
			g.log.Info("metrics listener back under its bound of open connections", "open_max", metricsMaxConns, "closed", closed)
		}
	}
}

// gateListener is a listener whose connections the gate bounds.
type gateListener struct {
	net.Listener
	g *metricsGate
	// done is closed by Close: a wait between failed accepts ends.
	done      chan struct{}
	closeOnce sync.Once
	// The failed accepts in a row (only Serve's goroutine calls Accept):
	// the last error, how many, and the backoff between them.
	failErr string
	failed  int
	bo      backoff.Backoff
}

// The waits between accepts that failed in a row: net/http's for the
// errors it calls temporary (5 ms, doubling to 1 s).
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// listener bounds the connections of ln.
func (g *metricsGate) listener(ln net.Listener) net.Listener {
	return &gateListener{Listener: ln, g: g, done: make(chan struct{}), bo: backoff.Backoff{Min: acceptRetryMin, Max: acceptRetryMax}}
}

func (l *gateListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// accept is the next connection of the listener. An accept that fails
// but for a closed listener is tried again after a wait: net/http's Serve
// returns at the first error it does not call temporary, and Run with it,
// stopping the daemon; but Linux passes a connection's pending network
// error to accept (EPROTO, ENETUNREACH, EHOSTUNREACH...) and fails it with
// ENOMEM or ENOBUFS under memory pressure (accept(2)), and the listener
// serves on after either. Logged once per run of failures (and per change
// of the error), and once when an accept succeeds again.
//
// A run of failures that lasts acceptFailingAfter is said in status and
// in systemd's status line (metricsNote) until an accept works again, or
// the listener closes.
func (l *gateListener) accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err == nil {
			if l.failed > 0 {
				l.g.log.Info("metrics listener accepting again", "failed_accepts", l.failed)
				l.failed, l.failErr = 0, ""
				l.bo.Reset()
				if l.g.acceptsEnded() {
					l.g.wakeStatus()
				}
			}
			return nc, nil
		}
		if errors.Is(err, net.ErrClosed) {
			l.end()
			return nil, err
		}
		select {
		case <-l.done:
			l.end()
			return nil, err
		default:
		}
		l.failed++
		l.g.acceptFailures.WithLabelValues(listenerMetrics).Inc()
		wait := l.bo.Next()
		if err.Error() != l.failErr {
			l.failErr = err.Error()
			l.g.log.Warn("metrics listener: accepting a connection failed; retrying with backoff", "err", err, "retry_in", wait.Round(time.Millisecond))
		}
		if l.g.acceptFailed(err.Error(), time.Now()) {
			l.g.wakeStatus()
		}
		t := time.NewTimer(wait)
		select {
		case <-l.done:
			t.Stop()
			l.end()
			return nil, err
		case <-t.C:
		}
	}
}

// end ends the listener's run of failed accepts, if any, as it closes.
func (l *gateListener) end() {
	if l.failed > 0 && l.g.acceptsEnded() {
		l.g.wakeStatus()
	}
}

// refusal is the answer to a connection refused: all open ones are being
// answered.
var refusal = fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
	len(refusalText), refusalText)

const refusalText = "autopilot-health: too many connections open, try again later\n"

func (l *gateListener) Accept() (net.Conn, error) {
	g := l.g
	for {
		nc, err := l.accept()
		if err != nil {
			return nil, err
		}
		c := &gateConn{Conn: nc, g: g}
		var victim *gateConn
		g.mu.Lock()
		full := g.conns.Len() >= metricsMaxConns
		if full {
			for e := g.conns.Front(); e != nil; e = e.Next() {
				if o := e.Value.(*gateConn); !o.busy {
					victim = o
					break
				}
			}
			if victim == nil {
				// All are being answered: the oldest whose answer's
				// writes have waited metricsStallAfter for its client
				// is not.
				now := time.Now()
				for e := g.conns.Front(); e != nil; e = e.Next() {
					if o := e.Value.(*gateConn); o.stalledAt(now) {
						victim = o
						break
					}
				}
			}
			if victim != nil {
				g.conns.Remove(victim.elem)
				victim.elem = nil
			}
		}
		if !full || victim != nil {
			c.elem = g.conns.PushBack(c)
		}
		first := full && !g.over
		if full {
			g.over = true
			g.closed++
		}
		g.mu.Unlock()
		if full {
			g.refused.WithLabelValues(refusedConnections).Inc()
			if first {
				g.log.Warn("metrics listener at its bound of open connections: closing the oldest one not being answered for each new one; logged again when under half of it",
					"open_max", metricsMaxConns, "from", nc.RemoteAddr().String())
			}
		}
		if victim != nil {
			victim.Close()
			return c, nil
		}
		if full {
			// Every open connection is being answered: the new one is
			// refused. A new socket's send buffer is empty: the write
			// does not block.
			nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			nc.Write([]byte(refusal))
			nc.Close()
			continue
		}
		return c, nil
	}
}

// gateKey is the context key of a request's connection.
type gateKey struct{}

// server is the metrics listener's server: newServer's, whose handler
// marks its connection busy while a request of it is being answered.
func (g *metricsGate) server(h http.Handler) *http.Server {
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, _ := r.Context().Value(gateKey{}).(*gateConn); c != nil {
			g.mu.Lock()
			c.busy = true
			c.waited.Store(0)
			g.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, gateKey{}, c)
	}
	srv.ConnState = func(nc net.Conn, st http.ConnState) {
		// StateIdle: the answer is written whole; the connection waits for
		// the next request.
		if c, _ := nc.(*gateConn); c != nil && st == http.StateIdle {
			g.mu.Lock()
			c.busy = false
			g.mu.Unlock()
		}
	}
	return srv
}
