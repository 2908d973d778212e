//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/tests/harness"
)

// badConfigs are files `run` refuses, each with its own key, so that the
// journal shows which one a refusal was for.
var badConfigs = []string{
	"# written by tests/badconfig_test.go\n[checks.DiskUsageHigh]\nspace_percnt = 80\n",
	"# written by tests/badconfig_test.go\n[checks.DiskUsageHigh]\nspace_prcent = 80\n",
}

// goodConfig is a file the daemon runs on: the defaults but a loopback
// metrics port of the test's own and no first-run spread.
const goodConfig = "# written by tests/badconfig_test.go\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n\n[runner]\nfirst_run_spread = \"0s\"\n"

// cpuTicks is the user+system CPU time of a host process, in clock ticks.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	k, _ := strconv.ParseInt(f[12], 10, 64)
	return u + k
}

// cgroupUsec is usage_usec of a cgroup's cpu.stat (every process in it and
// below, the exited ones included).
func cgroupUsec(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// TestRefusedConfigurationDoesNotSpin: a configuration file that `run`
// refuses, under the shipped units in a real systemd 252, as the Debian
// package starts the daemon (postinst: start autopilot-health.service) and
// as the system extension does (its multi-user.target drop-in, Upholds=,
// at boot):
//   - the refusal is in the journal once per change of the file, not every
//     RestartSec (5 s): over a window of 12 s, no other start;
//   - `systemctl status` is truthful: the unit is failed, status=2, not
//     active (running) nor activating (auto-restart);
//   - a file changed again, still refused, is read again (one more
//     refusal) within seconds, by nobody's systemctl;
//   - the fixed file starts the daemon within seconds: the unit is active
//     (READY=1) after its first pass;
//   - a crash (SIGKILL of the main process) is still restarted.
func TestRefusedConfigurationDoesNotSpin(t *testing.T) {
	harness.Parallel(t, 2)
	// The two run at once, each in its own namespace (its own systemd,
	// journal and metrics port): one after the other they took 54 s, most
	// of it each one's 12 s window, which does not compete for the CPU.
	// (t.Run from goroutines, not t.Parallel: -parallel is GOMAXPROCS.)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, how := range []string{"deb", "sysext"} {
		wg.Go(func() {
			t.Run(how, func(t *testing.T) { refusedConfiguration(t, how) })
		})
	}
}

