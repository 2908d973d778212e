package checks

import (
	"context"
	"strings"
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

// A unit that is down because it cannot start says why, in the words of
// its LoadState, and what to look at: a masked unit (systemctl mask), which
// `systemctl start` refuses, and one whose unit file does not load
// (bad-setting, error). Before, each was "is not active (inactive/dead)",
// as a unit someone stopped. A masked unit that still runs (masking does
// not stop it) is active.
func TestNodeServiceDownSaysWhyAUnitCannotStart(t *testing.T) {
	const name = "syself-tunnel-agent.service"
	for _, tc := range []struct {
		load, active, sub string
		status            report.Status
		msg               string
	}{
		{"masked", "inactive", "dead", report.StatusTrue,
			name + " is masked (inactive/dead): systemd will not start it; systemctl unmask it"},
		{"bad-setting", "inactive", "dead", report.StatusTrue,
			name + " does not load (bad-setting, inactive/dead): see systemctl status " + name},
		{"error", "inactive", "dead", report.StatusTrue,
			name + " does not load (error, inactive/dead): see systemctl status " + name},
		{"masked", "active", "running", report.StatusFalse, name + ": active"},
		// Its last start skipped by systemd, a Condition…= not met (or
		// failed on an Assert…=): not a stop, and said so.
		{"loaded", "inactive", "dead", report.StatusTrue,
			name + " is not active (inactive/dead; systemd skipped the start of " + name + ": ConditionPathExists=/usr/bin/tunnel-agent not met)"},
		{"loaded", "inactive", "dead/assert", report.StatusTrue,
			name + " is not active (inactive/dead; systemd did not start " + name + ": AssertPathExists=/usr/bin/tunnel-agent failed)"},
	} {
		u := running(name)
		u.LoadState, u.ActiveState, u.SubState = tc.load, tc.active, tc.sub
		if tc.load == "loaded" {
			u.Skipped = "ConditionPathExists=/usr/bin/tunnel-agent"
			if sub, ok := strings.CutSuffix(tc.sub, "/assert"); ok {
				u.SubState, u.Skipped, u.AssertFailed = sub, "", "AssertPathExists=/usr/bin/tunnel-agent"
			}
		}
		env := testEnv(t, nil)
		env.Systemd = newFakeManager(u)
		c, _ := newNodeServiceDown(env)
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != tc.status || r.Message != tc.msg {
			t.Errorf("%s %s/%s: %s %q (%v)\nwant %s %q", tc.load, tc.active, tc.sub, r.Status, r.Message, err, tc.status, tc.msg)
		}
	}
}
