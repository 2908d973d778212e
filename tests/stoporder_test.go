//go:build integration

package tests

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// The daemon's stop (systemctl stop or restart, a package's remove or
// upgrade) ends before its privileged helper's begins: the helper is
// PartOf= the daemon, and without the daemon's
// After=autopilot-health-privileged.service systemd stops both at once. A
// helper request in flight (an LVM report, an NVMe read, a tamper scan)
// then fails while the daemon still runs: the check records CheckFailed
// (Unknown) until its own SIGTERM, the shutdown hold does not cover it (the
// system is not shutting down), and its last write takes that to the Node
// and the state file, for the new daemon to start from. Shown from
// systemd's own timestamps, on a stop and on a restart: the helper left
// active only after the daemon's main process had exited (stop) or the
// daemon was inactive (restart). Without the line, the helper's stop began
// beside the daemon's, before the daemon exited.
func TestDaemonStopsBeforeItsHelper(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	dir := t.TempDir()
	usr := filepath.Join(dir, "usr")
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), nil, harness.Options{KeepSyslog: true, Usr: usr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	defer func() {
		if t.Failed() {
			t.Logf("journal of the namespace:\n%s", lastBytes(s.Journal("autopilot-health.service", "autopilot-health-privileged.service"), 8000))
		}
	}()
	// The LVM test's configuration: the defaults, an API server that is
	// down, no repairs of units this namespace lacks.
	if err := writeFile(s.Root("/etc/autopilot-health/config.toml"), fmt.Appendf(nil, lvmUnitConfig, freeTCPPort(t))); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(s.Root("/etc/autopilot-health/kubeconfig"), fmt.Appendf(nil, deadAPIKubeconfig, freeTCPPort(t))); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.StartUnit(ctx, "systemd-journald.service"); err != nil {
		t.Fatalf("starting journald: %v", err)
	}
	const daemonUnit, helperUnit = "autopilot-health.service", "autopilot-health-privileged.service"
	// Stopped, neither is referenced by a running unit: systemd would
	// unload both, and a unit loaded again has no timestamps.
	refUnits(ctx, t, s, daemonUnit, helperUnit)
	if err := s.StartUnit(ctx, daemonUnit); err != nil {
		t.Fatalf("starting %s: %v", daemonUnit, err)
	}

	stamp := func(unit, iface, name string) uint64 {
		t.Helper()
		p, err := s.Properties(ctx, unit, iface)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := p[name].Value().(uint64)
		if !ok {
			t.Fatalf("%s: %s is %v, not a timestamp", unit, name, p[name])
		}
		return v
	}
	us := func(d uint64) time.Duration { return time.Duration(d) * time.Microsecond }

	for _, op := range []string{"stop", "restart"} {
		// The helper runs: the daemon's first request (the kernel log's
		// descriptor) started it through its socket.
		helper := waitUnit(t, s, helperUnit, "the helper started by the daemon's requests", active)
		daemonBefore := waitUnit(t, s, daemonUnit, "the daemon running", active)
		switch op {
		case "stop":
			if err := s.StopUnit(ctx, daemonUnit); err != nil {
				t.Fatalf("stopping %s: %v", daemonUnit, err)
			}
		case "restart":
			if err := s.RestartUnit(ctx, daemonUnit); err != nil {
				t.Fatalf("restarting %s: %v", daemonUnit, err)
			}
		}
		// The helper's stop job is queued by PartOf=; it may still run when
		// the daemon's job has ended.
		waitUnit(t, s, helperUnit, "the helper stopped (PartOf=) by the daemon's "+op, func(u systemd.Unit) bool {
			return u.Invocation != helper.Invocation || u.ActiveState == "inactive"
		})
		helperExit := stamp(helperUnit, "Unit", "ActiveExitTimestampMonotonic")
		if helperExit == 0 {
			t.Fatalf("%s: %s never left active", op, helperUnit)
		}
		var daemonDone uint64
		var what string
		switch op {
		case "stop":
			// Its main process's exit: a restart's new one resets it.
			daemonDone, what = stamp(daemonUnit, "Service", "ExecMainExitTimestampMonotonic"), "its main process exited"
			if u, _ := s.Bus.Unit(ctx, daemonUnit); u.ActiveState != "inactive" || u.Result != "success" {
				t.Errorf("after its stop: %+v", u)
			}
		case "restart":
			daemonDone, what = stamp(daemonUnit, "Unit", "InactiveEnterTimestampMonotonic"), "it was inactive"
			daemonAfter := waitUnit(t, s, daemonUnit, "the daemon restarted", active)
			if daemonAfter.Invocation == daemonBefore.Invocation {
				t.Fatalf("restart: the daemon's invocation is still %s", daemonAfter.Invocation)
			}
		}
		if daemonDone == 0 {
			t.Fatalf("%s: %s has no timestamp of when %s", op, daemonUnit, what)
		}
		if helperExit < daemonDone {
			t.Errorf("%s: the helper's stop began %s before the daemon's ended (%s): a helper request in flight fails while the daemon still runs and records it",
				op, us(daemonDone-helperExit), what)
		} else {
			t.Logf("%s: the helper's stop began %s after %s", op, us(helperExit-daemonDone), what)
		}
		if op == "stop" {
			// Start it again for the restart: its start job's requests
			// start the helper again.
			if err := s.StartUnit(ctx, daemonUnit); err != nil {
				t.Fatalf("starting %s again: %v", daemonUnit, err)
			}
		}
	}
}

// refUnits holds a reference to each unit over a bus connection of the
// test's (closed at its end): systemd unloads a stopped unit nothing
// references, and one loaded again reads as never run (no timestamps, no
// invocation, Result "success"), so a check of how it stopped would pass
// whatever happened.
func refUnits(ctx context.Context, t *testing.T, s *harness.Systemd, units ...string) {
	t.Helper()
	bus, err := systemd.DialBus(ctx, s.BusSocket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bus.Close() })
	for _, u := range units {
		var path godbus.ObjectPath
		if err := bus.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").CallWithContext(ctx, "org.freedesktop.systemd1.Manager.LoadUnit", 0, u).Store(&path); err != nil {
			t.Fatalf("LoadUnit %s: %v", u, err)
		}
		if err := bus.Object("org.freedesktop.systemd1", path).CallWithContext(ctx, "org.freedesktop.systemd1.Unit.Ref", 0).Err; err != nil {
			t.Fatalf("Ref %s: %v", u, err)
		}
	}
}
