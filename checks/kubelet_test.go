package checks

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A kubelet that does not answer /healthz in full is unhealthy, and
// restarted: one that accepts and never answers, one that sends its 200
// and then never its body (hung mid-answer), and one whose answer is cut
// off (it died mid-answer) each fail the probe within the probe's share of
// the check's timeout, and the repairer restarts kubelet.service. The probe
// took the 200 alone for "ok" before, whatever became of the body.
func TestKubeletProbeAHungOrCutAnswerFails(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"no answer", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}, "Client.Timeout exceeded while awaiting headers"},
		{"200, then no body", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "2")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}, "reading the answer: "},
		{"200, body cut off", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "2")
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("o"))
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}, "reading the answer: unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: tc.handler}
			go srv.Serve(ln)
			defer srv.Close()
			// 4 s, not 1: the probe's own bound is four fifths of it
			// (probeTimeout), and on a loaded machine (load 8, a whole
			// `go test ./...` beside other builds) 1 s left 0.2 s of
			// slack and a 0.8 s bound took 1.95 s of wall time.
			const timeout = 4 * time.Second
			env := testEnv(t, func(c *config.Config) {
				c.Checks.KubeletUnhealthy.HealthzURL = "http://" + ln.Addr().String() + "/healthz"
				c.Checks.KubeletUnhealthy.Timeout = config.Duration{Duration: timeout}
			})
			u := running("kubelet.service")
			u.MainStart = time.Now().Add(-time.Hour)
			m := newFakeManager(u)
			env.Systemd, env.Repair = m, NewRepairer(m, quietLog(), time.Now, nil)
			ch, err := newKubeletCheck(env)
			if err != nil {
				t.Fatal(err)
			}
			defer ch.(*kubeletCheck).Close()
			ctx, cancel := context.WithTimeout(context.Background(), timeout) // as the runner gives it
			defer cancel()
			start := time.Now()
			r, err := ch.Probe(ctx)
			took := time.Since(start)
			env.Repair.Wait()
			if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonKubeletHealthzFailed || !strings.Contains(r.Message, tc.want) {
				t.Errorf("%s %s %q, %v; want True %s with %q", r.Status, r.Reason, r.Message, err, report.ReasonKubeletHealthzFailed, tc.want)
			}
			if took >= timeout {
				t.Errorf("the probe took %s, the whole check's timeout (%s): no time left for the repair", took, timeout)
			}
			if n := m.restartCount(); n != 1 {
				t.Errorf("%d restarts of kubelet.service, want 1", n)
			}
		})
	}
}

// A kubelet that resets every connection (before its answer, or mid-body)
// gives the same message at every probe: the error names the kubelet's
// address, not the probe's local port, which is another at each new
// connection (a message that changed at every probe would rewrite the
// Node's status every 10 s, as ProxyNotServing's did:
// TestScrapeFailureMessageStaysTheSame).
func TestKubeletProbeFailureMessageStaysTheSame(t *testing.T) {
	for _, when := range []string{"before", "mid-body"} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		resettingPeer(t, l, when)
		env := testEnv(t, func(c *config.Config) {
			c.Checks.KubeletUnhealthy.HealthzURL = "http://" + l.Addr().String() + "/healthz"
		})
		ch, err := newKubeletCheck(env)
		if err != nil {
			t.Fatal(err)
		}
		var msgs []string
		for range 3 {
			r, err := ch.Probe(context.Background())
			if err != nil || r.Status != report.StatusTrue || !strings.Contains(r.Message, "connection reset by peer") {
				t.Fatalf("reset %s: %+v %v", when, r, err)
			}
			msgs = append(msgs, r.Message)
		}
		if msgs[0] != msgs[1] || msgs[1] != msgs[2] || strings.Contains(msgs[0], "->") {
			t.Errorf("reset %s: the messages name the local port or change:\n%s", when, strings.Join(msgs, "\n"))
		}
		ch.(*kubeletCheck).Close()
	}
}
