//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// badHelperDropIn is an operator's drop-in for the helper that names a
// flag the helper does not have (--lvmm for --lvm).
const badHelperDropIn = "[Service]\nExecStart=\nExecStart=/usr/lib/autopilot-health/autopilot-health-privileged --lvmm=/usr/sbin/lvm\n"

// TestHelperRefusedFlagDoesNotSpin: an operator's drop-in that gives the
// privileged helper a flag it does not have, under the shipped units in a
// real systemd 252. The helper refuses it (exit 2) and:
//   - is not restarted every RestartSec (1 s) for ever: over a window, the
//     refusal is in the journal once per request of the daemon, the unit
//     failed with status 2 (what `systemctl status` shows), NRestarts 0;
//   - its socket is still listening (not failed on its trigger limit): the
//     daemon's next request starts it again;
//   - each request of the daemon is answered at once with the refusal and
//     where to read it, not left to time out;
//   - the drop-in fixed (daemon-reload), the next request is served;
//   - a crash of the helper (SIGABRT) is still restarted.
func TestHelperRefusedFlagDoesNotSpin(t *testing.T) {
	harness.Parallel(t, 1)
	const (
		svc  = "autopilot-health-privileged.service"
		sock = "autopilot-health-privileged.socket"
	)
	dropIn := svc + ".d/50-operator.conf"
	s := daemonNamespace(t, "helperflag", map[string]string{dropIn: badHelperDropIn}, "", svc, sock)
	ctx := context.Background()
	if err := s.StartUnit(ctx, sock); err != nil {
		t.Fatal(err)
	}
	c := &privileged.Client{Path: s.Root("/run/autopilot-health-privileged/helper.sock")}
	refusals := func() int { return strings.Count(s.Journal(svc), "flag provided but not defined: -lvmm") }
	ask := func(what string) {
		t.Helper()
		start := time.Now()
		fd, err := c.OpenKmsg(context.Background())
		if err == nil {
			t.Fatalf("%s: the helper with a bad flag served a request (fd %d)", what, fd)
		}
		took := time.Since(start)
		t.Logf("%s: answered in %s: %v", what, took.Round(time.Millisecond), err)
		if !strings.Contains(err.Error(), "refuses") || !strings.Contains(err.Error(), "-lvmm") || !strings.Contains(err.Error(), "journalctl -u "+svc) {
			t.Errorf("%s: the daemon's request failed with %q, want the helper's refusal, its cause and where to read it", what, err)
		}
		if took > 5*time.Second {
			t.Errorf("%s: the refusal took %s to come, want it at once", what, took)
		}
	}
	ask("the first request")
	eventually(t, 10*time.Second, "the first refusal in the helper's journal", func() (bool, string) {
		n := refusals()
		return n >= 1, fmt.Sprint(n, " refusals")
	})

	// The window: nothing starts the helper again but a request.
	time.Sleep(5 * time.Second) // nothing is to happen: a window of time is the measure
	u, err := s.Bus.Unit(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	n := refusals()
	t.Logf("over 5 s after one request: %d refusals in the journal, %s/%s, NRestarts=%d", n, u.ActiveState, u.SubState, u.NRestarts)
	if n != 1 {
		t.Errorf("%d refusals of the helper's flag after one request, want 1: the helper spins", n)
	}
	sp, err := s.Properties(ctx, svc, "Service")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := sp["ExecMainStatus"].Value().(int32); u.ActiveState != "failed" || u.Result != "exit-code" || st != 2 || u.NRestarts != 0 {
		t.Errorf("the helper with a bad flag: %s/%s result %s status %d NRestarts %d, want failed, exit-code, 2, 0", u.ActiveState, u.SubState, u.Result, st, u.NRestarts)
	}
	if su, err := s.Bus.Unit(ctx, sock); err != nil || su.ActiveState != "active" || su.SubState != "listening" {
		t.Errorf("the helper's socket after a refusal: %+v %v, want active/listening", su, err)
	}

	// The next request: started, refused, answered, once more.
	ask("the second request")
	eventually(t, 10*time.Second, "the second refusal in the journal", func() (bool, string) {
		n := refusals()
		return n == 2, fmt.Sprint(n, " refusals")
	})
	waitUnitFor(t, s, svc, 10*time.Second, "failed again", func(u systemd.Unit) bool { return u.ActiveState == "failed" })
	if su, err := s.Bus.Unit(ctx, sock); err != nil || su.ActiveState != "active" || su.SubState != "listening" {
		t.Errorf("the helper's socket after two refusals: %+v %v, want active/listening", su, err)
	}

	// Fixed: the next request is served.
	if err := os.Remove(filepath.Join(s.Units, dropIn)); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DM("/dev/mapper/control").VerityTargets(); err != nil && strings.Contains(err.Error(), "refuses") {
		t.Errorf("the fixed helper still refuses: %v", err)
	}
	up := waitUnitFor(t, s, svc, 10*time.Second, "the fixed helper running", active)

	// A crash is restarted.
	if err := s.KillMain(ctx, svc, 6); err != nil {
		t.Fatal(err)
	}
	waitUnitFor(t, s, svc, 30*time.Second, "the helper restarted after SIGABRT", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != up.Invocation && u.NRestarts > up.NRestarts
	})
}

