package checks

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// Where a redirect points, one by one: on this host (followed) or not (an
// error naming it). The loopback network is 127.0.0.0/8 and ::1, an
// IPv4-mapped loopback address too; a host name other than localhost (in
// any case) or the configured URL's own is not followed, even where it may
// resolve to loopback, as its lookup may be a question asked off the node;
// 0.0.0.0, "localhost." and the numeric forms a resolver might read as
// 127.0.0.1 are not followed either. A userinfo before "@" is not the host.
func TestScrapeRedirectHosts(t *testing.T) {
	for _, c := range []struct {
		from, to string
		followed bool
	}{
		{"http://127.0.0.1:9587/metrics", "http://127.0.0.2:9587/metrics", true},
		{"http://127.0.0.1:9587/metrics", "http://[::1]:8093/metrics", true},
		{"http://127.0.0.1:9587/metrics", "http://[::ffff:127.0.0.1]:8093/metrics", true},
		{"http://127.0.0.1:9587/metrics", "http://LOCALHOST:8093/metrics", true},
		{"http://127.0.0.1:9587/metrics", "https://127.0.0.1:8093/metrics", true},
		{"http://127.0.0.1:9587/metrics", "/health", true},
		{"http://127.0.0.1:9587/metrics", "//127.0.0.1:8093/metrics", true},
		// A configured host name: the same name on another port is this host
		// as the configuration names it; another name is not.
		{"http://node-a.example:8094/metrics", "//node-a.example:8093/metrics", true},
		{"http://node-a.example:8094/metrics", "http://NODE-A.example:8093/metrics", true},
		{"http://node-a.example:8094/metrics", "http://node-b.example:8093/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://0.0.0.0:9587/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://localhost.:9587/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://127.1:9587/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://2130706433:9587/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://127.0.0.1@metrics.example.invalid/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://127.0.0.1:9587@metrics.example.invalid/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://[fe80::1%25lo]:9587/metrics", false},
		{"http://127.0.0.1:9587/metrics", "http://metrics.example.invalid/metrics", false},
		{"http://127.0.0.1:9587/metrics", "unix:///run/syself/proxy.sock", false},
		{"http://127.0.0.1:9587/metrics", "file:///etc/hostname", false},
	} {
		from, err := url.Parse(c.from)
		if err != nil {
			t.Fatal(err)
		}
		to, err := from.Parse(c.to)
		if err != nil {
			t.Fatal(err)
		}
		err = onThisHost(&http.Request{URL: to}, []*http.Request{{URL: from}})
		if (err == nil) != c.followed {
			t.Errorf("from %s, a redirect to %s (%s): %v; want followed %v", c.from, c.to, to, err, c.followed)
		}
	}
}

// The tunnel agent (konnectivity's proxy-agent) redirects /metrics on its
// admin port (--admin-server-port, 8094) to its health port: with a
// Location of the request's own host and the health port and no scheme,
// "//127.0.0.1:8093/metrics", in the releases since it builds it from the
// request's URL; that is this host and is followed. Its older releases
// wrote "127.0.0.1:8093/metrics", which is no URL net/http can follow
// (nor could it before 3d3ce75): a failed answer, True, naming it.
func TestScrapeRedirectOfTheTunnelAgentsAdminPort(t *testing.T) {
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "konnectivity_network_proxy_agent_open_server_connections 1\n")
	}))
	defer health.Close()
	_, healthPort, _ := net.SplitHostPort(health.Listener.Addr().String())
	var location func(r *http.Request) string
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", location(r))
		w.WriteHeader(http.StatusMovedPermanently)
	}))
	defer admin.Close()
	_, adminPort, _ := net.SplitHostPort(admin.Listener.Addr().String())
	hostOf := func(r *http.Request) string {
		h, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			return r.Host
		}
		return h
	}
	for _, c := range []struct {
		host, name string
		location   func(r *http.Request) string
		followed   bool
		message    string
	}{
		{"127.0.0.1", "as now", func(r *http.Request) string { return "//" + net.JoinHostPort(hostOf(r), healthPort) + r.URL.Path }, true, ""},
		{"localhost", "as now", func(r *http.Request) string { return "//" + net.JoinHostPort(hostOf(r), healthPort) + r.URL.Path }, true, ""},
		{"127.0.0.1", "as before", func(r *http.Request) string { return hostOf(r) + ":" + healthPort + r.URL.Path }, false,
			`failed to parse Location header "127.0.0.1:` + healthPort + `/metrics"`},
		{"localhost", "as before", func(r *http.Request) string { return hostOf(r) + ":" + healthPort + r.URL.Path }, false,
			"a redirect to localhost:" + healthPort + "/metrics, not an http or https URL, is not followed"},
	} {
		location = c.location
		env := testEnv(t, func(cfg *config.Config) {
			cfg.Checks.TunnelDisconnected.MetricsURL = "http://" + net.JoinHostPort(c.host, adminPort) + "/metrics"
			cfg.Checks.TunnelDisconnected.AgentUnit = ""
		})
		tunnel, _ := newTunnelCheck(env)
		r, err := tunnel.Probe(context.Background())
		tunnel.(Closer).Close()
		switch {
		case c.followed && (err != nil || r.Status != report.StatusFalse):
			t.Errorf("%s, the admin port's redirect %s: %+v %v; want it followed (TunnelConnected)", c.host, c.name, r, err)
		case !c.followed && (err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonTunnelMetricsUnreachable || !strings.Contains(r.Message, c.message)):
			t.Errorf("%s, the admin port's redirect %s: %+v %v; want True/TunnelMetricsUnreachable naming %q", c.host, c.name, r, err, c.message)
		}
	}
}

// A redirect loop on this host is bounded: 10 requests, then a failed
// answer (True) that says so; a 307 with a body is followed as a GET.
func TestScrapeRedirectLoopIsBounded(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/loop":
			asked.Add(1)
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/307":
			if r.Method != http.MethodGet {
				t.Errorf("a 307 followed with %s", r.Method)
			}
			w.Header().Set("Location", "/metrics")
			w.WriteHeader(http.StatusTemporaryRedirect)
			fmt.Fprint(w, strings.Repeat("ready 0\n", 1000))
		default:
			fmt.Fprint(w, "ready 1\n")
		}
	}))
	defer srv.Close()
	for _, c := range []struct {
		path   string
		status report.Status
	}{{"/loop", report.StatusTrue}, {"/307", report.StatusFalse}} {
		env := testEnv(t, func(cfg *config.Config) { cfg.Checks.ProxyNotServing.MetricsURL = srv.URL + c.path })
		proxy, _ := newProxyCheck(env)
		r, err := proxy.Probe(context.Background())
		proxy.(Closer).Close()
		if err != nil || r.Status != c.status || (c.path == "/loop" && !strings.Contains(r.Message, "stopped after 10 redirects")) {
			t.Errorf("%s: %+v %v; want %s", c.path, r, err, c.status)
		}
	}
	if n := asked.Load(); n != 10 {
		t.Errorf("the loop was asked %d times; want 10", n)
	}
}
