//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// The shipped binary under its own unit in a real systemd: the files of
// its control socket and status socket removed while it runs (rm -rf
// /run/autopilot-health/*, then the directory itself) are bound again by
// the daemon: `autopilot-health status` answers, `systemctl reload`
// (ExecReload=, over the control socket) works, the main process is the
// same, the journal says each once. While they cannot be bound (a start's
// lock of the directory held, as a daemon starting holds it), status,
// tamper clear and the unit's reload say the daemon runs, with its pid
// and the unit's state (systemd over D-Bus), never "not running"; the
// next removal there binds them again.
func TestSocketsRemovedUnderSystemdAreBoundAgain(t *testing.T) {
	harness.Parallel(t, 1)
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	s, usr := shippedUnitSystemd(t, "autopilot-health-sockgone-"+harness.Token()+"-", nil, false)
	ctx := context.Background()
	etc := s.Root("/etc/autopilot-health")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	port := freeTCPPort(t)
	if err := os.WriteFile(filepath.Join(etc, "config.toml"), []byte(diskUsageOnly("sockgone", port, 99)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("starting autopilot-health.service: %v", err)
	}
	mainPID := func() uint32 {
		sp, err := s.Properties(ctx, "autopilot-health.service", "Service")
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := sp["MainPID"].Value().(uint32)
		return pid
	}
	pid := mainPID()

	// The CLI on the host, with the namespace's paths as the host sees
	// them, and its system bus.
	run := s.Root("/run/autopilot-health")
	control, status := filepath.Join(run, "control.sock"), filepath.Join(run, "status.sock")
	state := s.Root("/var/lib/autopilot-health")
	cliCfg := filepath.Join(t.TempDir(), "cli.toml")
	if err := os.WriteFile(cliCfg, fmt.Appendf(nil, "state_dir = %q\ncontrol_socket = %q\n[status]\nsocket = %q\n", state, control, status), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := func(args ...string) (int, string) {
		cmd := exec.Command(filepath.Join(usr, "bin", "autopilot-health"), args...)
		cmd.Env = append(os.Environ(), "DBUS_SYSTEM_BUS_ADDRESS=unix:path="+s.BusSocket())
		out, err := cmd.CombinedOutput()
		return exitCode(err), string(out)
	}
	statusAnswers := func(what string) {
		t.Helper()
		eventually(t, 20*time.Second, what, func() (bool, string) {
			code, out := cli("status", "--config", cliCfg)
			return (code == 0 || code == 1) && strings.Contains(out, fmt.Sprintf(", pid %d, running since", pid)), fmt.Sprintf("exit %d: %s", code, lastBytes(out, 600))
		})
	}
	reloads := func(what string) {
		t.Helper()
		if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
			t.Fatalf("systemctl reload %s: %v\n%s", what, err, lastBytes(s.Journal("autopilot-health.service"), 2000))
		}
	}
	journalCount := func(sub string, n int) {
		t.Helper()
		eventually(t, 10*time.Second, fmt.Sprintf("%d journal lines with %q", n, sub), func() (bool, string) {
			j := s.Journal("autopilot-health.service")
			return strings.Count(j, sub) >= n, lastBytes(j, 1500)
		})
	}
	statusAnswers("status answering after the start")
	reloads("after the start")

	// rm -rf /run/autopilot-health/*
	entries, err := os.ReadDir(run)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		os.RemoveAll(filepath.Join(run, e.Name()))
	}
	statusAnswers("status answering again after the sockets' files were removed")
	reloads("after the sockets' files were removed")
	journalCount("the control socket's file was removed while the daemon ran; bound it again", 1)
	journalCount("the status socket's file was removed while the daemon ran; bound it again", 1)

	// rm -rf /run/autopilot-health: the daemon may bind a socket in it
	// before the directory goes (rm then fails on it), or make it again.
	rmErr := os.RemoveAll(run)
	statusAnswers("status answering again after the directory was removed")
	// Where the removal went through (the daemon did not bind in it
	// first), the daemon made the directory again under the unit's
	// sandbox (ProtectSystem=strict), 0700 (2026-12-07: removed, then
	// made again, in each of the runs looked at).
	if fi, err := os.Stat(run); rmErr == nil && (err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700) {
		t.Errorf("after its removal %s is %v, %v; want a directory made again, 0700", run, fi, err)
	} else {
		t.Logf("rm -rf %s: %v; then a directory, %v", run, rmErr, fi.Mode())
	}
	reloads("after the directory was removed")

	// Not bound while a start holds the directory's lock: the commands say
	// the daemon runs.
	dir, err := os.Open(run)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if err := syscall.Flock(int(dir.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	notBound := strings.Count(s.Journal("autopilot-health.service"), "is not bound again")
	for _, p := range []string{control, status} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	journalCount("is not bound again", notBound+2)
	code, out := cli("status", "--config", cliCfg)
	if want := "autopilot-health.service is active and its daemon runs (pid "; code != 2 || !strings.Contains(out, want) || !strings.Contains(out, "its status socket "+status+" (nor the default /run/autopilot-health/status.sock) is gone") || strings.Contains(out, "not running") {
		t.Errorf("status with its socket gone: exit %d, %q; want 2 and %q", code, out, want)
	}
	code, out = cli("tamper", "clear", "--config", cliCfg, "--socket", control, "--reason", "test")
	if want := "autopilot-health.service is active and its daemon runs (pid "; code != 2 || !strings.Contains(out, want) || !strings.Contains(out, "its control socket "+control+" is gone") {
		t.Errorf("tamper clear with its socket gone: exit %d, %q; want 2 and %q", code, out, want)
	}
	// ExecReload= fails, and says why in the journal.
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); err == nil {
		t.Errorf("systemctl reload with the control socket gone succeeded")
	}
	journalCount("autopilot-health reload: autopilot-health.service is reloading and its daemon runs (pid ", 1)

	// The lock let go, the next removal of a file there binds them again.
	dir.Close()
	if err := os.WriteFile(control, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(control); err != nil {
		t.Fatal(err)
	}
	statusAnswers("status answering again once the lock was let go")
	reloads("once the lock was let go")
	if p := mainPID(); p != pid {
		t.Errorf("the unit's main process is %d, was %d: the daemon restarted", p, pid)
	}
}
