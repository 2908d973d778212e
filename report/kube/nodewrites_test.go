package kube

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// portClosed is the error of a call to an API server whose port is closed.
var portClosed = &url.Error{Op: "Patch", URL: "https://10.0.0.1:6443/api/v1/nodes/n/status",
	Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}

// The conditions' writes failing in a row are said once they have failed
// for NodeStaleAfter (60 s), not before (a blip), with the time of the
// last write that landed and the failure in a few words; the status line
// is woken then, when the reason changes, and when a write lands again,
// which clears it. A run a write ends before the 60 s is never said.
func TestNodeNotUpdatedSaidAfterTheGraceUntilAWriteLands(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMetrics(nil)
		var wakes atomic.Int32
		m.SetWake(func() { wakes.Add(1) })
		landed := time.Now()
		m.nodeWritten(landed)
		if _, ok := m.NodeNotUpdated(); ok || wakes.Load() != 0 {
			t.Fatalf("a write landed: said, %d wakes", wakes.Load())
		}

		// A blip: failures for 30 s, then a write lands.
		time.Sleep(10 * time.Second)
		m.nodeWriteFailed(portClosed, time.Now())
		time.Sleep(30 * time.Second)
		m.nodeWriteFailed(portClosed, time.Now())
		m.nodeWritten(time.Now())
		landed = time.Now()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if n, ok := m.NodeNotUpdated(); ok || wakes.Load() != 0 {
			t.Fatalf("a 30 s blip: said %+v, %d wakes", n, wakes.Load())
		}

		// An outage: the first failure 5 min after the last write landed.
		first := time.Now()
		m.nodeWriteFailed(portClosed, first)
		time.Sleep(NodeStaleAfter - time.Second)
		synctest.Wait()
		if n, ok := m.NodeNotUpdated(); ok || wakes.Load() != 0 {
			t.Fatalf("59 s of failed writes: said %+v, %d wakes; want nothing yet", n, wakes.Load())
		}
		m.nodeWriteFailed(portClosed, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		n, ok := m.NodeNotUpdated()
		if !ok || !n.Since.Equal(landed) || !n.FailingSince.Equal(first) || n.Failures != 2 ||
			n.Reason != "API server unreachable (connection refused)" || n.Error != portClosed.Error() {
			t.Fatalf("60 s of failed writes: %+v, %v", n, ok)
		}
		if w := wakes.Load(); w != 1 {
			t.Errorf("woken %d times at the 60 s, want once", w)
		}
		want := "Node NOT updated since " + landed.UTC().Format("2006-01-02 15:04:05") + "Z: API server unreachable (connection refused)"
		if got := n.Note(); got != want {
			t.Errorf("note %q, want %q", got, want)
		}
		if r := m.Reporting(); r.NodeNotUpdated == nil || *r.NodeNotUpdated != n {
			t.Errorf("Reporting().NodeNotUpdated = %+v, want %+v", r.NodeNotUpdated, n)
		}
		// The same failure again: no wake; another reason: one.
		m.nodeWriteFailed(portClosed, time.Now())
		if w := wakes.Load(); w != 1 {
			t.Errorf("woken %d times by the same failure again, want once", w)
		}
		m.nodeWriteFailed(apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n", errors.New("node not allowed")), time.Now())
		if n, _ := m.NodeNotUpdated(); n.Reason != "refused by the API server (403 Forbidden)" || !n.Since.Equal(landed) {
			t.Errorf("after a 403: %+v", n)
		}
		if w := wakes.Load(); w != 2 {
			t.Errorf("woken %d times by a changed reason, want 2", w)
		}
		// A write lands: cleared, woken.
		m.nodeWritten(time.Now())
		if n, ok := m.NodeNotUpdated(); ok || m.Reporting().NodeNotUpdated != nil {
			t.Errorf("a write landed, still said: %+v", n)
		}
		if w := wakes.Load(); w != 3 {
			t.Errorf("woken %d times, want 3 (said, reason, cleared)", w)
		}
		time.Sleep(2 * NodeStaleAfter)
		synctest.Wait()
		if w := wakes.Load(); w != 3 {
			t.Errorf("woken %d times after the run ended, want 3", w)
		}
	})
}

