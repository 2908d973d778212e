package checks

import (
	"context"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// A unit that systemd is reloading (ExecReload=, `systemctl reload`) or
// refreshing (systemd 255's refresh of its mount namespace) keeps running
// and serving: `systemctl is-active` counts both as active (exit 0), and so
// does the check. Before, either was "not active (reloading/reload)", True.
func TestNodeServiceDownReloadingIsActive(t *testing.T) {
	for _, state := range []struct{ active, sub string }{{"reloading", "reload"}, {"refreshing", "running"}} {
		u := running("syself-tunnel-agent.service")
		u.ActiveState, u.SubState = state.active, state.sub
		env := testEnv(t, nil)
		env.Systemd = newFakeManager(u)
		c, _ := newNodeServiceDown(env)
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != report.StatusFalse || r.Reason != report.ReasonNodeServicesActive || r.Message != "syself-tunnel-agent.service: active" {
			t.Errorf("%s/%s: %+v %v", state.active, state.sub, r, err)
		}
	}
}
