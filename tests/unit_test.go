//go:build integration

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// daemonUnitConfig is /etc/autopilot-health/config.toml inside: the
// embedded defaults but for what a test cannot wait for, a loopback metrics
// port, a stand-in kubelet, and a kernel log rule for this test's token.
const daemonUnitConfig = `# written by tests/unit_test.go
role = "worker"
gpu = "false"

[metrics]
listen_address = "127.0.0.1:%[1]d"

[runner]
first_run_spread = "0s"

[checks.KubeletUnhealthy]
interval = "1s"
timeout = "1s"
healthz_url = "http://127.0.0.1:%[2]d/healthz"
restart_cooldown = "2s"

[checks.KubeletHeartbeatFailed]
# Runs often enough to read kubelet's journal entries after its repair.
interval = "2s"
timeout = "2s"

[checks.DiskUsageHigh]
# Every filesystem measured is over 1 %%: the message names each one.
space_percent = 1

[checks.NodeTampered]
paths = ["/etc/autopilot-health-test/protected"]
baseline_after = []
settle = "0s"

[kmsg]
# Lines written by the test have facility user.
kernel_only = false
# Only the test's own read-only remount line sets ReadonlyFilesystem (the
# machine-wide ring buffer holds other tests' lines).
disable = ["ReadonlyFilesystem"]

[[kmsg.rules]]
name = "UnitTestToken"
kind = "temp"
reason = "IOError"
pattern = 'autopilot-health unit test %[3]s'

[[kmsg.rules]]
name = "UnitTestReadonly"
kind = "perm"
condition = "ReadonlyFilesystem"
reason = "FilesystemIsReadOnly"
pattern = '^EXT4-fs \(%[3]s\): Remounting filesystem read-only'

[kubernetes]
# An API server that is down: nothing listens on its port.
kubeconfig = "/etc/autopilot-health/kubeconfig"
`

// deadAPIKubeconfig points at a loopback port nothing listens on.
const deadAPIKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: down
  cluster:
    server: https://127.0.0.1:%d
    insecure-skip-tls-verify: true
users:
- name: node
  user:
    token: not-used
contexts:
- name: down
  context: {cluster: down, user: node}
