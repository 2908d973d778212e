//go:build integration

package tests

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// TestWatchdogAbortIsRestarted: systemd's watchdog stops a stuck daemon with
// SIGABRT (WatchdogSignal=), and the unit's Restart=always is to start it
// again; only exit 2, a configuration file that run refuses, is not
// restarted (RestartPreventExitStatus=2). The Go runtime ends a process on
// SIGABRT, and on a fatal error (a panic no one recovers, concurrent map
// writes, out of memory), with a goroutine dump and, by default, exit status
// 2: the same status. Here the main process gets SIGABRT, as the watchdog
// sends it, under the shipped units in a real systemd 252: the daemon is
// started again and becomes ready. Before, the unit stayed failed with
// status=2 until the configuration file changed: a stuck or crashed daemon
// left the node without its health daemon.
func TestWatchdogAbortIsRestarted(t *testing.T) {
	harness.Parallel(t, 1)
	const unit = "autopilot-health.service"
	s := daemonNamespace(t, "abort", nil, fmt.Sprintf(goodConfig, freeTCPPort(t)), unit)
	ctx := context.Background()
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	up := waitUnitFor(t, s, unit, time.Minute, "active", active)
	if err := s.KillMain(ctx, unit, int32(syscall.SIGABRT)); err != nil {
		t.Fatal(err)
	}
	// Out of active/running first: the abort has ended the process.
	waitUnitFor(t, s, unit, 30*time.Second, "the aborted daemon gone", func(u systemd.Unit) bool {
		return !active(u) || u.Invocation != up.Invocation
	})
	var last systemd.Unit
	eventually(t, 30*time.Second, "started again after the abort", func() (bool, string) {
		u, err := s.Bus.Unit(ctx, unit)
		if err != nil {
			return false, err.Error()
		}
		last = u
		code, status := mainExit(ctx, s, unit)
		return active(u) && u.Invocation != up.Invocation && u.NRestarts > up.NRestarts,
			fmt.Sprintf("%s/%s result %s NRestarts=%d, last exit code %d status %d", u.ActiveState, u.SubState, u.Result, u.NRestarts, code, status)
	})
	t.Logf("restarted after SIGABRT: NRestarts=%d", last.NRestarts)
}
