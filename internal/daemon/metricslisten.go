package daemon

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/syself/autopilot-health/internal/backoff"
)

// The waits between tries to bind metrics.listen_address (backoff: the
// first ~1 s, doubling to a minute). Variables for tests.
var (
	metricsRetryMin = time.Second
	metricsRetryMax = time.Minute
)

// metricsBind is the metrics listener's state (under Daemon.mu).
type metricsBind struct {
	// ln is the listener once bound (Options.Listener, or
	// metrics.listen_address); nil while the address cannot be bound.
	ln net.Listener
	// err is the last bind failure while not bound ("" once bound);
	// since: the first failure of this run of failures; attempts: the
	// failed binds so far.
	err      string
	since    time.Time
	attempts int
	// bo spaces the tries; wait is the wait before the next one.
	bo   backoff.Backoff
	wait time.Duration
}

// MetricsStatus is the metrics listener's state, for status.
type MetricsStatus struct {
	// Address: metrics.listen_address (the listener's address once bound).
	Address string `json:"address"`
	// Serving: /metrics and /healthz are served.
	Serving bool `json:"serving"`
	// Error: why the address cannot be bound (while not serving);
	// FailingSince: since when; Attempts: the failed binds so far.
	Error        string    `json:"error,omitempty"`
	FailingSince time.Time `json:"failingSince,omitzero"`
	Attempts     int       `json:"attempts,omitempty"`
	// AcceptError: while bound, why accepting a connection has failed
	// in a row for acceptFailingAfter (10 s) or more (EMFILE, ENOMEM, ...;
	// cleared when one is accepted); AcceptFailingSince: since when;
	// FailedAccepts: how many in a row.
	AcceptError        string    `json:"acceptError,omitempty"`
	AcceptFailingSince time.Time `json:"acceptFailingSince,omitzero"`
	FailedAccepts      int       `json:"failedAccepts,omitempty"`
}

// bindMetrics tries once to bind metrics.listen_address. A failure (the
// port held by another program, EADDRINUSE; an address not configured on
// the node yet, EADDRNOTAVAIL) is no reason to stop: the checks, the
// repairs, the kernel log and the reporting to Kubernetes do not need the
// port. It is recorded (status, systemd's status line), logged at warning
// once per change of the error, and tried again after the returned wait.
func (d *Daemon) bindMetrics() (net.Listener, time.Duration) {
	addr := d.cfg.Metrics.ListenAddress
	ln, err := net.Listen("tcp", addr)
	now := time.Now()
	d.mu.Lock()
	m := &d.metricsBind
	prev, attempts := m.err, m.attempts
	if err == nil {
		m.ln, m.err, m.since, m.wait = ln, "", time.Time{}, 0
		m.bo.Reset()
		d.mu.Unlock()
		if prev != "" {
			d.log.Info("metrics listener bound; serving metrics", "addr", ln.Addr().String(), "failed_attempts", attempts)
			d.wakeStatus()
		}
		return ln, 0
	}
	if m.bo.Min == 0 {
		m.bo = backoff.Backoff{Min: metricsRetryMin, Max: metricsRetryMax}
	}
	if prev == "" {
		m.since = now
	}
	m.err = err.Error()
	m.attempts++
	m.wait = m.bo.Next()
	wait := m.wait
	d.mu.Unlock()
	if err.Error() != prev {
		d.log.Warn("metrics not served: cannot bind metrics.listen_address; the daemon works on without /metrics and /healthz, retrying with backoff",
			"addr", addr, "err", err, "retry_in", wait.Round(time.Millisecond))
		d.wakeStatus()
	}
	return nil, wait
}

// retryMetrics binds metrics.listen_address, trying again with backoff,
// until it is bound (then serve serves it) or ctx is done.
func (d *Daemon) retryMetrics(ctx context.Context, serve func(net.Listener)) {
	d.mu.Lock()
	wait := d.metricsBind.wait
	d.mu.Unlock()
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var ln net.Listener
		if ln, wait = d.bindMetrics(); ln != nil {
			serve(ln)
			return
		}
	}
}

// metricsListener is the metrics listener; nil while not bound.
func (d *Daemon) metricsListener() net.Listener {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.metricsBind.ln
}

// metricsStatus is the metrics listener's state now.
func (d *Daemon) metricsStatus() MetricsStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := d.metricsBind
	st := MetricsStatus{Address: d.cfg.Metrics.ListenAddress, Serving: m.ln != nil, Error: m.err, FailingSince: m.since, Attempts: m.attempts}
	if m.ln != nil {
		st.Address = m.ln.Addr().String()
	}
	if r, ok := d.gate.acceptFailure(); ok && m.ln != nil {
		st.AcceptError, st.AcceptFailingSince, st.FailedAccepts = r.err, r.since, r.failed
	}
	return st
}

// metricsNote is what systemd's status line says in front of the summary
// while the metrics are not served: the address cannot be bound, or
// accepting a connection has failed in a row for acceptFailingAfter ("" while
// they are served).
func (d *Daemon) metricsNote() string {
	d.mu.Lock()
	err := d.metricsBind.err
	d.mu.Unlock()
	if err != "" {
		return "metrics not served: " + err + " (retrying); "
	}
	if r, ok := d.gate.acceptFailure(); ok {
		return "metrics connections not accepted: " + r.err + " (retrying); "
	}
	return ""
}

// serveMetrics serves /metrics and /healthz on ln with srv; Serve's error
// goes to errc.
func serveMetrics(srv *http.Server, ln net.Listener, errc chan<- error) {
	go func() { errc <- srv.Serve(ln) }()
}

// wakeStatus asks statusLoop to send the status line again.
func (d *Daemon) wakeStatus() {
	select {
	case d.statusWake <- struct{}{}:
	default:
	}
}
