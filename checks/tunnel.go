package checks

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("TunnelDisconnected", newTunnelCheck) }

// tunnelCheck: the reverse tunnel to the control plane (konnectivity,
// apiserver-network-proxy) has no open connection. Its agent exports the
// gauge konnectivity_network_proxy_agent_open_server_connections on
// /metrics of its health server (--health-server-port, 8093; the admin
// port, 8094, redirects /metrics there). True when the gauge is 0, when the
// page has no such gauge (the agent creates the series when it first counts
// its connections), or when the endpoint does not answer. A page that is not
// exposition text is an error: something answered, and what it says is not
// known (Unknown, CheckFailed).
//
// The agent runs on worker nodes (NodeServiceDown's worker_units); a
// control-plane node runs the tunnel server and has no agent to measure:
// Unknown, NothingToCheck. The catalog row keeps the spec's scope (all).
// So is a worker without the agent's unit (agent_unit, LoadState
// "not-found" over D-Bus): an unreachable endpoint there is no agent, not an
// agent down. Where systemd does not answer, or agent_unit is empty (an
// agent that is not a systemd unit), the endpoint alone decides.
type tunnelCheck struct {
	env               *Env
	url, metric, unit string
	client            *http.Client
}

func newTunnelCheck(env *Env) (Check, error) {
	c := env.Config.Checks.TunnelDisconnected
	return &tunnelCheck{env: env, url: c.MetricsURL, metric: c.ConnectionsMetric, unit: c.AgentUnit,
		client: keptClient(c.Timeout.Duration)}, nil
}

// Close closes the kept connection (Closer).
func (c *tunnelCheck) Close() { c.client.CloseIdleConnections() }

func (c *tunnelCheck) Probe(ctx context.Context) (Result, error) {
	if c.env.Role == report.RoleControlPlane {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Message: "the tunnel agent runs on worker nodes; a control-plane node has no agent connections to count"}, nil
	}
	if c.unit != "" && c.env.Systemd != nil {
		// An error here is systemd not answering: the endpoint decides, as without systemd.
		if ls, err := systemd.LoadStateOf(ctx, c.env.Systemd, c.unit); err == nil && ls == "not-found" {
			return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
				Message: fmt.Sprintf("no tunnel agent unit on this node (%s is not installed)", c.unit)}, nil
		}
	}
	vals, found, err := scrapeGauge(ctx, c.client, c.url, c.metric)
	return tunnelResult(c.url, c.metric, vals, found, err)
}

// tunnelResult turns a scrape of the agent's page into the condition.
func tunnelResult(url, metric string, vals []float64, found bool, err error) (Result, error) {
	switch {
	case err != nil && isPageError(err):
		return Result{}, fmt.Errorf("%s: %w", url, err)
	case err != nil:
		return Result{Status: report.StatusTrue, Reason: report.ReasonTunnelMetricsUnreachable,
			Message: fmt.Sprintf("the tunnel agent's metrics endpoint does not answer: %v", err)}, nil
	case !found || len(vals) == 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNoTunnelConnections,
			Message: fmt.Sprintf("%s has no %s gauge (the agent has not counted a connection yet)", url, metric)}, nil
	}
	var sum float64
	for _, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return Result{}, fmt.Errorf("%s: %s is %v, not a connection count", url, metric, v)
		}
		sum += v
	}
	if sum == 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonNoTunnelConnections,
			Message: fmt.Sprintf("%s: %s is 0 (no connection to a tunnel server)", url, metric)}, nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonTunnelConnected,
		Message: fmt.Sprintf("%s: %s is %s", url, metric, strconv.FormatFloat(sum, 'f', -1, 64))}, nil
}
