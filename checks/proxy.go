package checks

import (
	"context"
	"fmt"
	"math"
	"net/http"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("ProxyNotServing", newProxyCheck) }

// proxyCheck: the local syself-proxy's ready gauge on its metrics endpoint
// is 0 or missing, or the endpoint is unreachable (worker nodes only). A
// page that is not exposition text (or is too long to read), or a ready
// value that is NaN, infinite or negative, is an error, Unknown, as for
// TunnelDisconnected: something answered, and what it says is not known.
type proxyCheck struct {
	url, metric string
	client      *http.Client
}

func newProxyCheck(env *Env) (Check, error) {
	c := env.Config.Checks.ProxyNotServing
	return &proxyCheck{url: c.MetricsURL, metric: c.ReadyMetric, client: keptClient(c.Timeout.Duration)}, nil
}

// Close closes the kept connection (Closer).
func (c *proxyCheck) Close() { c.client.CloseIdleConnections() }

func (c *proxyCheck) Probe(ctx context.Context) (Result, error) {
	vals, found, err := scrapeGauge(ctx, c.client, c.url, c.metric)
	switch {
	case err != nil && isPageError(err):
		return Result{}, fmt.Errorf("%s: %w", c.url, err)
	case err != nil:
		return Result{Status: report.StatusTrue, Reason: report.ReasonProxyUnreachable, Message: err.Error()}, nil
	case !found || len(vals) == 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonProxyNotReady, Message: fmt.Sprintf("%s has no %s gauge", c.url, c.metric)}, nil
	}
	// NaN, an infinity or a negative value is no readiness the proxy
	// reports, so neither serving nor not: Unknown, as TunnelDisconnected
	// treats such a connection count. Before, any value but 0 was serving.
	for _, v := range vals {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return Result{}, fmt.Errorf("%s: %s is %v, not a readiness value (0 not ready, above 0 ready)", c.url, c.metric, v)
		}
	}
	for _, v := range vals {
		if v == 0 {
			return Result{Status: report.StatusTrue, Reason: report.ReasonProxyNotReady, Message: fmt.Sprintf("%s: %s is 0 (no valid target set)", c.url, c.metric)}, nil
		}
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonProxyServing, Message: fmt.Sprintf("%s: %s is %v", c.url, c.metric, vals[0])}, nil
}