current-context: down
`

// watchdogDropIn shortens only WatchdogSec (2 min in the unit) to 4 s, for
// the tests of the watchdog's abort (a SIGSTOPped daemon restarted within
// seconds): a daemon held off the CPU for about 2 s (WatchdogSec/2, its
// ping's period) misses its ping and is aborted as well, which those
// tests' assertions allow.
const watchdogDropIn = "[Service]\nWatchdogSec=4s\n"

// watchdogPingsDropIn shortens WatchdogSec to 10 s, for the tests that
// watch the pings (every WatchdogSec/2) and hold that the daemon is never
// restarted: 4 s aborted a daemon held off the CPU for 2 s, which two
// busy cores under CI can do to it; 10 s allows 5.
const watchdogPingsDropIn = "[Service]\nWatchdogSec=10s\n"

// freeTCPPort returns a loopback port that is free now, for a unit to
// listen on later.
func freeTCPPort(t testing.TB) int {
	t.Helper()
	p, err := freeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freeLoopbackPort is harness.FreeLoopbackPort.
func freeLoopbackPort() (int, error) { return harness.FreeLoopbackPort() }

// dataDir returns a directory on a disk filesystem (not tmpfs), to be the
// namespace's /data: the repository's tests/.cache, else the temp dir.
func dataDir(t testing.TB) string {
	t.Helper()
	for _, base := range []string{filepath.Join(repoDir(t), "tests", ".cache"), os.TempDir()} {
		if err := os.MkdirAll(base, 0o755); err != nil {
			continue
		}
		var st unix.Statfs_t
		if unix.Statfs(base, &st) != nil || st.Type == unix.TMPFS_MAGIC || st.Type == unix.OVERLAYFS_SUPER_MAGIC {
			continue
		}
		d, err := os.MkdirTemp(base, "data-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	t.Fatal("no directory on a disk filesystem for /data (tests/.cache and the temp dir are tmpfs or overlay)")
	return ""
}

func repoDir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd() // go test runs in the package directory, tests/
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// metricValue finds one series (name and labels exactly as exposed) in a
// Prometheus text page.
func metricValue(page, series string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

type stateFile struct {
	Version    int                `json:"version"`
	BootID     string             `json:"bootID"`
	SavedAt    time.Time          `json:"savedAt"`
	Conditions []report.Condition `json:"conditions"`
}

func (f stateFile) get(ty string) report.Condition {
	for _, c := range f.Conditions {
		if c.Type == ty {
			return c
		}
	}
	return report.Condition{}
}

// eventually polls f every 50 ms for at most limit.
func eventually(t testing.TB, limit time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, last := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting %s for %s; last: %s", limit, what, last)
		}
		time.Sleep(50 * time.Millisecond) // polling the daemon's metrics, state file or unit
	}
}

// The daemon under its own, packaged unit files (units/autopilot-health.service,
// unchanged but for a shorter WatchdogSec, and its privileged helper's
// socket and service), in a real systemd 252 as PID 1: every check that can
// run there works through the units' sandboxes.
//   - READY=1: Type=notify, the start job ends and the unit is active.
//   - the split: the daemon holds no capability, sees no /dev/kmsg and maps
//     only root (PrivateUsers=); the helper, started by its socket, holds
//     the three capabilities and has a network namespace of its own.
//   - /dev/kmsg read (the helper opens it, CAP_SYSLOG kept by PID 1): a line
//     written by the test is read and matched.
//   - the host's filesystems measured despite ProtectSystem=strict: /data, a
//     host directory on a disk filesystem, is in DiskUsageHigh's message.
//   - adjtimex read: ClockNotSynchronized evaluated, not CheckFailed.
//   - D-Bus: unit states read (ServiceNotRecovering, NodeServiceDown) and a
//     failing stand-in kubelet restarted (a new InvocationID).
//   - CRI: Debian's real containerd answers ContainerRuntimeUnhealthy.
//   - state written: state.json parses, holds every condition.
//   - WATCHDOG=1: the unit's WatchdogTimestamp advances, the service is
//     never killed; SIGTERM stops it cleanly.
func TestDaemonUnderItsOwnUnit(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	needContainerd(t)
	if _, err := os.Stat("/usr/bin/journalctl"); err != nil {
		t.Fatal("journalctl missing (apt install systemd)")
	}
	testStart := time.Now()
	dir, err := os.MkdirTemp("", "autopilot-health-unit-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// /usr/bin/autopilot-health and the unit where the package puts them
	// (/lib/systemd/system is /usr/lib/systemd/system on Debian 12), laid
	// over the host's /usr.
	usr := filepath.Join(dir, "usr")
	buildStart := time.Now()
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	if _, err := harness.BuildStandin(filepath.Join(dir, "units", "bin")); err != nil {
		t.Fatal(err)
	}
	t.Logf("daemon and stand-in built in %s", time.Since(buildStart).Round(time.Millisecond))

	kubeletPort, metricsPort := freeTCPPort(t), freeTCPPort(t)
	units := map[string]string{
		"kubelet.service": fmt.Sprintf("[Unit]\nDescription=stand-in kubelet (/healthz)\nDefaultDependencies=no\nStartLimitIntervalSec=0\n\n[Service]\nExecStart=/etc/systemd/system/bin/standin kubelet 127.0.0.1:%d /run/standin/kubelet-broken\nRestart=always\nRestartSec=100ms\n", kubeletPort),
		"autopilot-health.service.d/10-test-watchdog.conf": watchdogPingsDropIn,
	}
	for k, v := range containerdDropIn {
		units[k] = v
	}
	data := dataDir(t)
	start := time.Now()
	s, err := harness.StartSystemdWith(dir, units, harness.Options{KeepSyslog: true, Data: data, Usr: usr})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("namespaced systemd ready in %s (pid %d)", time.Since(start).Round(time.Millisecond), s.PID)
	defer s.Stop()
	defer func() {
		if t.Failed() {
			t.Logf("journal of the namespace (autopilot-health, kubelet, containerd):\n%s", lastBytes(s.Journal("autopilot-health.service", "kubelet.service", "containerd.service"), 20000))
			t.Logf("console of its PID 1:\n%s", s.Console(4000))
		}
	}()
	ctx := context.Background()

	tok := harness.Token()
	cfgPath := s.Root("/etc/autopilot-health/config.toml")
	if err := os.MkdirAll(filepath.Dir(cfgPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(s.Root("/etc/autopilot-health-test/protected"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Root("/etc/autopilot-health-test/protected/10.conf"), []byte("kind: test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another user's 0600 file in their 0700 directory: root's mode bits
	// give no access, the helper's CAP_DAC_READ_SEARCH does (without it the
	// scan fails, NodeTampered is CheckFailed and the change below unseen).
	otherDir := s.Root("/etc/autopilot-health-test/protected/other")
	secret := filepath.Join(otherDir, "secret.conf")
	if err := os.Mkdir(otherDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("token: a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{otherDir, secret} {
		if err := os.Chown(p, 12345, 12345); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, daemonUnitConfig, metricsPort, kubeletPort, tok), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Root("/etc/autopilot-health/kubeconfig"), fmt.Appendf(nil, deadAPIKubeconfig, freeTCPPort(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	// journald first, so containerd's and the daemon's output land in the
	// journal (printed when the test fails).
	if err := s.StartUnit(ctx, "systemd-journald.service"); err != nil {
		t.Fatalf("starting journald: %v", err)
	}
	startContainerd(t, s)
	kubelet := waitUnit(t, s, "kubelet.service", "kubelet up", active)

	// The metrics port is held by another program when the daemon starts:
	// the daemon starts and works without it, says so in its status line,
	// and serves the port once it is free (below).
	squatter, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()

	// READY=1: a Type=notify start job is done only once the daemon sent it.
	start = time.Now()
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("starting autopilot-health.service: %v", err)
	}
	daemonUnit, err := s.Bus.Unit(ctx, "autopilot-health.service")
	if err != nil || !active(daemonUnit) {
		t.Fatalf("after its start job: %+v %v", daemonUnit, err)
	}
	t.Logf("autopilot-health.service active (READY=1) %s after StartUnit", time.Since(start).Round(time.Millisecond))
	up, err := s.Properties(ctx, "autopilot-health.service", "Unit")
	if err != nil {
		t.Fatal(err)
	}
	// Where the package puts it; systemd names it by its /lib path.
	if fp := up["FragmentPath"].Value(); fp != "/usr/lib/systemd/system/autopilot-health.service" && fp != "/lib/systemd/system/autopilot-health.service" {
		t.Errorf("unit loaded from %v", fp)
	}
	if dp, _ := up["DropInPaths"].Value().([]string); len(dp) != 1 || !strings.HasSuffix(dp[0], "10-test-watchdog.conf") {
		t.Errorf("drop-ins: %v (want only the watchdog one)", dp)
	}
	sp, err := s.Properties(ctx, "autopilot-health.service", "Service")
	if err != nil {
		t.Fatal(err)
	}
	if ty := sp["Type"].Value(); ty != "notify" {
		t.Errorf("Type=%v", ty)
	}
	if st, _ := sp["StatusText"].Value().(string); !hasSummary(st) || !strings.Contains(st, "metrics not served: ") || !strings.Contains(st, "address already in use") {
		t.Errorf("STATUS= %q, want the conditions and the metrics port that cannot be bound", st)
	}
	if n, _ := sp["NRestarts"].Value().(uint32); n != 0 {
		t.Errorf("NRestarts=%d with the metrics port taken, want 0 (the daemon works on without it)", n)
	}
	squatter.Close()
	// The daemon: CapabilityBoundingSet= (none), PrivateDevices= (no
	// /dev/kmsg in its /dev), PrivateUsers= (root alone mapped).
	mainPID, _ := sp["MainPID"].Value().(uint32)
	if bnd, err := capBounding(s, mainPID); err != nil || bnd != 0 {
		t.Errorf("the daemon's bounding set: %#x (%v), want none", bnd, err)
	}
	if m := sandboxInEffect(s, mainPID); len(m) > 0 {
		t.Errorf("the unit's sandbox is not in effect on the daemon: missing %s", strings.Join(m, ", "))
	}
	// Fault-around off for its binary's code (internal/trim), the
	// system call filter notwithstanding.
	if err := faultAroundOff(s, mainPID, "/bin/autopilot-health"); err != nil {
		t.Errorf("the daemon: %v", err)
	}
	if dir, _, err := hostStatus(s, mainPID); err != nil {
		t.Error(err)
	} else {
		if _, err := os.Stat(filepath.Join(dir, "root", "dev", "kmsg")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the daemon's /dev/kmsg: %v, want none (PrivateDevices=)", err)
		}
		if um, _ := os.ReadFile(filepath.Join(dir, "uid_map")); strings.Join(strings.Fields(string(um)), " ") != "0 0 1" {
			t.Errorf("the daemon's uid_map %q, want root alone (PrivateUsers=)", um)
		}
	}
	// The helper: started by the daemon's first request, the three
	// capabilities (PID 1 kept CAP_SYSLOG), its sandbox, no network.
	hp, err := s.Properties(ctx, "autopilot-health-privileged.service", "Service")
	if err != nil {
		t.Fatal(err)
	}
	helperPID, _ := hp["MainPID"].Value().(uint32)
	if helperPID == 0 {
		t.Fatalf("autopilot-health-privileged.service is not running\n%s", s.Journal("autopilot-health-privileged.service"))
	}
	if bnd, err := capBounding(s, helperPID); err != nil || bnd != 1<<unix.CAP_SYSLOG|1<<unix.CAP_SYS_ADMIN|1<<unix.CAP_DAC_READ_SEARCH {
		t.Errorf("the helper's bounding set: %#x (%v)", bnd, err)
	}
	if m := sandboxInEffect(s, helperPID); len(m) > 0 {
		t.Errorf("the helper's sandbox is not in effect: missing %s", strings.Join(m, ", "))
	}
	if err := faultAroundOff(s, helperPID, "/autopilot-health-privileged"); err != nil {
		t.Errorf("the helper: %v", err)
	}
	// And both say so in their first lines, for an operator.
	for _, unit := range []string{"autopilot-health.service", "autopilot-health-privileged.service"} {
		if j := s.Journal(unit); !strings.Contains(j, "fault_around=off") {
			t.Errorf("%s's journal does not say fault_around=off:\n%s", unit, lastBytes(j, 4000))
		}
	}
	if dir, _, err := hostStatus(s, helperPID); err != nil {
		t.Error(err)
	} else if a, b := nsLink(dir, "net"), nsLink(fmt.Sprintf("/proc/%d", s.PID), "net"); a == "" || a == b {
		t.Errorf("the helper's network namespace %q, PID 1's %q: want its own (PrivateNetwork=)", a, b)
	}

	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	var page string
	scrapeMetric := func(series string) (float64, string) {
		page, err = httpGet(metricsURL)
		if err != nil {
			return 0, err.Error()
		}
		v, ok := metricValue(page, series)
		if !ok {
			return 0, series + " not exposed"
		}
		return v, fmt.Sprint(series, " ", v)
	}

	// /dev/kmsg, opened by the helper (CAP_SYSLOG, DeviceAllow=/dev/kmsg r)
	// and read by the daemon.
	eventually(t, 15*time.Second, "the kernel log reader up", func() (bool, string) {
		v, last := scrapeMetric("autopilot_health_kmsg_reader_up")
		return v == 1, last
	})
	// kernel.hung_task_warnings, read through ProtectKernelTunables= (a
	// read-only /proc/sys, still readable): the host's value, not absent.
	if b, err := os.ReadFile("/proc/sys/kernel/hung_task_warnings"); err == nil {
		want, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if v, last := scrapeMetric("autopilot_health_kernel_hung_task_warnings"); v != want || strings.HasSuffix(last, " not exposed") {
			t.Errorf("%s, want %v (the host's kernel.hung_task_warnings)", last, want)
		}
	}
	// The repaired units' series of a restart and of a failed repair exist
	// before any repair (at 0 until one), so that increase() sees the
	// first (checks.Repairer.Repaired).
	for _, unit := range []string{"kubelet.service", "containerd.service"} {
		for _, result := range []string{"failed", "restarted"} {
			series := fmt.Sprintf(`autopilot_health_repairs_total{result=%q,unit=%q}`, result, unit)
			if _, last := scrapeMetric(series); strings.HasSuffix(last, " not exposed") {
				t.Errorf("%s: want the series from the start", last)
			}
		}
	}
	// Served once the port was free: the status line drops its note, and
	// the unit never restarted.
	eventually(t, 10*time.Second, "STATUS= without the metrics note", func() (bool, string) {
		sp, err := s.Properties(ctx, "autopilot-health.service", "Service")
		if err != nil {
			return false, err.Error()
		}
		st, _ := sp["StatusText"].Value().(string)
		n, _ := sp["NRestarts"].Value().(uint32)
		return !strings.Contains(st, "metrics not served") && hasSummary(st) && n == 0, fmt.Sprintf("STATUS=%q NRestarts=%d", st, n)
	})
	if j := s.Journal("autopilot-health.service"); strings.Count(j, "cannot bind metrics.listen_address") != 1 || !strings.Contains(j, "metrics listener bound") {
		t.Errorf("the journal does not say once that the metrics port could not be bound, then that it was:\n%s", lastBytes(j, 4000))
	}
	records, _ := scrapeMetric("autopilot_health_kmsg_records_total")
	if err := harness.WriteKmsg("autopilot-health unit test " + tok); err != nil {
		t.Fatalf("writing to /dev/kmsg: %v", err)
	}
	eventually(t, 10*time.Second, "the test's kernel line matched", func() (bool, string) {
		v, last := scrapeMetric(`autopilot_health_kmsg_matches_total{rule="UnitTestToken"}`)
		return v == 1, last
	})
	if v, _ := scrapeMetric("autopilot_health_kmsg_records_total"); v <= records {
		t.Errorf("kmsg records %v, before the line %v", v, records)
	}

	// state.json: written, parses, every check evaluated through the sandbox.
	statePath := s.Root("/var/lib/autopilot-health/state.json")
	readState := func() (stateFile, error) {
		var f stateFile
		b, err := os.ReadFile(statePath)
		if err != nil {
			return f, err
		}
		return f, json.Unmarshal(b, &f)
	}
	var state stateFile
	eventually(t, 15*time.Second, "state.json with ContainerRuntimeUnhealthy and KubeletUnhealthy False", func() (bool, string) {
		state, err = readState()
		if err != nil {
			return false, err.Error()
		}
		a, b := state.get("ContainerRuntimeUnhealthy"), state.get("KubeletUnhealthy")
		return a.Status == report.StatusFalse && b.Status == report.StatusFalse, fmt.Sprintf("%+v %+v", a, b)
	})
	bootID, _ := readBootID()
	if state.BootID != bootID || state.Version == 0 {
		t.Errorf("state.json: version %d, boot %q (this boot %q)", state.Version, state.BootID, bootID)
	}
	for _, c := range state.Conditions {
		switch c.Reason {
		case report.ReasonCheckFailed, report.ReasonCheckTimeout, report.ReasonCheckPanicked:
			t.Errorf("%s could not run under the unit: %s %s", c.Type, c.Reason, c.Message)
		}
		t.Logf("  %-28s %-7s %-26s %s", c.Type, c.Status, c.Reason, c.Message)
	}
	// Unknown, NoData is an evaluation too: adjtimex read, the clock not
	// synchronized yet on a host booted less than 10 minutes ago.
	if c := state.get("ClockNotSynchronized"); c.Status == "" || c.Status == report.StatusUnknown && c.Reason != report.ReasonNoData {
		t.Errorf("ClockNotSynchronized not evaluated (adjtimex): %+v", c)
	}
	for _, ty := range []string{"ServiceNotRecovering", "NodeServiceDown"} {
		if c := state.get(ty); c.Status == report.StatusUnknown || c.Status == "" {
			t.Errorf("%s not evaluated (unit states over D-Bus): %+v", ty, c)
		}
	}
	if c := state.get("ContainerRuntimeUnhealthy"); !strings.Contains(c.Message, "RuntimeReady") {
		t.Errorf("ContainerRuntimeUnhealthy: %+v", c)
	}
	// The host's filesystems: /data (and its use as the host sees it).
	du := state.get("DiskUsageHigh")
	m := regexp.MustCompile(`(?:^|, )/data (\d+)% of space used`).FindStringSubmatch(du.Message)
	if du.Reason != "FilesystemSpaceHigh" || m == nil {
		t.Errorf("DiskUsageHigh did not measure /data (a host directory on %s): %+v", fsType(data), du)
	} else {
		var st unix.Statfs_t
		if err := unix.Statfs(data, &st); err != nil {
			t.Fatal(err)
		}
		used := (st.Blocks - st.Bfree) * uint64(st.Bsize)
		want := percentUp(used, st.Bavail*uint64(st.Bsize))
		if got, _ := strconv.Atoi(m[1]); got < want-1 || got > want+1 {
			t.Errorf("/data %d%% used inside, %d%% on the host", got, want)
		}
	}
	// The LVM part runs the host's lvm (where installed) inside the
	// sandbox: its reports must work there (read-only /etc and /run).
	if strings.Contains(du.Message, "not checked") {
		t.Errorf("DiskUsageHigh could not check everything under the unit: %s", du.Message)
	}
	for _, series := range []string{`autopilot_health_check_runs_total{check="DiskUsageHigh",result="problem"}`, `autopilot_health_check_runs_total{check="ContainerRuntimeUnhealthy",result="ok"}`} {
		if v, last := scrapeMetric(series); v < 1 {
			t.Errorf("%s", last)
		}
	}
	clockOK, _ := metricValue(page, `autopilot_health_check_runs_total{check="ClockNotSynchronized",result="ok"}`)
	clockProblem, _ := metricValue(page, `autopilot_health_check_runs_total{check="ClockNotSynchronized",result="problem"}`)
	if clockOK+clockProblem < 1 && state.get("ClockNotSynchronized").Reason != report.ReasonNoData {
		t.Errorf("ClockNotSynchronized runs: ok %v, problem %v", clockOK, clockProblem)
	}

	// NodeTampered through the sandbox: the baseline in the StateDirectory
	// (tamper.json, 0600), a change found by file notifications (the
	// interval is 5 min), and the operator's clear over the control socket
	// in the RuntimeDirectory.
	eventually(t, 15*time.Second, "NodeTampered=False in state.json", func() (bool, string) {
		state, err = readState()
		c := state.get("NodeTampered")
		return c.Status == report.StatusFalse, fmt.Sprintf("%+v %v", c, err)
	})
	if fi, err := os.Stat(s.Root("/var/lib/autopilot-health/tamper.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("tamper.json: %v %v, want mode 0600", fi, err)
	}
	// The helper killed: systemd restarts it (or its socket starts it on
	// the next request), and the scan of the change below goes through
	// the new one.
	if dir, _, err := hostStatus(s, helperPID); err != nil {
		t.Fatal(err)
	} else if hostPID, err := strconv.Atoi(filepath.Base(dir)); err != nil {
		t.Fatal(err)
	} else if err := unix.Kill(hostPID, unix.SIGKILL); err != nil {
		t.Fatalf("killing the helper: %v", err)
	}
	if err := os.WriteFile(s.Root("/etc/autopilot-health-test/protected/evil.conf"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("token: b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "NodeTampered=True in state.json", func() (bool, string) {
		state, err = readState()
		c := state.get("NodeTampered")
		return c.Status == report.StatusTrue && strings.Contains(c.Message, "/etc/autopilot-health-test/protected/evil.conf added") &&
			strings.Contains(c.Message, "/etc/autopilot-health-test/protected/other/secret.conf modified"), fmt.Sprintf("%+v %v", c, err)
	})
	if hp, err := s.Properties(ctx, "autopilot-health-privileged.service", "Service"); err != nil {
		t.Error(err)
	} else if p, _ := hp["MainPID"].Value().(uint32); p == helperPID || p == 0 {
		t.Errorf("the helper's MainPID is %d after SIGKILL of %d: want a new one", p, helperPID)
	}
	conds, err := daemon.RequestTamperClear(s.Root("/run/autopilot-health/control.sock"), "unit test", "tests")
	if err != nil || len(conds) == 0 || conds[0].Type != "NodeTampered" || conds[0].Status != report.StatusFalse {
		t.Errorf("tamper clear through the unit's control socket: %+v %v", conds, err)
	}

	// Repair over D-Bus from inside the sandbox: the kubelet's /healthz
	// fails; the daemon restarts kubelet.service.
	time.Sleep(time.Until(kubelet.MainStart.Add(2 * time.Second))) // its cooldown counts from the unit's start
	broken := breakStandin(t, s, "kubelet-broken")
	brokeAt := time.Now()
	restarted := waitUnit(t, s, "kubelet.service", "kubelet restarted by the daemon", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != kubelet.Invocation
	})
	t.Logf("kubelet broken to restarted by the daemon: %s", restarted.MainStart.Sub(brokeAt).Round(time.Millisecond))
	if restarted.NRestarts != 0 {
		t.Errorf("kubelet restarted by systemd (NRestarts %d), not by the daemon", restarted.NRestarts)
	}
	eventually(t, 10*time.Second, "the repair counted", func() (bool, string) {
		v, last := scrapeMetric(`autopilot_health_repairs_total{result="restarted",unit="kubelet.service"}`)
		return v >= 1, last
	})
	eventually(t, 10*time.Second, "KubeletUnhealthy=True in state.json", func() (bool, string) {
		state, err = readState()
		c := state.get("KubeletUnhealthy")
		return c.Status == report.StatusTrue && strings.Contains(c.Message, "HTTP 500"), fmt.Sprintf("%+v %v", c, err)
	})
	checkStatus(t, s, filepath.Join(usr, "bin", "autopilot-health"), tok)
	os.Remove(broken)
	eventually(t, 10*time.Second, "KubeletUnhealthy=False in state.json after recovery", func() (bool, string) {
		state, err = readState()
		c := state.get("KubeletUnhealthy")
		return c.Status == report.StatusFalse, fmt.Sprintf("%+v %v", c, err)
	})

	// The daemon under the sandbox reads the journal's files itself (the
	// native reader, not journalctl): the restarted kubelet's first line is
	// an entry of kubelet.service, and KubeletHeartbeatFailed keeps its
	// cursor in the state file.
	eventually(t, 15*time.Second, "KubeletHeartbeatFailed read kubelet's entries (a cursor in state.json)", func() (bool, string) {
		var raw struct {
			Memos struct {
				Heartbeat struct {
					Cursor string `json:"cursor"`
				} `json:"kubeletheartbeat"`
			} `json:"memos"`
		}
		b, err := os.ReadFile(statePath)
		if err == nil {
			err = json.Unmarshal(b, &raw)
		}
		state, _ = readState()
		c := state.get("KubeletHeartbeatFailed")
		return err == nil && raw.Memos.Heartbeat.Cursor != "" && c.Status == report.StatusFalse, fmt.Sprintf("%+v %+v %v", raw, c, err)
	})
	// ... and did so without falling back to journalctl (which it logs).
	if j := s.Journal("autopilot-health.service"); strings.Contains(j, "reading the journal with journalctl") {
		t.Errorf("the daemon under its unit fell back to journalctl to read kubelet's entries:\n%s", j)
	} else if !strings.Contains(j, "autopilot-health") {
		t.Errorf("the daemon's journal is empty, so the fallback cannot be told: %q", j)
	}

	// WATCHDOG=1 every WatchdogSec/2 (5 s here): the timestamp advances, and
	// systemd never kills the daemon for a missed ping.
	wdStart := time.Now()
	var stamps []uint64
	eventually(t, 30*time.Second, "three watchdog pings", func() (bool, string) {
		sp, err := s.Properties(ctx, "autopilot-health.service", "Service")
		if err != nil {
			return false, err.Error()
		}
		ts, _ := sp["WatchdogTimestampMonotonic"].Value().(uint64)
		if len(stamps) == 0 || ts != stamps[len(stamps)-1] {
			stamps = append(stamps, ts)
		}
		return len(stamps) >= 4, fmt.Sprint(stamps)
	})
	var gaps []string
	for i := 2; i < len(stamps); i++ {
		gaps = append(gaps, (time.Duration(stamps[i]-stamps[i-1]) * time.Microsecond).Round(time.Millisecond).String())
	}
	t.Logf("watchdog pings %s apart (WatchdogSec=10s), watched for %s", strings.Join(gaps, ", "), time.Since(wdStart).Round(time.Millisecond))
	after, err := s.Bus.Unit(ctx, "autopilot-health.service")
	if err != nil || !active(after) || after.Invocation != daemonUnit.Invocation || after.NRestarts != 0 {
		t.Errorf("the daemon was restarted: before %+v, now %+v (%v)", daemonUnit, after, err)
	}

	// The packaged unit's RuntimeDirectory= created the status socket.
	statusSock := s.Root("/run/autopilot-health/status.sock")
	if fi, err := os.Stat(statusSock); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("status socket: %v %v", fi, err)
	}
	// SIGTERM: STOPPING=1, the state saved, a clean exit. The unit is
	// referenced first: stopped, systemd would unload it, and the unit
	// loaded again reads inactive and "success" whatever the exit was.
	refUnits(ctx, t, s, "autopilot-health.service")
	stopAt := time.Now()
	if err := s.StopUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %s", time.Since(stopAt).Round(time.Millisecond))
	if u, _ := s.Bus.Unit(ctx, "autopilot-health.service"); u.Result != "success" || u.ActiveState != "inactive" || u.Invocation != after.Invocation {
		t.Errorf("after stop: %+v; want inactive, Result success, the invocation that ran (%s)", u, after.Invocation)
	}
	// The helper's units are PartOf= the daemon's: stopped with it (their
	// stop jobs may still be queued when the daemon's ends).
	for _, name := range []string{"autopilot-health-privileged.service", "autopilot-health-privileged.socket"} {
		waitUnit(t, s, name, "the daemon's stop to stop "+name, func(u systemd.Unit) bool { return u.ActiveState == "inactive" })
	}
	if state, err = readState(); err != nil || state.SavedAt.Before(stopAt.Add(-time.Second)) {
		t.Errorf("state not saved on stop: saved at %s, stop at %s (%v)", state.SavedAt, stopAt, err)
	}
	// Stopped: status says so (systemd removed the runtime directory).
	out, err := exec.Command(filepath.Join(usr, "bin", "autopilot-health"), "status", "--socket", statusSock).CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "the daemon is not running, or still starting: nothing answers on "+statusSock) {
		t.Errorf("status of a stopped daemon: exit %d: %s", code, out)
	}
	t.Logf("whole test: %s", time.Since(testStart).Round(time.Millisecond))
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// checkStatus runs the shipped binary's status against the daemon running
// under its unit, while the kubelet stand-in fails and the API server is
// down: the evidence shown is what set each condition (the kernel line the
// test wrote, the units' states as systemd reports them over D-Bus), the
// repair the daemon made, the kernel log reader, and the failing writes.
func checkStatus(t *testing.T, s *harness.Systemd, bin, tok string) {
	t.Helper()
	ctx := context.Background()
	line := "EXT4-fs (" + tok + "): Remounting filesystem read-only"
	if err := harness.WriteKmsg(line); err != nil {
		t.Fatal(err)
	}
	sock := s.Root("/run/autopilot-health/status.sock")
	var st daemon.StatusReport
	var out []byte
	cond := func(ty string) daemon.ConditionStatus {
		for _, c := range st.Conditions {
			if c.Type == ty {
				return c
			}
		}
		return daemon.ConditionStatus{}
	}
	eventually(t, 15*time.Second, "status: ReadonlyFilesystem True from the test's line, KubeletUnhealthy True, a failed API call", func() (bool, string) {
		var err error
		out, err = exec.Command(bin, "status", "--json", "--socket", sock).Output()
		if code := exitCode(err); code != 1 {
			return false, fmt.Sprintf("exit %d (want 1: a condition is True): %s", code, out)
		}
		st = daemon.StatusReport{}
		if err := json.Unmarshal(out, &st); err != nil {
			return false, err.Error()
		}
		return cond("ReadonlyFilesystem").Status == report.StatusTrue && cond("KubeletUnhealthy").Status == report.StatusTrue &&
			st.Kubernetes.Calls["read"].Failing, string(out)
	})
	// The kernel line that set the condition, read by the daemon.
	if c := cond("ReadonlyFilesystem"); c.Message != line || c.Reason != "FilesystemIsReadOnly" || c.Source != "kmsg" || c.LastTransitionTime.IsZero() {
		t.Errorf("ReadonlyFilesystem: %+v", c)
	}
	if k := st.Kmsg; k == nil || !k.Reading || k.LastRecord == nil || k.LastRecord.Seq == 0 || k.Records < 1 {
		t.Errorf("kernel log reader: %+v", k)
	}
	// The kubelet's state as systemd has it, in ServiceNotRecovering's evidence.
	u, err := s.Bus.Unit(ctx, "kubelet.service")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(cond("ServiceNotRecovering").Evidence["services.services"])
	var units []struct {
		Name        string `json:"name"`
		ActiveState string `json:"activeState"`
		NRestarts   uint32 `json:"restarts"`
		Invocation  string `json:"invocationID"`
	}
	json.Unmarshal(b, &units)
	found := false
	for _, x := range units {
		if x.Name == "kubelet.service" {
			found = true
			if x.NRestarts != u.NRestarts || x.Invocation == "" {
				t.Errorf("kubelet in the evidence %+v, over D-Bus %+v", x, u)
			}
		}
	}
	if !found {
		t.Errorf("no kubelet.service in ServiceNotRecovering's evidence: %s", b)
	}
	if r := st.Repairs["kubelet.service"]; r.Repairs < 1 || r.LastResult != "done" || r.LastRepair.IsZero() {
		t.Errorf("kubelet repair: %+v", r)
	}
	// The API server is down: the daemon answers anyway, and says so.
	k := st.Kubernetes
	if k.State != "reporting" || !k.StatusPending || !strings.Contains(k.Calls["read"].LastError, "connection refused") || !k.Calls["read"].LastSuccess.IsZero() {
		t.Errorf("kubernetes reporting: %+v", k)
	}
	text, err := exec.Command(bin, "status", "--socket", sock).Output()
	for _, want := range []string{"ReadonlyFilesystem=True (FilesystemIsReadOnly) since", "  " + line, "kubelet.service: ", "Kernel log: reading /dev/kmsg, last record #", "Kubernetes: reporting", "FAILING: "} {
		if !strings.Contains(string(text), want) {
			t.Errorf("status lacks %q", want)
		}
	}
	t.Logf("autopilot-health status (exit %d):\n%s", exitCode(err), text)
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// percentUp is used/(used+avail) rounded up, as df and DiskUsageHigh do.
func percentUp(used, avail uint64) int {
	if used+avail == 0 {
		return 0
	}
	return int((used*100 + used + avail - 1) / (used + avail))
}

func fsType(p string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("fs magic %#x", st.Type)
}

// hostStatus returns the host's /proc directory and status file of a
// process of the namespace, given its PID there (the host knows it by
// another: look it up by NSpid).
func hostStatus(s *harness.Systemd, nsPID uint32) (string, []byte, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return "", nil, err
	}
	nspid := regexp.MustCompile(`(?m)^NSpid:\s+\d+\s+(\d+)$`)
	for _, e := range entries {
		dir := filepath.Join("/proc", e.Name())
		b, err := os.ReadFile(filepath.Join(dir, "status"))
		if err != nil {
			continue
		}
		ns := nspid.FindSubmatch(b)
		if ns == nil || string(ns[1]) != strconv.Itoa(int(nsPID)) || !sameNS(s.PID, e.Name()) {
			continue
		}
		return dir, b, nil
	}
	return "", nil, fmt.Errorf("no process with PID %d in the namespace", nsPID)
}

// capBounding returns the bounding set of a process of the namespace.
func capBounding(s *harness.Systemd, nsPID uint32) (uint64, error) {
	_, b, err := hostStatus(s, nsPID)
	if err != nil {
		return 0, err
	}
	if m := regexp.MustCompile(`(?m)^CapBnd:\s+([0-9a-f]+)$`).FindSubmatch(b); m != nil {
		return strconv.ParseUint(string(m[1]), 16, 64)
	}
	return 0, fmt.Errorf("no CapBnd in the status of PID %d", nsPID)
}

// faultAroundOff checks that the read-only mappings of the process's binary
// (its path ending in exe) are registered with a userfaultfd for write
// protection ("uw" in VmFlags), which turns fault-around off for them
// (trim.NoFaultAround).
func faultAroundOff(s *harness.Systemd, nsPID uint32, exe string) error {
	dir, _, err := hostStatus(s, nsPID)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(dir, "smaps"))
	if err != nil {
		return err
	}
	var seen, off int
	var cur []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 6 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":"):
			cur = f
		case len(f) > 0 && f[0] == "VmFlags:" && cur != nil:
			if strings.HasSuffix(cur[5], exe) && (cur[1] == "r-xp" || cur[1] == "r--p") {
				seen++
				if slices.Contains(f[1:], "uw") {
					off++
				}
			}
			cur = nil
		}
	}
	if seen == 0 || off != seen {
		return fmt.Errorf("fault-around is on: %d of the %d read-only mappings of %s are registered for write protection (VmFlags uw)", off, seen, exe)
	}
	return nil
}

// sandboxInEffect says what of the unit's sandbox the kernel does not show
// on the running daemon: no new privileges, a seccomp filter, and its own
// /proc with other processes hidden (ProtectProc=invisible).
func sandboxInEffect(s *harness.Systemd, nsPID uint32) []string {
	dir, status, err := hostStatus(s, nsPID)
	if err != nil {
		return []string{err.Error()}
	}
	var missing []string
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !bytes.Contains(status, []byte(want)) {
			missing = append(missing, want)
		}
	}
	mi, err := os.ReadFile(filepath.Join(dir, "mountinfo"))
	if err != nil {
		return append(missing, err.Error())
	}
	hidden := false
	for _, l := range strings.Split(string(mi), "\n") {
		// ID parent major:minor root mountpoint options ... - fstype source superoptions
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == "/proc" && strings.Contains(l, " - proc ") && strings.Contains(l, "hidepid=invisible") {
			hidden = true
		}
	}
	if !hidden {
		missing = append(missing, "/proc mounted with hidepid=invisible")
	}
	return missing
}

// nsLink is the namespace of kind of the process whose /proc directory is
// dir ("" when unreadable).
func nsLink(dir, kind string) string {
	l, _ := os.Readlink(filepath.Join(dir, "ns", kind))
	return l
}

func sameNS(pid1 int, pid string) bool {
	a, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid1))
	b, err2 := os.Readlink("/proc/" + pid + "/ns/pid")
	return err1 == nil && err2 == nil && a == b
}
