//go:build integration

package tests

import (
	"context"
	"os"
	"testing"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// A critical unit failed (its Restart= gave up, or none), then masked (an
// operator keeping it from coming back while they look at it) or its unit
// file removed, and systemctl daemon-reload: still failed, and the
// condition says why it failed, as for a loaded one.
func TestServiceNotRecoveringFailedUnitMaskedOrRemoved(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	for _, how := range []string{"mask", "remove"} {
		u := how + "-fail.service"
		if err := s.AddUnit(ctx, u, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/false\n"); err != nil {
			t.Fatal(err)
		}
		s.StartUnit(ctx, u)
		waitUnit(t, s, u, "failed", func(u systemd.Unit) bool { return u.ActiveState == "failed" })
		p := s.Root("/etc/systemd/system/" + u)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if how == "mask" {
			if err := os.Symlink("/dev/null", p); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		env, _ := sdEnv(t, s, func(c *config.Config) {
			c.Checks.ServiceNotRecovering.WorkerUnits = []string{"kubelet.service", u}
		})
		c, err := checks.NewForTest("ServiceNotRecovering", env)
		if err != nil {
			t.Fatal(err)
		}
		want := u + " is failed (exit-code)"
		if how == "remove" {
			want += " (" + u + " is not installed)"
		}
		if r := snrProbe(t, c); r.Status != report.StatusTrue || r.Reason != "UnitFailed" || r.Message != want {
			t.Errorf("%s: %s %s %q, want True UnitFailed %q", how, r.Status, r.Reason, r.Message, want)
		}
	}
}