// Nothing landed since the reporter started (the Node's read at start
// failing): the note's time is the first failure's.
func TestNodeNotUpdatedSinceTheFirstFailureWhenNothingLanded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := NewMetrics(nil)
		first := time.Now()
		m.nodeWriteFailed(portClosed, first)
		time.Sleep(NodeStaleAfter)
		synctest.Wait()
		if n, ok := m.NodeNotUpdated(); !ok || !n.Since.Equal(first) {
			t.Errorf("%+v, %v; want said since %v", n, ok, first)
		}
	})
}

// The reasons the status line gives: short, by who portClosed and why.
func TestNodeFailureReason(t *testing.T) {
	gr := schema.GroupResource{Resource: "nodes"}
	expired := x509.CertificateInvalidError{Reason: x509.Expired, Detail: "current time is after"}
	for _, c := range []struct {
		err  error
		want string
	}{
		{apierrors.NewForbidden(gr, "n", errors.New("node not allowed")), "refused by the API server (403 Forbidden)"},
		{apierrors.NewUnauthorized("Unauthorized"), "credentials rejected by the API server (401 Unauthorized)"},
		{fmt.Errorf("node n is not registered (yet): %w", apierrors.NewNotFound(gr, "n")), "the Node is not registered (404 NotFound)"},
		{apierrors.NewServiceUnavailable("etcd"), "the API server answers 503 ServiceUnavailable"},
		{apierrors.NewTooManyRequests("slow down", 5), "the API server answers 429 TooManyRequests"},
		{httpAnswer{errors.New("the API server's address answered with a redirect")}, "answered by something other than the API server"},
		{&url.Error{Op: "Get", URL: "https://x", Err: &tlsVerify{expired}}, "the API server's certificate expired or not yet valid"},
		{&url.Error{Op: "Get", URL: "https://x", Err: x509.UnknownAuthorityError{}}, "the API server's certificate is not trusted"},
		{portClosed, "API server unreachable (connection refused)"},
		{fmt.Errorf("kubeconfig /etc/kubernetes/kubelet.conf, or a file it names: %w", fmt.Errorf("%w (since 2026-12-07T11:00:00Z)", ErrFilesHung)), "the kubeconfig's files do not answer (a hung disk?)"},
		{&url.Error{Op: "Patch", URL: "https://x", Err: os.ErrDeadlineExceeded}, "API server unreachable (no answer in time)"},
		{errors.New(strings.Repeat("x", 100)), "API server unreachable (" + strings.Repeat("x", 57) + "...)"},
	} {
		if got := nodeFailureReason(c.err); got != c.want {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}

// tlsVerify wraps a verification error as crypto/tls does.
type tlsVerify struct{ err error }

func (e *tlsVerify) Error() string { return "tls: failed to verify certificate: " + e.err.Error() }
func (e *tlsVerify) Unwrap() error { return e.err }

// A Node not updated since an earlier day: the note gives the date, so the
// line (sent again only when it changes) does not read as today's time of
// day, nor a Node not updated for two days as one not updated for hours.
// Before, "Node NOT updated since 23:30:00Z: ..." whatever the day.
func TestNodeNotUpdatedNoteGivesTheDate(t *testing.T) {
	n := NodeNotUpdated{Since: time.Date(2026, 12, 2, 23, 30, 0, 0, time.FixedZone("CET", 3600)), Reason: "API server unreachable (connection refused)"}
	want := "Node NOT updated since 2026-12-02 22:30:00Z: API server unreachable (connection refused)"
	if got := n.Note(); got != want {
		t.Errorf("note %q, want %q", got, want)
	}
}
