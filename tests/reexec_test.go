//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/systemd"
)

// reexec makes the namespaced systemd re-execute itself (`systemctl
// daemon-reexec`, which every upgrade of Debian's systemd package runs). It
// does not answer: it leaves the bus and comes back.
func reexec(t *testing.T, socket string) {
	t.Helper()
	c, err := systemd.DialBus(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	call := c.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").Call("org.freedesktop.systemd1.Manager.Reexecute", 0)
	t.Logf("Reexecute: %v", call.Err)
}

// systemd re-executes while the daemon reads units: a read it had been sent
// and left unanswered (dbus-daemon's NoReply, "Message recipient
// disconnected from message bus without replying") is made again, and
// answered once systemd is back. Before, that read failed, and the check
// that made it (NodeServiceDown, ServiceNotRecovering, the repairer's read)
// went Unknown / CheckFailed for a run at each daemon-reexec: a flap of
// the condition on every node whose systemd was upgraded. Readers on
// connections of their own, reading back to back, each have a read in
// flight when systemd leaves.
func TestReadsAcrossSystemdReexec(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const readers = 4
	var mu sync.Mutex
	var errs []string
	reads := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range readers {
		bus := systemd.NewDBusAt(s.BusSocket())
		defer bus.Close()
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := systemd.UnitsOf(rctx, bus, "kubelet.service", "syself-tunnel-agent.service")
				cancel()
				mu.Lock()
				reads++
				if err != nil {
					errs = append(errs, fmt.Sprintf("reader %d: %v", i, err))
				}
				mu.Unlock()
			}
		})
	}
	for range 2 {
		time.Sleep(200 * time.Millisecond) // the readers reading before the re-exec
		before := waitUnit(t, s, "kubelet.service", "kubelet up", active)
		reexec(t, s.BusSocket())
		// systemd is back: its answers carry the unit it kept across the
		// re-exec.
		waitUnit(t, s, "kubelet.service", "kubelet, after the re-exec", func(u systemd.Unit) bool { return u.Invocation == before.Invocation })
	}
	time.Sleep(200 * time.Millisecond) // the readers reading after it
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d reads failed across two re-execs of systemd, e.g. %s", len(errs), reads, errs[0])
	}
}

// systemd re-executes while the repairer's restart job runs (its stop, 2 s):
// the job is kept across the re-exec, its JobRemoved comes to the restart's
// connection (on the bus, which stayed), and the restart ends "done" with
// the unit running a new invocation, not at the 5 min the repairer waits
// for a job, which would have held the next restart off as "in progress".
func TestRepairAcrossSystemdReexec(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	if err := s.AddUnit(ctx, "reexec.service", "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\nExecStop=/bin/sleep 2\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "reexec.service"); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, "reexec.service")
	before := waitUnit(t, s, "reexec.service", "up", active)
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	if res, msg := r.Repair(ctx, "reexec.service", 0, "probe failed"); res != checks.RepairRestarted {
		t.Fatalf("repair: %s %q", res, msg)
	}
	waitUnit(t, s, "reexec.service", "its restart job stopping it", func(u systemd.Unit) bool { return u.JobType == "restart" && u.ActiveState == "deactivating" })
	reexec(t, s.BusSocket())
	done := make(chan struct{})
	go func() { r.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the restart has not ended 20 s after the re-exec: %+v", r.Status("reexec.service"))
	}
	if st := r.Status("reexec.service"); st.LastResult != "done" {
		t.Errorf("restart across the re-exec: %+v, want done", st)
	}
	if u, err := s.Bus.Unit(ctx, "reexec.service"); err != nil || !active(u) || u.Invocation == before.Invocation {
		t.Errorf("after the restart: %+v, %v; want a new invocation, running", u, err)
	}
}

// An operator stops a unit for maintenance (`systemctl stop kubelet`) that
// does not stop within its TimeoutStopSec (a hung kubelet, the very case
// an operator steps in for): systemd kills it, and the stop leaves it
// failed (result "timeout"), not inactive, and does not restart it. The
// probes that fail meanwhile find the stop job ("systemd is stopping"); once
// it ended failed the unit is as stopped as an inactive one: not restarted
// ("not restarted: ... was stopped"), and it stays down until someone starts
// it. Before, the next failed probe restarted it: the daemon fought the
// operator.
func TestRepairLeavesAStopThatEndedFailedAlone(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	const unit = "hardstop.service"
	if err := s.AddUnit(ctx, unit, "[Unit]\nDefaultDependencies=no\n[Service]\nExecStartPre=/bin/rm -f /run/hardstop-trapped\nExecStart=/bin/sh -c 'trap \"\" TERM; touch /run/hardstop-trapped; while :; do sleep 0.2; done'\nTimeoutStopSec=1\nRestart=always\nRestartSec=100ms\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	defer s.StopUnit(ctx, unit)
	waitUnit(t, s, unit, "up", active)
	// Its shell ignores SIGTERM only once it ran the trap: a stop before
	// that stops it cleanly.
	for deadline := time.Now().Add(15 * time.Second); ; {
		if _, err := os.Stat(s.Root("/run/hardstop-trapped")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unit's shell did not set its trap")
		}
		time.Sleep(20 * time.Millisecond) // polling a file the unit writes
	}
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	stopped := make(chan error, 1)
	go func() { stopped <- s.StopUnit(ctx, unit) }()
	waitUnit(t, s, unit, "the operator's stop job", func(u systemd.Unit) bool { return u.JobType == "stop" })
	// A probe fails while the stop runs (every 10 s for kubelet).
	if res, msg := r.Repair(ctx, unit, 0, "probe failed"); res != checks.RepairUnitStopping {
		t.Errorf("repair while the operator's stop runs: %s %q", res, msg)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	u := waitUnit(t, s, unit, "the stop ended", func(u systemd.Unit) bool { return u.Job == 0 })
	if u.ActiveState != "failed" || u.Result != "timeout" {
		t.Fatalf("a stop that timed out: %+v, want failed with result timeout", u)
	}
	res, msg := r.Repair(ctx, unit, 0, "probe failed")
	r.Wait()
	if res != checks.RepairStopped || !strings.Contains(msg, "was stopped") {
		t.Errorf("repair of a unit the operator stopped that ended failed: %s %q, want %s", res, msg, checks.RepairStopped)
	}
	if after, err := s.Bus.Unit(ctx, unit); err != nil || after.Invocation != u.Invocation || after.ActiveState != "failed" {
		t.Errorf("after the repair: %+v, %v; want it left failed at %s", after, err, u.Invocation)
	}
	// Someone starts it again, and it fails on its own later: the stop is
	// over, and a failed unit at a new invocation is the repairer's.
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, unit, "started again", active)
	if res, msg := r.Repair(ctx, unit, 0, "probe failed"); res != checks.RepairRestarted {
		t.Errorf("repair of a unit started again since the stop: %s %q", res, msg)
	}
	r.Wait()
}