// TestDaemonWithARefusingHelperRunsOn: the daemon under its shipped unit
// (WatchdogSec shortened to 10 s) with its helper refusing its command line
// (an operator's drop-in with a bad flag), in a real systemd 252. The
// daemon starts and runs on: its kernel log cannot be opened (the helper's
// refusal, no restart of the daemon ends it), which reads Unknown with the
// refusal in the kernel conditions, but the kernel log reader is not stuck,
// so the watchdog does not restart the daemon for it every few minutes, to
// be refused again (before: the reader stuck 40 s after its last beat, a
// SIGABRT with its goroutine dump, a restart, for ever).
func TestDaemonWithARefusingHelperRunsOn(t *testing.T) {
	harness.Parallel(t, 1)
	const (
		unit = "autopilot-health.service"
		svc  = "autopilot-health-privileged.service"
	)
	s := daemonNamespace(t, "helperflagd", map[string]string{
		svc + ".d/50-operator.conf":  badHelperDropIn,
		unit + ".d/50-watchdog.conf": watchdogPingsDropIn,
	}, fmt.Sprintf(goodConfig, freeTCPPort(t)), unit, svc)
	ctx := context.Background()
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	up := waitUnitFor(t, s, unit, 2*time.Minute, "the daemon ready", active)
	statePath := s.Root("/var/lib/autopilot-health/state.json")
	eventually(t, 30*time.Second, "KernelDeadlock Unknown with the helper's refusal in the state file", func() (bool, string) {
		var f stateFile
		b, err := os.ReadFile(statePath)
		if err == nil {
			err = json.Unmarshal(b, &f)
		}
		c := f.get("KernelDeadlock")
		return err == nil && c.Status == "Unknown" && strings.Contains(c.Message, "refuses to start") && strings.Contains(c.Message, "-lvmm"),
			fmt.Sprintf("%+v %v", c, err)
	})
	// The window: the reader would be stuck 40 s after its last beat, and
	// the watchdog fires 10 s later (60 s covers both).
	time.Sleep(60 * time.Second) // nothing is to happen: a window of time is the measure
	u, err := s.Bus.Unit(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	refusals := strings.Count(s.Journal(svc), "flag provided but not defined: -lvmm")
	t.Logf("over 60 s: the daemon %s/%s NRestarts=%d, the helper refused %d requests", u.ActiveState, u.SubState, u.NRestarts, refusals)
	if !active(u) || u.Invocation != up.Invocation || u.NRestarts != 0 {
		t.Errorf("the daemon with a refusing helper: %s/%s NRestarts %d, invocation changed %v; want it running on, not restarted",
			u.ActiveState, u.SubState, u.NRestarts, u.Invocation != up.Invocation)
	}
	if j := s.Journal(unit); strings.Contains(j, "SIGABRT") || strings.Contains(j, "watchdog") {
		t.Errorf("the daemon was aborted:\n%s", lastBytes(j, 3000))
	}
	// The reader's backoff (1 s doubling to 1 min) bounds the requests.
	if refusals > 10 {
		t.Errorf("the helper refused %d requests in about 90 s: the daemon's requests do not back off", refusals)
	}
}
