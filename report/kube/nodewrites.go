package kube

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/syself/autopilot-health/report"
)

// NodeStaleAfter is how long the conditions' writes to the Node (and,
// before the first, the Node's read they wait for) fail in a row before
// systemd's status line and status say the Node is not being updated. It
// is the shortest time a watched condition must hold before the
// replacement logic acts on it (ServiceNotRecovering, VerityCorruption:
// 60 s), so the Node's conditions are not said stale before they could
// matter, and it spans five to seven tries of the status writer (its waits
// double from 1 s: 1, 2, 4, 8, 16, 32 s at most, half that at least), so a
// blip that one of them outlasts (an API server restarted, a refused
// connection while a load balancer fails over) is not said. A variable
// for tests.
var NodeStaleAfter = 60 * time.Second

// NodeNotUpdated says that no write of the conditions has landed on the
// Node for NodeStaleAfter or longer while they were tried: the Node shows
// what it was last given, and whatever acts on its conditions acts on that.
type NodeNotUpdated struct {
	// Since: the last write of the conditions that landed; when none has
	// since the reporter started, the first failed call (the Node's read
	// at start, or the first write).
	Since time.Time `json:"since"`
	// FailingSince: the first of the calls failed in a row.
	FailingSince time.Time `json:"failingSince"`
	Failures     int       `json:"failures"`
	// Reason: the last failure in a few words (refused by the API server,
	// unreachable, credentials rejected, ...); Error: in full.
	Reason string `json:"reason"`
	Error  string `json:"error"`
}

// Note is what systemd's status line says in front of the summary, e.g.
// "Node NOT updated since 2026-12-02 12:04:05Z: API server unreachable
// (connection refused)". The time is UTC's, with its date: the line is sent
// again only when it changes, so a time of day alone, written one day,
// reads as the next day's time on a line left there past midnight, and a
// Node not updated for days read as hours.
func (n NodeNotUpdated) Note() string {
	return "Node NOT updated since " + n.Since.UTC().Format("2006-01-02 15:04:05") + "Z: " + n.Reason
}

// nodeWrites is the run of the conditions' writes (and the read before
// them) that failed in a row (under Metrics.mu).
type nodeWrites struct {
	landed time.Time // the last write that landed
	first  time.Time // the run's first failure (zero: no run)
	failed int
	err    string
	reason string
	said   bool        // the run has lasted NodeStaleAfter
	timer  *time.Timer // says it then
}

// SetWake sets what is called (outside the lock) when the Node starts or
// stops being said not updated, or its reason changes while it is: the
// daemon sends its status line again then.
func (m *Metrics) SetWake(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wake = f
}

// nodeWrote records the outcome of a write of the conditions, or of the
// read of the Node before the first (err; nil: it landed), for statusLoop:
// one that failed because the stop cut it short (ctx done) is no failure
// of the API server's, and is not counted.
func (m *Metrics) nodeWrote(ctx context.Context, err error) {
	switch {
	case err == nil:
		m.nodeWritten(time.Now())
	case ctx.Err() == nil:
		m.nodeWriteFailed(err, time.Now())
	}
}

// nodeWritten records a write of the conditions that landed: a run of
// failures ends, and the status line is woken where it said it.
func (m *Metrics) nodeWritten(now time.Time) {
	m.mu.Lock()
	w := &m.node
	said := w.said
	if w.timer != nil {
		w.timer.Stop()
	}
	*w = nodeWrites{landed: now}
	wake := m.wake
	m.mu.Unlock()
	if said && wake != nil {
		wake()
	}
}

// nodeWriteFailed records a failed write of the conditions, or a failed
// read of the Node before the first: the run starts at the first, and is
// said once it has lasted NodeStaleAfter (a timer, so that it is said then,
// not at the next retry, up to a minute later), or at once where it has.
func (m *Metrics) nodeWriteFailed(err error, now time.Time) {
	m.mu.Lock()
	w := &m.node
	reason := nodeFailureReason(err)
	changed := w.said && reason != w.reason
	w.err, w.reason = err.Error(), reason
	w.failed++
	if w.first.IsZero() {
		w.first = now
		first := now
		w.timer = time.AfterFunc(NodeStaleAfter, func() { m.nodeStale(first) })
	}
	wake := m.wake
	m.mu.Unlock()
	if changed && wake != nil {
		wake()
	}
}

// nodeStale says the run that started at first, if it is still on.
func (m *Metrics) nodeStale(first time.Time) {
	m.mu.Lock()
	w := &m.node
	if !w.first.Equal(first) || w.said {
		m.mu.Unlock()
		return
	}
	w.said = true
	wake := m.wake
	m.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// NodeNotUpdated is the run of failed writes of the conditions while it
// is said (it has lasted NodeStaleAfter); ok false otherwise.
func (m *Metrics) NodeNotUpdated() (NodeNotUpdated, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nodeNotUpdatedLocked()
}

func (m *Metrics) nodeNotUpdatedLocked() (NodeNotUpdated, bool) {
	w := m.node
	if !w.said {
		return NodeNotUpdated{}, false
	}
	since := w.landed
	if since.IsZero() {
		since = w.first
	}
	return NodeNotUpdated{Since: since, FailingSince: w.first, Failures: w.failed, Reason: w.reason, Error: w.err}, true
}

// nodeFailureReason is a failed call in a few words, for systemd's status
// line: who refused it, or that the API server could not be reached, or
// the credentials; the error in full is in status and the journal.
func nodeFailureReason(err error) string {
	var se apierrors.APIStatus
	var ha httpAnswer
	var invalid x509.CertificateInvalidError
	alert, refused := tlsAlert(err)
	switch {
	case apierrors.IsForbidden(err):
		return "refused by the API server (403 Forbidden)"
	case apierrors.IsUnauthorized(err):
		return "credentials rejected by the API server (401 Unauthorized)"
	case apierrors.IsNotFound(err):
		return "the Node is not registered (404 NotFound)"
	case errors.As(err, &se) && se.Status().Code != 0:
		st := se.Status()
		return fmt.Sprintf("the API server answers %d %s", st.Code, st.Reason)
	case errors.As(err, &ha):
		return "answered by something other than the API server"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "the API server's certificate expired or not yet valid"
	case serverCertUntrusted(err):
		return "the API server's certificate is not trusted"
	case refused:
		return "TLS handshake refused (" + alert + ")"
	}
	// The innermost cause (connection refused, no route to host, EOF),
	// without the addresses and the operations around it.
	cause := "no answer in time"
	if errKey(err) != "timeout: no answer in time" {
		for inner := err; inner != nil; inner = errors.Unwrap(inner) {
			cause = inner.Error()
		}
	}
	if len(cause) > 60 {
		cause = strings.ToValidUTF8(cause[:57], "") + "..."
	}
	return "API server unreachable (" + report.Printable(cause) + ")"
}
