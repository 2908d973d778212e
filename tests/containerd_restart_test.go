//go:build integration

package tests

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// Debian's containerd restarted (systemctl restart) between two probes of
// ContainerRuntimeUnhealthy (the CRI client of checks/cri.go, its HTTP/2
// connection kept from the probe before): the next probe is no failure, and the daemon
// restarts nothing. A probe that meets the new containerd before its CRI
// plugin is up is Unknown NoData (README), never True.
func TestRealContainerdRestartedBetweenTwoProbes(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	needContainerd(t)
	dir, err := os.MkdirTemp("", "autopilot-health-containerd-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	s, err := harness.StartSystemd(dir, containerdDropIn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(); os.RemoveAll(dir) })
	first := startContainerd(t, s)
	socket := s.Root("/run/containerd/containerd.sock")
	env, store := sdEnv(t, s, func(c *config.Config) {
		c.Checks.ContainerRuntimeUnhealthy.Socket = socket
		c.Checks.ContainerRuntimeUnhealthy.Timeout = dur(5 * time.Second)
	})
	r, err := checks.NewRunner(env, checks.Options{Store: store, Only: []string{"ContainerRuntimeUnhealthy"}})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Repair.Wait()
	probe := func(what string) report.Condition {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.RunOnce(ctx)
		c, _ := store.Get("ContainerRuntimeUnhealthy")
		if c.Status == report.StatusTrue {
			t.Errorf("%s: ContainerRuntimeUnhealthy True: %s %s", what, c.Reason, c.Message)
		}
		return c
	}
	// Healthy, the connection kept.
	eventually(t, 15*time.Second, "ContainerRuntimeUnhealthy=False", func() (bool, string) {
		c := probe("before")
		return c.Status == report.StatusFalse, c.Message
	})
	previous := first
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.RestartUnit(ctx, "containerd.service")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		u := waitUnit(t, s, "containerd.service", "containerd back", func(u systemd.Unit) bool {
			return active(u) && u.Invocation != previous.Invocation
		})
		previous = u
		c := probe("the probe after a restart")
		t.Logf("restart %d: the next probe %s %s %q", i+1, c.Status, c.Reason, c.Message)
		eventually(t, 15*time.Second, "ContainerRuntimeUnhealthy=False after the restart", func() (bool, string) {
			c := probe("after a restart")
			return c.Status == report.StatusFalse, c.Message
		})
	}
	if n := env.Repair.Status("containerd.service").Repairs; n != 0 {
		t.Errorf("the daemon restarted containerd %d times over three restarts of its own", n)
	}
}
