//go:build integration

package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// A restart job is two halves: systemd stops the unit, and once it is
// stopped (inactive, or failed when the stop did not end cleanly) the job
// turns into a start job (job_finish_and_invalidate), which runs from
// systemd's run queue, an event source of its own: a read can be answered
// in between, and reads the unit inactive/dead or failed/failed with a
// start job. That start waits for the units it is ordered after that have
// a job of their own: restarted with a unit PartOf= it and ordered after
// that unit, whose start takes a second (ExecStartPre=/bin/sleep 1), the
// unit stays so for that second (systemctl restart containerd kubelet: kubelet,
// After=containerd.service, waits for containerd's start). Each of the
// daemon's readers reads it then: the unit is coming back, and none takes
// it for down, failed or stopped. Before, NodeServiceDown was True ("is
// not active (inactive/dead)"), ServiceNotRecovering True ("is failed
// (exit-code)": on a cloud pool, reboot then replace at 60 s), and the
// repairer took a unit whose restart's stop ended failed for one someone
// stopped ("not restarted: ... was stopped"), or, for a service that can
// notify, restarted it again (a repair counted towards RepairNotHelping).
func TestARestartBetweenItsHalvesIsComingBack(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const dep = "midrestart-dep.service"
	for _, tc := range []struct {
		name, extra string
		state       string // between the halves
	}{
		{"midrestart-clean.service", "ExecStop=/bin/sleep 0.3\n", "inactive"},
		{"midrestart-stopfails.service", "ExecStop=/bin/sh -c 'sleep 0.3; exit 1'\n", "failed"},
		{"midrestart-notify.service", "ExecStop=/bin/sh -c 'sleep 0.3; exit 1'\nNotifyAccess=all\n", "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unit := tc.name
			if err := s.AddUnit(ctx, dep, fmt.Sprintf("[Unit]\nDefaultDependencies=no\nPartOf=%s\n[Service]\nExecStartPre=/bin/sleep 1\nExecStart=/bin/sleep infinity\n", unit)); err != nil {
				t.Fatal(err)
			}
			if err := s.AddUnit(ctx, unit, fmt.Sprintf("[Unit]\nDefaultDependencies=no\nStartLimitIntervalSec=0\nWants=%s\nAfter=%s\n[Service]\nExecStart=/bin/sleep infinity\n%s", dep, dep, tc.extra)); err != nil {
				t.Fatal(err)
			}
			defer s.Bus.ResetFailed(ctx, unit)
			defer s.StopUnit(ctx, dep)
			defer s.StopUnit(ctx, unit)
			if err := s.StartUnit(ctx, unit); err != nil {
				t.Fatal(err)
			}
			waitUnit(t, s, unit, "running", active)

			env, _ := sdEnv(t, s, func(c *config.Config) {
				c.Checks.NodeServiceDown.WorkerUnits = []string{unit}
				c.Checks.ServiceNotRecovering.WorkerUnits = []string{unit}
			})
			nsd, err := checks.NewForTest("NodeServiceDown", env)
			if err != nil {
				t.Fatal(err)
			}
			restarted := make(chan error, 1)
			go func() { restarted <- s.RestartUnit(ctx, unit) }() // systemctl restart
			// Its stop half (ExecStop= takes 0.3 s): stopping to come back.
			u := waitUnit(t, s, unit, "the stop half", func(u systemd.Unit) bool { return u.ActiveState == "deactivating" && u.JobType == "restart" })
			if r, err := nsd.Probe(ctx); err != nil || r.Status == report.StatusTrue {
				t.Errorf("NodeServiceDown, read in the stop half of its restart (%s/%s, %s job): %s %s %q (%v), want not True: it is coming back", u.ActiveState, u.SubState, u.JobType, r.Status, r.Reason, r.Message, err)
			}
			between := func(u systemd.Unit) bool { return u.ActiveState == tc.state && u.JobType == "start" }
			u = waitUnit(t, s, unit, "the stop half done, the start half waiting", between)
			t.Logf("%s between the halves of its restart: %s/%s, result %s, job %d %s", unit, u.ActiveState, u.SubState, u.Result, u.Job, u.JobType)

			for _, check := range []string{"NodeServiceDown", "ServiceNotRecovering"} {
				c, err := checks.NewForTest(check, env)
				if err != nil {
					t.Fatal(err)
				}
				r, err := c.Probe(ctx)
				if err != nil || r.Status == report.StatusTrue {
					t.Errorf("%s, read between the halves of its restart: %s %s %q (%v), want not True: it is coming back", check, r.Status, r.Reason, r.Message, err)
				}
			}
			res, msg := env.Repair.Repair(ctx, unit, time.Millisecond, "probe failed")
			env.Repair.Wait()
			if res != checks.RepairStarting {
				t.Errorf("repair, read between the halves of its restart: %s %q, want %s: systemd is starting it", res, msg, checks.RepairStarting)
			}
			// The reads above were all made between the halves.
			if u, err := s.Bus.Unit(ctx, unit); err != nil || !between(u) {
				t.Fatalf("the start half ran before the probes ended: %+v (%v)", u, err)
			}
			if err := <-restarted; err != nil {
				t.Fatalf("the restart: %v", err)
			}
			waitUnit(t, s, unit, "running again", active)
		})
	}
}
