package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A local page that redirects is followed only on this host: the tunnel
// agent's admin port redirects /metrics to its health port (same host,
// another port), and that is read. A redirect to another host is not
// followed: the daemon asks nothing of a place off the node, and what such
// a place answers is not the local service's state. Before, the probe
// followed it (a DNS lookup of the name, a GET there) and judged the
// condition by that answer. The redirect off the host is a failed answer,
// as a status other than 200 is: True, naming where it pointed.
func TestScrapeRedirectStaysOnThisHost(t *testing.T) {
	// "Elsewhere" is a real server on a real socket that the check must
	// never reach: on this machine's first address that is not loopback
	// (a node's public or private address is not the service's loopback
	// endpoint), and under a host name that resolves nowhere (its lookup
	// alone is a question asked off the node).
	var reached atomic.Int32
	serve := func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		fmt.Fprint(w, "ready 1\nkonnectivity_network_proxy_agent_open_server_connections 1\n")
	}
	offHost := []string{"http://metrics.example.invalid:9587/metrics"}
	if ip := firstNonLoopbackIPv4(t); ip != "" {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatal(err)
		}
		elsewhere := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(serve)}}
		elsewhere.Start()
		defer elsewhere.Close()
		offHost = append(offHost, elsewhere.URL+"/metrics")
	} else {
		t.Log("no address but loopback on this machine: only the name that resolves nowhere is tried off the host")
	}
	// The same host on another port (the tunnel agent's case).
	otherPort := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ready 1\nkonnectivity_network_proxy_agent_open_server_connections 1\n")
	}))
	defer otherPort.Close()
	_, port, _ := net.SplitHostPort(otherPort.Listener.Addr().String())
	var target string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			http.Redirect(w, r, target, http.StatusFound)
			return
		}
		fmt.Fprint(w, "ready 1\nkonnectivity_network_proxy_agent_open_server_connections 2\n")
	}))
	defer srv.Close()
	env := testEnv(t, func(c *config.Config) {
		c.Checks.ProxyNotServing.MetricsURL = srv.URL + "/metrics"
		c.Checks.TunnelDisconnected.MetricsURL = srv.URL + "/metrics"
		c.Checks.TunnelDisconnected.AgentUnit = ""
		c.Checks.KubeletUnhealthy.HealthzURL = srv.URL + "/metrics"
	})
	kubelet, _ := newKubeletCheck(env)
	defer kubelet.(Closer).Close()
	proxy, _ := newProxyCheck(env)
	defer proxy.(Closer).Close()
	tunnel, _ := newTunnelCheck(env)
	defer tunnel.(Closer).Close()

	// On this host (a path, the same host on another port, localhost): followed.
	for _, to := range []string{"/health", otherPort.URL + "/health", "http://localhost:" + port + "/health"} {
		target = to
		if r, err := proxy.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
			t.Errorf("a redirect to %s: %+v %v; want it followed (ProxyServing)", to, r, err)
		}
		if r, err := tunnel.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
			t.Errorf("a redirect to %s: %+v %v; want it followed (TunnelConnected)", to, r, err)
		}
		if r, err := kubelet.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
			t.Errorf("a redirect to %s: %+v %v; want it followed (KubeletIsHealthy)", to, r, err)
		}
	}
	// Off this host: not followed.
	for _, to := range offHost {
		target = to
		r, err := proxy.Probe(context.Background())
		if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonProxyUnreachable ||
			!strings.Contains(r.Message, "a redirect to "+to+", off this host, is not followed") {
			t.Errorf("a redirect to %s: %+v %v; want True/ProxyUnreachable naming the redirect, not followed", to, r, err)
		}
		r, err = tunnel.Probe(context.Background())
		if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonTunnelMetricsUnreachable ||
			!strings.Contains(r.Message, "a redirect to "+to+", off this host, is not followed") {
			t.Errorf("a redirect to %s: %+v %v; want True/TunnelMetricsUnreachable naming the redirect", to, r, err)
		}
		// kubelet's /healthz shares the client: a 200 from off the host is
		// not kubelet healthy.
		r, err = kubelet.Probe(context.Background())
		if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonKubeletHealthzFailed ||
			!strings.Contains(r.Message, "a redirect to "+to+", off this host, is not followed") {
			t.Errorf("a redirect to %s: %+v %v; want True/KubeletHealthzFailed naming the redirect", to, r, err)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the server off the loopback was asked %d times", n)
	}
}

// firstNonLoopbackIPv4 is an IPv4 address of this machine that is not
// loopback, or "" where it has none.
func firstNonLoopbackIPv4(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}
