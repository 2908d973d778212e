//go:build integration

package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// TunnelDisconnected asks the real systemd whether the node has the agent's
// unit: with it installed (the stand-in syself-tunnel-agent.service, up or
// stopped) an endpoint that does not answer is True; with a unit systemd
// does not know (LoadState "not-found") the node has no agent: Unknown,
// NothingToCheck.
func TestTunnelAgentUnitOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	port, err := freeLoopbackPort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	probe := func(unit string) checks.Result {
		t.Helper()
		env, _ := sdEnv(t, s, func(c *config.Config) {
			c.Checks.TunnelDisconnected.MetricsURL = url
			c.Checks.TunnelDisconnected.AgentUnit = unit
		})
		c, err := checks.NewForTest("TunnelDisconnected", env)
		if err != nil {
			t.Fatal(err)
		}
		return snrProbe(t, c)
	}
	unreachable := func(what string, r checks.Result) {
		t.Helper()
		if r.Status != report.StatusTrue || r.Reason != report.ReasonTunnelMetricsUnreachable || !strings.Contains(r.Message, "connection refused") {
			t.Errorf("%s: %+v; want True/%s", what, r, report.ReasonTunnelMetricsUnreachable)
		}
	}

	waitUnit(t, s, "syself-tunnel-agent.service", "up", active)
	unreachable("agent unit active", probe("syself-tunnel-agent.service"))
	if err := s.StopUnit(context.Background(), "syself-tunnel-agent.service"); err != nil {
		t.Fatal(err)
	}
	unreachable("agent unit stopped", probe("syself-tunnel-agent.service"))
	if err := s.StartUnit(context.Background(), "syself-tunnel-agent.service"); err != nil {
		t.Fatal(err)
	}

	r := probe("no-tunnel-agent.service")
	if r.Status != report.StatusUnknown || r.Reason != report.ReasonNothingToCheck ||
		r.Message != "no tunnel agent unit on this node (no-tunnel-agent.service is not installed)" {
		t.Errorf("no agent unit: %+v; want Unknown/NothingToCheck", r)
	}
}