func refusedConfiguration(t *testing.T, how string) {
	units := map[string]string{}
	if how == "sysext" {
		// multi-user.target reached at boot; the extension's drop-in
		// comes with the merge, below.
		units["test.target.d/10-boot.conf"] = "[Unit]\nWants=multi-user.target\n"
	}
	s := daemonNamespace(t, "badconfig", units, badConfigs[0], "autopilot-health.service", "autopilot-health.path")
	ctx := context.Background()
	cfgPath := s.Root("/etc/autopilot-health/config.toml")
	const unit = "autopilot-health.service"
	refusals := func() int {
		return strings.Count(s.Journal(unit), "refusing to start")
	}
	switch how {
	case "deb":
		// The postinst's deb-systemd-invoke start: the job fails.
		if err := s.StartUnit(ctx, unit); err == nil {
			t.Errorf("the start job of a refused configuration succeeded")
		}
	case "sysext":
		// The merge brings the extension's drop-in (under /etc here: the
		// units laid over /usr are the package's), and the reload after it
		// makes Upholds= start the daemon.
		dropIn, err := harness.RepoFile("packaging/sysext/10-autopilot-health.conf")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.AddUnit(ctx, "multi-user.target.d/10-autopilot-health.conf", string(dropIn)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the first refusal in the journal", func() (bool, string) {
		n := refusals()
		return n >= 1, fmt.Sprint(n, " refusals")
	})

	// The window: no start but the first.
	pid1, cg := cpuTicks(s.PID), cgroupUsec(s.Cgroup(""))
	// BADCONFIG_WINDOW=1m measures a longer one.
	window := 12 * time.Second
	if w, err := time.ParseDuration(os.Getenv("BADCONFIG_WINDOW")); err == nil {
		window = w
	}
	time.Sleep(window) // nothing is to happen: a window of time is the measure
	n := refusals()
	u, err := s.Bus.Unit(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: over %s, %d refusals in the journal, NRestarts=%d, %s/%s; PID 1 used %d ticks, the namespace's cgroup %d µs CPU",
		how, window, n, u.NRestarts, u.ActiveState, u.SubState, cpuTicks(s.PID)-pid1, cgroupUsec(s.Cgroup(""))-cg)
	if n != 1 {
		t.Errorf("%d refusals of one file in the journal, want 1: the unit spins", n)
	}
	sp, err := s.Properties(ctx, unit, "Service")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := sp["ExecMainStatus"].Value().(int32); u.ActiveState != "failed" || u.Result != "exit-code" || st != 2 {
		t.Errorf("the unit with a refused configuration: %s/%s result %s status %d, want failed, exit-code, 2", u.ActiveState, u.SubState, u.Result, st)
	}
	if j := s.Journal(unit); !strings.Contains(j, "space_percnt") {
		t.Errorf("the refusal does not name the key:\n%s", lastBytes(j, 3000))
	}

	// Changed, still refused: read again, once, without a systemctl.
	if err := os.WriteFile(cfgPath, []byte(badConfigs[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the changed file read again", func() (bool, string) {
		n := refusals()
		return n == 2, fmt.Sprint(n, " refusals")
	})

	// Fixed, once systemd has the refusal's exit (the unit failed): the
	// daemon starts within seconds, and is ready after its first pass. A
	// fix written while the refusing process is still exiting, after its
	// last look at the file, is not seen (README, "Under systemd"): the
	// path unit's start of a unit not yet failed is a no-op; the daemon's
	// own look before its exit covers the rest of its run
	// (TestRunRereadsAFileChangedWhileRefusing).
	waitUnitFor(t, s, unit, 10*time.Second, "failed on the changed file", func(u systemd.Unit) bool { return u.ActiveState == "failed" })
	written := time.Now()
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, goodConfig, freeTCPPort(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the daemon started on the fixed file", func() (bool, string) {
		j := s.Journal(unit)
		return strings.Contains(j, `msg=starting`), lastBytes(j, 300)
	})
	t.Logf("%s: the fixed file started the daemon %s after it was written", how, time.Since(written).Round(time.Millisecond))
	up := waitUnitFor(t, s, unit, 2*time.Minute, "active on the fixed file", active)
	if n := refusals(); n != 2 {
		t.Errorf("%d refusals after the fix, want 2", n)
	}

	// A crash is restarted.
	if err := s.KillMain(ctx, unit, 9); err != nil {
		t.Fatal(err)
	}
	waitUnitFor(t, s, unit, 2*time.Minute, "restarted after a crash", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != up.Invocation && u.NRestarts > up.NRestarts
	})
}

// waitUnitFor is waitUnit with a limit of the caller's.
func waitUnitFor(t testing.TB, s *harness.Systemd, name string, limit time.Duration, what string, ok func(systemd.Unit) bool) systemd.Unit {
	t.Helper()
	var u systemd.Unit
	eventually(t, limit, what, func() (bool, string) {
		var err error
		u, err = s.Bus.Unit(context.Background(), name)
		return err == nil && ok(u), fmt.Sprintf("%+v %v", u, err)
	})
	return u
}

// daemonNamespace boots a real systemd in fresh namespaces with the shipped
// daemon installed under /usr (harness.InstallDaemon), the getty units
// stubbed and units added (name -> content), starts journald, and writes
// config (if not "") to /etc/autopilot-health/config.toml. On a failure the
// journal of the units named in journalOf is logged. name tells the
// namespace's temporary directory. Its PID 1 keeps CAP_SYSLOG, as a node's
// does: the shipped helper opens /dev/kmsg with it (dmesg_restrict=1), and
// without it the kernel log reader could not open the log and was stuck
// 40 s in, /healthz 503 and the watchdog's pings stopped, in every test
// with the default [kmsg] (TestShippedUnitReadsTheKernelLog).
func daemonNamespace(t *testing.T, name string, units map[string]string, config string, journalOf ...string) *harness.Systemd {
	t.Helper()
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	dir, err := os.MkdirTemp("", "autopilot-health-"+name+"-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	usr := filepath.Join(dir, "usr")
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	all := map[string]string{"getty.target": "", "console-getty.service": ""}
	for k, v := range units {
		all[k] = v
	}
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), all, harness.Options{Usr: usr, KeepSyslog: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal:\n%s", lastBytes(s.Journal(journalOf...), 8000))
			t.Logf("console:\n%s", s.Console(4000))
		}
	})
	if err := s.StartUnit(context.Background(), "systemd-journald.service"); err != nil {
		t.Fatal(err)
	}
	if config != "" {
		cfgPath := s.Root("/etc/autopilot-health/config.toml")
		if err := os.MkdirAll(filepath.Dir(cfgPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return s
}
