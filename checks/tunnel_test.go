package checks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

const agentMetric = "konnectivity_network_proxy_agent_open_server_connections"

// standinAgent serves /metrics as the konnectivity agent does: its gauge
// (a GaugeVec without labels, declared as in apiserver-network-proxy's
// pkg/agent/metrics) beside other metrics, in the text exposition format
// of client_golang's handler. Until set, the vector has no series.
func standinAgent(t *testing.T) (*httptest.Server, *prometheus.GaugeVec) {
	t.Helper()
	reg := prometheus.NewRegistry()
	conns := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "konnectivity_network_proxy", Subsystem: "agent",
		Name: "open_server_connections", Help: "Current number of open server connections."}, []string{})
	known := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "konnectivity_network_proxy", Subsystem: "agent",
		Name: "known_server_count", Help: "Current number of servers agent is trying to connect to."})
	known.Set(2)
	reg.MustRegister(conns, known)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux) // on 127.0.0.1
	t.Cleanup(srv.Close)
	return srv, conns
}

func tunnelEnv(t *testing.T, url string) *Env {
	return testEnv(t, func(c *config.Config) { c.Checks.TunnelDisconnected.MetricsURL = url })
}

func probeTunnel(t *testing.T, c Check, wantStatus report.Status, wantReason report.Reason, wantMsg string) {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != wantStatus || r.Reason != wantReason || r.Message != wantMsg {
		t.Errorf("got %s/%s %q (err %v)\nwant %s/%s %q", r.Status, r.Reason, r.Message, err, wantStatus, wantReason, wantMsg)
	}
}

func TestTunnelDefaultsAreTheAgents(t *testing.T) {
	k := config.Default().Checks.TunnelDisconnected
	if k.MetricsURL != "http://127.0.0.1:8093/metrics" || k.ConnectionsMetric != agentMetric {
		t.Errorf("defaults %q %q", k.MetricsURL, k.ConnectionsMetric)
	}
}

// The agent's connections go 2 → 0 → 1, then the agent goes away.
func TestTunnelAgentConnections(t *testing.T) {
	srv, conns := standinAgent(t)
	url := srv.URL + "/metrics"
	c, _ := newTunnelCheck(tunnelEnv(t, url))

	// Started, not yet connected: the vector has no series.
	probeTunnel(t, c, report.StatusTrue, report.ReasonNoTunnelConnections,
		url+" has no "+agentMetric+" gauge (the agent has not counted a connection yet)")

	conns.WithLabelValues().Set(2)
	probeTunnel(t, c, report.StatusFalse, report.ReasonTunnelConnected, url+": "+agentMetric+" is 2")
	conns.WithLabelValues().Set(0)
	probeTunnel(t, c, report.StatusTrue, report.ReasonNoTunnelConnections, url+": "+agentMetric+" is 0 (no connection to a tunnel server)")
	conns.WithLabelValues().Set(1)
	probeTunnel(t, c, report.StatusFalse, report.ReasonTunnelConnected, url+": "+agentMetric+" is 1")

	srv.Close()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonTunnelMetricsUnreachable ||
		!strings.HasPrefix(r.Message, "the tunnel agent's metrics endpoint does not answer: ") || !strings.Contains(r.Message, "connection refused") {
		t.Errorf("agent gone: %+v %v", r, err)
	}
}

func TestTunnelPages(t *testing.T) {
	var page atomic.Value
	var status atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, page.Load())
	}))
	defer srv.Close()
	url := srv.URL + "/metrics"
	c, _ := newTunnelCheck(tunnelEnv(t, url))
	set := func(code int, p string) { status.Store(int32(code)); page.Store(p) }

	// A garbage page: something answered, not the agent's metrics: an error (Unknown, CheckFailed).
	for _, p := range []string{"<html><body>502 Bad Gateway</body></html>\n", agentMetric + "{not closed 1\n",
		"# TYPE " + agentMetric + " histogram\n" + agentMetric + "_bucket{le=\"1\"} 1\n"} {
		set(200, p)
		if r, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "metrics page: ") {
			t.Errorf("page %q: %+v %v; want a page error", p, r, err)
		}
	}
	set(200, agentMetric+" NaN\n")
	if r, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "is NaN, not a connection count") {
		t.Errorf("NaN: %+v %v", r, err)
	}
	// An untyped series, as a hand-written page has it, counts.
	set(200, agentMetric+" 3\n")
	probeTunnel(t, c, report.StatusFalse, report.ReasonTunnelConnected, url+": "+agentMetric+" is 3")
	// Another service on the port, or the agent failing: not an answer.
	set(503, "")
	probeTunnel(t, c, report.StatusTrue, report.ReasonTunnelMetricsUnreachable,
		"the tunnel agent's metrics endpoint does not answer: GET "+url+": HTTP 503")
	// The metric renamed in the configuration.
	set(200, "# TYPE tunnels gauge\ntunnels 1\n")
	probeTunnel(t, c, report.StatusTrue, report.ReasonNoTunnelConnections,
		url+" has no "+agentMetric+" gauge (the agent has not counted a connection yet)")
	env := tunnelEnv(t, url)
	env.Config.Checks.TunnelDisconnected.ConnectionsMetric = "tunnels"
	c2, _ := newTunnelCheck(env)
	probeTunnel(t, c2, report.StatusFalse, report.ReasonTunnelConnected, url+": tunnels is 1")
}

