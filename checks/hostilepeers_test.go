package checks

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// hostilePeer serves one kind of misbehaviour on l: it reads each request
// and then never answers ("silent"), trickles a header one byte every 20 ms
// without end ("trickle"), or answers 200 with a body without end
// ("endless"). It stops when the test ends.
func hostilePeer(t *testing.T, l net.Listener, kind string) {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done); l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				go func() { <-done; c.Close() }()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				switch kind {
				case "silent":
					<-done
				case "trickle":
					if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nX-Slow: ")); err != nil {
						return
					}
					for {
						select {
						case <-done:
							return
						case <-time.After(20 * time.Millisecond):
						}
						if _, err := c.Write([]byte("a")); err != nil {
							return
						}
					}
				case "endless":
					if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")); err != nil {
						return
					}
					// A JSON answer whose message never ends (a
					// metrics page reads it as too long as well).
					if _, err := c.Write([]byte(`{"cilium":{"state":"Ok","msg":"`)); err != nil {
						return
					}
					chunk := []byte(strings.Repeat("x", 64<<10))
					for {
						if _, err := c.Write(chunk); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
}

// A peer that accepts and never answers, or trickles its answer, holds a
// probe no longer than its own timeout (probeTimeout, 4/5 of the check's),
// and the probe says the peer does not answer; one that streams without end
// is read up to the probe's bound (cilium's 1 MiB, a metrics page's 4 MiB)
// and is an unreadable answer (Unknown), well before the timeout.
func TestHostilePeersAreBounded(t *testing.T) {
	for _, kind := range []string{"silent", "trickle", "endless"} {
		timeout := 500 * time.Millisecond
		if kind == "endless" {
			// Cut at the size bound, not at the timeout: a timeout the
			// reading of 4 MiB cannot meet on a loaded machine (under
			// -race it took more than 400 ms: make test-race's second whole
			// run), and the answer must come well before it.
			timeout = 10 * time.Second
		}
		t.Run("CNIUnhealthy/"+kind, func(t *testing.T) {
			root := t.TempDir()
			sock := filepath.Join(root, "var/run/cilium/cilium.sock")
			if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
				t.Fatal(err)
			}
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			hostilePeer(t, l, kind)
			env := testEnv(t, func(c *config.Config) {
				c.HostRoot = root
				c.Checks.CNIUnhealthy.Timeout.Duration = timeout
			})
			c, _ := newCNICheck(env)
			defer c.(Closer).Close()
			probeHostile(t, c, kind, timeout, report.ReasonCiliumUnreachable)
		})
		t.Run("ProxyNotServing/"+kind, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			hostilePeer(t, l, kind)
			env := testEnv(t, func(c *config.Config) {
				c.Checks.ProxyNotServing.MetricsURL = "http://" + l.Addr().String() + "/metrics"
				c.Checks.ProxyNotServing.Timeout.Duration = timeout
			})
			c, _ := newProxyCheck(env)
			defer c.(Closer).Close()
			probeHostile(t, c, kind, timeout, report.ReasonProxyUnreachable)
		})
		if kind == "endless" {
			continue // a 200 is kubelet's healthy answer, whatever follows it
		}
		t.Run("KubeletUnhealthy/"+kind, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			hostilePeer(t, l, kind)
			env := testEnv(t, func(c *config.Config) {
				c.Checks.KubeletUnhealthy.HealthzURL = "http://" + l.Addr().String() + "/healthz"
				c.Checks.KubeletUnhealthy.Timeout.Duration = timeout
			})
			c, _ := newKubeletCheck(env)
			defer c.(Closer).Close()
			probeHostile(t, c, kind, timeout, report.ReasonKubeletHealthzFailed)
		})
	}
}

// probeHostile probes c with a context that has no deadline of its own (the
// runner's would end the probe whatever the check does) and checks how
// long it took and what it said.
func probeHostile(t *testing.T, c Check, kind string, timeout time.Duration, unreachable report.Reason) {
	t.Helper()
	type answer struct {
		r   Result
		err error
	}
	done := make(chan answer, 1)
	start := time.Now()
	go func() {
		r, err := c.Probe(context.Background())
		done <- answer{r, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-time.After(20 * timeout):
		t.Fatalf("a %s peer held the probe for more than %s (its check's timeout is %s)", kind, 20*timeout, timeout)
	}
	took := time.Since(start)
	r, err := a.r, a.err
	switch kind {
	case "endless":
		if err == nil {
			t.Errorf("an endless answer: %+v; want an error (Unknown)", r)
		} else if strings.Contains(err.Error(), "Timeout") || strings.Contains(err.Error(), "deadline") {
			t.Errorf("an endless answer: %v; want it cut at the size bound, not at the probe's timeout", err)
		}
	default:
		if err != nil || r.Status != report.StatusTrue || r.Reason != unreachable {
			t.Errorf("a %s peer: %+v, %v; want True/%s", kind, r, err, unreachable)
		}
		// The probe's own timeout is 4/5 of the check's; the slack is
		// for a loaded machine.
		if took > 4*timeout {
			t.Errorf("a %s peer held the probe %s; want about the probe's timeout %s", kind, took, probeTimeout(timeout))
		}
	}
}