func TestTunnelControlPlaneHasNoAgent(t *testing.T) {
	env := tunnelEnv(t, "http://127.0.0.1:1/metrics")
	env.Role = report.RoleControlPlane
	c, _ := newTunnelCheck(env)
	probeTunnel(t, c, report.StatusUnknown, report.ReasonNothingToCheck,
		"the tunnel agent runs on worker nodes; a control-plane node has no agent connections to count")
}

// A worker without the agent's unit has no agent: Unknown, NothingToCheck,
// not True for ever. With the unit installed (down or up), or where systemd
// does not answer or is not there, or with agent_unit empty, the endpoint
// decides as before: not answering is True.
func TestTunnelWithoutAgentUnit(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/metrics"
	srv.Close() // nothing listens there now
	const unit = "syself-tunnel-agent.service"
	if got := config.Default().Checks.TunnelDisconnected.AgentUnit; got != unit {
		t.Fatalf("default agent_unit %q", got)
	}
	unreachable := func(t *testing.T, c Check) {
		t.Helper()
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != report.StatusTrue || r.Reason != report.ReasonTunnelMetricsUnreachable ||
			!strings.Contains(r.Message, "connection refused") {
			t.Errorf("got %+v %v; want True/%s", r, err, report.ReasonTunnelMetricsUnreachable)
		}
	}
	for _, tc := range []struct {
		name    string
		sd      func() systemd.Manager
		noUnit  bool // agent_unit = ""
		nothing bool // want Unknown, NothingToCheck
	}{
		{name: "unit not found", sd: func() systemd.Manager { return newFakeManager() }, nothing: true},
		{name: "unit loaded, agent failed", sd: func() systemd.Manager {
			return newFakeManager(systemd.Unit{Name: unit, LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code"})
		}},
		{name: "unit loaded and active", sd: func() systemd.Manager {
			return newFakeManager(systemd.Unit{Name: unit, LoadState: "loaded", ActiveState: "active", SubState: "running"})
		}},
		{name: "no systemd", sd: func() systemd.Manager { return nil }},
		{name: "systemd does not answer", sd: func() systemd.Manager {
			m := newFakeManager()
			m.err = errors.New("dial unix /run/systemd/private: connect: no such file or directory")
			return m
		}},
		{name: "agent_unit empty", sd: func() systemd.Manager { return newFakeManager() }, noUnit: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := tunnelEnv(t, url)
			if m := tc.sd(); m != nil {
				env.Systemd = m
			}
			if tc.noUnit {
				env.Config.Checks.TunnelDisconnected.AgentUnit = ""
			}
			c, _ := newTunnelCheck(env)
			if tc.nothing {
				probeTunnel(t, c, report.StatusUnknown, report.ReasonNothingToCheck,
					"no tunnel agent unit on this node ("+unit+" is not installed)")
				return
			}
			unreachable(t, c)
		})
	}
}

// The agent's page through the shared parser and the check's reading of it:
// never a panic; a valid page is True or False, and False only with a
// positive count.
func FuzzTunnelPage(f *testing.F) {
	f.Add("# HELP " + agentMetric + " Current number of open server connections.\n# TYPE " + agentMetric + " gauge\n" + agentMetric + " 2\n")
	f.Add(agentMetric + " 0\n")
	f.Add(agentMetric + "{a=\"b\"} 1\n" + agentMetric + "{a=\"c\"} -1\n")
	f.Add("# TYPE " + agentMetric + " summary\n" + agentMetric + "{quantile=\"0.5\"} 1\n")
	f.Add(agentMetric + " +Inf\n")
	f.Fuzz(func(t *testing.T, page string) {
		vals, found, err := parseMetric(strings.NewReader(page), agentMetric)
		if err != nil && !isPageError(err) {
			t.Fatalf("parse error %v is not a page error", err)
		}
		r, err := tunnelResult("u", agentMetric, vals, found, err)
		// On a page Prometheus' parser takes whole, the check reads what
		// reading it with that parser would: the same condition, or the
		// same error (Unknown). Deliberate difference: one series given
		// twice is a page error here (TestScrapeSeriesTwiceIsAPageError),
		// which expfmt takes.
		p := expfmt.NewTextParser(model.UTF8Validation)
		if fams, whole := p.TextToMetricFamilies(strings.NewReader(page)); whole == nil && !hasSeriesTwice(fams[agentMetric]) {
			rv, rf, rerr := expfmtValues(fams, agentMetric)
			if rerr != nil {
				rerr = &pageError{rerr}
			}
			want, wantErr := tunnelResult("u", agentMetric, rv, rf, rerr)
			if (err == nil) != (wantErr == nil) || r.Status != want.Status || r.Reason != want.Reason {
				t.Fatalf("the check reads %s/%s (%v); by expfmt's reading %s/%s (%v)", r.Status, r.Reason, err, want.Status, want.Reason, wantErr)
			}
		}
		if err != nil {
			return
		}
		switch r.Status {
		case report.StatusFalse:
			if r.Reason != report.ReasonTunnelConnected {
				t.Fatalf("False with %s", r.Reason)
			}
			var sum float64
			for _, v := range vals {
				sum += v
			}
			if !(sum > 0) {
				t.Fatalf("False with the values %v", vals)
			}
		case report.StatusTrue:
			if r.Reason != report.ReasonNoTunnelConnections {
				t.Fatalf("True with %s for a page that parsed", r.Reason)
			}
		default:
			t.Fatalf("status %s", r.Status)
		}
	})
}
