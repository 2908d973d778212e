//go:build integration

package tests

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

var (
	sdOnce    sync.Once
	sdShared  *harness.Systemd
	sdErr     error
	sdPort    int
	sdCleanup []func()
)

func stopSystemds() {
	for _, f := range sdCleanup {
		f()
	}
}

// realSystemd starts (once per package) a systemd as PID 1 in fresh
// namespaces with stand-in units for kubelet, containerd (a CRI server),
// the failover proxy, a tunnel agent and a unit that ends failed.
func realSystemd(t testing.TB) *harness.Systemd {
	t.Helper()
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	sdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "autopilot-health-systemd-"+harness.Token()+"-")
		if err != nil {
			sdErr = err
			return
		}
		if _, err := harness.BuildStandin(filepath.Join(dir, "units", "bin")); err != nil {
			sdErr = err
			return
		}
		if sdPort, sdErr = freeLoopbackPort(); sdErr != nil {
			return
		}
		standin := "/etc/systemd/system/bin/standin"
		svc := func(desc, exec, extra string) string {
			return fmt.Sprintf("[Unit]\nDescription=%s\nDefaultDependencies=no\nStartLimitIntervalSec=0\n\n[Service]\nExecStart=%s\n%s", desc, exec, extra)
		}
		units := map[string]string{
			"kubelet.service":             svc("stand-in kubelet (/healthz)", fmt.Sprintf("%s kubelet 127.0.0.1:%d /run/standin/kubelet-broken", standin, sdPort), "Restart=always\nRestartSec=100ms\n"),
			"containerd.service":          svc("stand-in containerd (CRI)", standin+" cri /run/containerd/containerd.sock /run/standin/cri-broken", "Restart=always\nRestartSec=100ms\nRuntimeDirectory=containerd\nRuntimeDirectoryPreserve=yes\n"),
			"syself-proxy.service":        svc("stand-in failover proxy", "/bin/sleep infinity", "Restart=always\nRestartSec=100ms\n"),
			"syself-tunnel-agent.service": svc("stand-in tunnel agent", "/bin/sleep infinity", "Restart=always\nRestartSec=100ms\n"),
			"broken.service":              "[Unit]\nDescription=exits non-zero once, no restart: failed\nDefaultDependencies=no\n\n[Service]\nExecStart=/bin/false\n",
		}
		start := time.Now()
		sdShared, sdErr = harness.StartSystemd(dir, units)
		if sdErr == nil {
			fmt.Fprintf(os.Stderr, "namespaced systemd ready in %s (pid %d, %s)\n", time.Since(start).Round(time.Millisecond), sdShared.PID, dir)
			sdCleanup = append(sdCleanup, func() { sdShared.Stop(); os.RemoveAll(dir) })
		}
	})
	if sdErr != nil {
		t.Fatalf("starting a real systemd: %v", sdErr)
	}
	return sdShared
}

func waitUnit(t testing.TB, s *harness.Systemd, name, what string, ok func(systemd.Unit) bool) systemd.Unit {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		u, err := s.Bus.Unit(context.Background(), name)
		if err == nil && ok(u) {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s is %+v (%v)", what, name, u, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a unit over D-Bus
	}
}

func active(u systemd.Unit) bool { return u.ActiveState == "active" && u.SubState == "running" }

func sdEnv(t *testing.T, s *harness.Systemd, mutate func(*config.Config)) (*checks.Env, *report.Store) {
	cfg := config.Default()
	cfg.Checks.KubeletUnhealthy.HealthzURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", sdPort)
	cfg.Checks.ContainerRuntimeUnhealthy.Socket = s.Root("/run/containerd/containerd.sock")
	cfg.Runner.FirstRunSpread = config.Duration{}
	if mutate != nil {
		mutate(cfg)
	}
	env := &checks.Env{Config: cfg, NodeName: "n", Role: report.RoleWorker, Log: quiet(), Sys: checks.RealSys(), Now: time.Now, Systemd: s.Bus}
	env.Repair = checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	return env, report.NewStore("b")
}

// sdEnvFromState is sdEnv for a daemon whose ServiceNotRecovering watches
// units (as a worker's), its state_dir stateDir, its store read back from
// there as a daemon's start reads it.
func sdEnvFromState(t *testing.T, s *harness.Systemd, stateDir string, units ...string) (*checks.Env, *report.Store) {
	t.Helper()
	env, store := sdEnv(t, s, func(c *config.Config) {
		c.StateDir = stateDir
		c.Checks.ServiceNotRecovering.WorkerUnits = units
	})
	if _, err := store.Load(stateDir); err != nil {
		t.Fatal(err)
	}
	return env, store
}

func runChecks(t *testing.T, env *checks.Env, store *report.Store, only ...string) func() {
	t.Helper()
	r, err := checks.NewRunner(env, checks.Options{Store: store, Only: only})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx, nil); close(done) }()
	return func() { cancel(); <-done; env.Repair.Wait() }
}

// breakStandin creates the file that makes a stand-in fail (kubelet-broken:
// /healthz answers 500; cri-broken: Status hangs) and returns its path; the
// file goes at t's end at the latest (the package's systemd is shared: a
// test that failed before its os.Remove left kubelet broken for every test
// after it).
func breakStandin(t *testing.T, s *harness.Systemd, name string) string {
	t.Helper()
	p := s.Root("/run/standin/" + name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	return p
}

func dur(d time.Duration) config.Duration { return config.Duration{Duration: d} }

func condIs(store *report.Store, ty string, st report.Status) func() bool {
	return func() bool { c, ok := store.Get(ty); return ok && c.Status == st }
}

// A broken /healthz leads to restarts of kubelet, never two within the
// cooldown, and the condition clears after recovery.
func TestKubeletRepairOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	waitUnit(t, s, "kubelet.service", "kubelet up", active)
	const cooldown = 2 * time.Second
	env, store := sdEnv(t, s, func(c *config.Config) {
		c.Checks.KubeletUnhealthy.Interval = dur(250 * time.Millisecond)
		c.Checks.KubeletUnhealthy.Timeout = dur(250 * time.Millisecond)
		c.Checks.KubeletUnhealthy.RestartCooldown = dur(cooldown)
	})
	stop := runChecks(t, env, store, "KubeletUnhealthy")
	defer stop()
	waitFor(t, store, nil, 10*time.Second, "KubeletUnhealthy=False", condIs(store, "KubeletUnhealthy", report.StatusFalse))
	first := waitUnit(t, s, "kubelet.service", "kubelet up", active)
	// kubelet "started" a moment ago counts toward the cooldown: let it pass.
	time.Sleep(time.Until(first.MainStart.Add(cooldown)))

	broken := breakStandin(t, s, "kubelet-broken")
	brokeAt := time.Now()
	waitFor(t, store, nil, 10*time.Second, "KubeletUnhealthy=True", condIs(store, "KubeletUnhealthy", report.StatusTrue))
	// Watch the invocations for 3.5 s of a 2 s cooldown. On an idle machine
	// that is 2 restarts (at ~0 s and ~2 s); on a busy one probes and jobs
	// run late, so assert bounds: no two starts closer than the cooldown, at
	// least one restart, at most ceil(3.5/2)+1.
	const window = 3500 * time.Millisecond
	log := newInvocationLog(first)
	for time.Since(brokeAt) < window {
		log.sample(s, "kubelet.service")
		time.Sleep(20 * time.Millisecond) // sampling invocations over a fixed window
	}
	n := checkCooldown(t, "broken kubelet", log.sorted(), window, cooldown)
	if st := env.Repair.Status("kubelet.service"); st.Repairs < n || st.Repairs > n+1 {
		// A restart requested at the end of the window may not have
		// started yet: one more repair than invocations seen, never fewer.
		t.Errorf("the repairer counted %d restarts, %d new invocations seen", st.Repairs, n)
	}
	c, _ := store.Get("KubeletUnhealthy")
	if !strings.Contains(c.Message, "HTTP 500") {
		t.Errorf("message %q", c.Message)
	}
	os.Remove(broken)
	waitFor(t, store, nil, 10*time.Second, "KubeletUnhealthy=False after recovery", condIs(store, "KubeletUnhealthy", report.StatusFalse))
	if st := env.Repair.Status("kubelet.service"); st.Consecutive != 0 {
		t.Errorf("consecutive repairs after recovery: %+v", st)
	}
}

// A hung CRI runtime (Status never answers) is a failed probe: the condition
// is set and containerd.service restarted.
func TestContainerdRepairOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	before := waitUnit(t, s, "containerd.service", "containerd up", active)
	env, store := sdEnv(t, s, func(c *config.Config) {
		c.Checks.ContainerRuntimeUnhealthy.Interval = dur(500 * time.Millisecond)
		c.Checks.ContainerRuntimeUnhealthy.Timeout = dur(500 * time.Millisecond)
		c.Checks.ContainerRuntimeUnhealthy.RestartCooldown = dur(2 * time.Second)
	})
	stop := runChecks(t, env, store, "ContainerRuntimeUnhealthy")
	defer stop()
	waitFor(t, store, nil, 10*time.Second, "ContainerRuntimeUnhealthy=False", condIs(store, "ContainerRuntimeUnhealthy", report.StatusFalse))
	time.Sleep(time.Until(before.MainStart.Add(2 * time.Second))) // the cooldown counts from the unit's start
	defer os.Remove(breakStandin(t, s, "cri-broken"))
	waitFor(t, store, nil, 10*time.Second, "ContainerRuntimeUnhealthy=True", condIs(store, "ContainerRuntimeUnhealthy", report.StatusTrue))
	waitUnit(t, s, "containerd.service", "a new containerd invocation", func(u systemd.Unit) bool { return active(u) && u.Invocation != before.Invocation })
	if c, _ := store.Get("ContainerRuntimeUnhealthy"); !strings.Contains(c.Message, "DeadlineExceeded") {
		t.Errorf("message %q", c.Message)
	}
}

// kill makes a unit's main process die (a crash); systemd restarts it.
func kill(t *testing.T, s *harness.Systemd, name string) systemd.Unit {
	t.Helper()
	before := waitUnit(t, s, name, name+" up", active)
	if err := s.KillMain(context.Background(), name, int32(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	return waitUnit(t, s, name, name+" restarted by systemd", func(u systemd.Unit) bool { return active(u) && u.Invocation != before.Invocation })
}

func snrProbe(t *testing.T, c checks.Check) checks.Result {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestServiceNotRecoveringOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	env, _ := sdEnv(t, s, nil)
	c, err := checks.NewForTest("ServiceNotRecovering", env)
	if err != nil {
		t.Fatal(err)
	}
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Fatalf("baseline: %+v", r)
	}
	// Killed and restarted by systemd three times: flapping.
	for range 3 {
		kill(t, s, "syself-proxy.service")
	}
	r := snrProbe(t, c)
	if r.Status != report.StatusTrue || r.Reason != "UnitFlapping" || r.Message != "syself-proxy.service restarted 3 times since the last check" {
		t.Errorf("after 3 crashes: %+v", r)
	}
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Errorf("no new restarts: %+v", r)
	}
	// A manual restart resets NRestarts to 0; the delta must not go wrong.
	kill(t, s, "syself-proxy.service")
	if err := s.Bus.Restart(context.Background(), "syself-proxy.service"); err != nil {
		t.Fatal(err)
	}
	if u := waitUnit(t, s, "syself-proxy.service", "up", active); u.NRestarts != 0 {
		t.Errorf("NRestarts after a manual restart: %d", u.NRestarts)
	}
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Errorf("after a manual restart: %+v", r)
	}
	kill(t, s, "syself-proxy.service")
	kill(t, s, "syself-proxy.service")
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Errorf("2 crashes after a manual restart: %+v", r)
	}
	// A transient failed during an automatic restart is not "failed": probe
	// right after the kill, while systemd is restarting the unit.
	if err := s.KillMain(context.Background(), "kubelet.service", int32(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if r := snrProbe(t, c); r.Reason == "UnitFailed" {
		t.Errorf("transient failed during auto-restart taken for failed: %+v", r)
	}
	waitUnit(t, s, "kubelet.service", "kubelet back", active)

	// A unit that ends failed (no Restart=).
	env2, _ := sdEnv(t, s, func(c *config.Config) {
		c.Checks.ServiceNotRecovering.WorkerUnits = []string{"kubelet.service", "broken.service"}
	})
	c2, _ := checks.NewForTest("ServiceNotRecovering", env2)
	waitUnit(t, s, "broken.service", "broken failed", func(u systemd.Unit) bool { return u.ActiveState == "failed" })
	if r := snrProbe(t, c2); r.Status != report.StatusTrue || r.Reason != "UnitFailed" || r.Message != "broken.service is failed (exit-code)" {
		t.Errorf("failed unit: %+v", r)
	}
}

func TestNodeServiceDownOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	env, _ := sdEnv(t, s, nil)
	c, _ := checks.NewForTest("NodeServiceDown", env)
	waitUnit(t, s, "syself-tunnel-agent.service", "up", active)
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Fatalf("active: %+v", r)
	}
	if err := s.StopUnit(context.Background(), "syself-tunnel-agent.service"); err != nil {
		t.Fatal(err)
	}
	if r := snrProbe(t, c); r.Status != report.StatusTrue || r.Message != "syself-tunnel-agent.service is not active (inactive/dead)" {
		t.Errorf("stopped: %+v", r)
	}
	if err := s.StartUnit(context.Background(), "syself-tunnel-agent.service"); err != nil {
		t.Fatal(err)
	}
	if r := snrProbe(t, c); r.Status != report.StatusFalse {
		t.Errorf("started again: %+v", r)
	}
}

// Each check's run has a context of its own, done when the run ends; the
// connection to the bus outlives it. It used to die with it: godbus closes
// a connection when the context it was dialed with is done, so every unit
// read dialed the bus twice, authenticated and said Hello again.
func TestDBusConnectionOutlivesTheCall(t *testing.T) {
	s := realSystemd(t)
	bus := systemd.NewDBusAt(s.BusSocket())
	defer bus.Close()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		u, err := bus.Unit(ctx, "kubelet.service")
		cancel()
		if err != nil || u.LoadState != "loaded" {
			t.Fatalf("%+v, %v", u, err)
		}
	}
	if bus.Reconnects != 0 {
		t.Errorf("%d new connections for 5 reads, each with a context of its own: want the first one kept", bus.Reconnects)
	}
}

// Units reads the states with ListUnitsByNames and only the properties the
// checks use, with Properties.Get: the same values as a read of the whole
// unit (GetAll of its Unit and Service interfaces, what Unit did before), for
// an active service, a failed one, one that is stopped, a unit that is not a
// service and one that does not exist; read one by one and all at once.
func TestUnitsMatchAFullRead(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	waitUnit(t, s, "kubelet.service", "kubelet up", active)
	s.StartUnit(ctx, "broken.service") // exits 1: failed (the job's error is expected)
	waitUnit(t, s, "broken.service", "broken failed", func(u systemd.Unit) bool { return u.ActiveState == "failed" })
	if err := s.StopUnit(ctx, "syself-proxy.service"); err != nil {
		t.Fatal(err)
	}
	defer s.StartUnit(ctx, "syself-proxy.service")
	names := []string{"kubelet.service", "broken.service", "syself-proxy.service", "dbus.socket", "absent-unit.service"}
	bus := systemd.NewDBusAt(s.BusSocket())
	defer bus.Close()
	full, err := sd.NewConnection(func() (*godbus.Conn, error) { return systemd.DialBus(ctx, s.BusSocket()) })
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	all, err := bus.Units(ctx, names...)
	if err != nil || len(all) != len(names) {
		t.Fatalf("Units: %v, %v", all, err)
	}
	for i, name := range names {
		want := fullRead(t, full, name)
		if want.ActiveState == "active" {
			// Read only for a service that is not active (the
			// repairer's tell of a stop that ended failed).
			want.ActiveExitMono, want.MainExitMono, want.NotifyAccess, want.RuntimeMax = 0, 0, "", 0
		}
		one, err := bus.Unit(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range []systemd.Unit{one, all[i]} {
			if got != want {
				t.Errorf("%s:\n got %+v\nwant %+v", name, got, want)
			}
		}
	}
	if all[1].ActiveState != "failed" || all[2].ActiveState != "inactive" || all[4].LoadState != "not-found" {
		t.Errorf("the units are not in the states the test needs: %+v", all)
	}
	// The repair's cooldown and the restart count take the running
	// service's start from the monotonic clock, which this process shares.
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	if k, now := all[0], time.Duration(ts.Nano()); k.MainStartMono <= 0 || k.MainStartMono > now {
		t.Errorf("kubelet's monotonic start %v, want within (0, %v]", k.MainStartMono, now)
	}
}

// fullRead is how Unit read a unit before Units: every property of its
// Unit and Service interfaces.
func fullRead(t testing.TB, c *sd.Conn, name string) systemd.Unit {
	t.Helper()
	ctx := context.Background()
	u := systemd.Unit{Name: name}
	p, err := c.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	u.LoadState, _ = p["LoadState"].(string)
	u.ActiveState, _ = p["ActiveState"].(string)
	u.SubState, _ = p["SubState"].(string)
	if j, ok := p["Job"].([]any); ok && len(j) == 2 {
		u.Job, _ = j[0].(uint32)
	}
	if id, ok := p["InvocationID"].([]byte); ok && len(id) > 0 {
		u.Invocation = hex.EncodeToString(id)
	}
	if u.LoadState != "loaded" || !strings.HasSuffix(name, ".service") {
		return u
	}
	sp, err := c.GetUnitTypePropertiesContext(ctx, name, "Service")
	if err != nil {
		t.Fatal(err)
	}
	if us, ok := p["ActiveExitTimestampMonotonic"].(uint64); ok {
		u.ActiveExitMono = time.Duration(us) * time.Microsecond
	}
	if us, ok := sp["ExecMainExitTimestampMonotonic"].(uint64); ok {
		u.MainExitMono = time.Duration(us) * time.Microsecond
	}
	u.Result, _ = sp["Result"].(string)
	u.NRestarts, _ = sp["NRestarts"].(uint32)
	u.NotifyAccess, _ = sp["NotifyAccess"].(string)
	if us, ok := sp["RuntimeMaxUSec"].(uint64); ok && us != math.MaxUint64 {
		u.RuntimeMax = time.Duration(us) * time.Microsecond
	}
	if us, ok := sp["ExecMainStartTimestamp"].(uint64); ok && us > 0 {
		u.MainStart = time.UnixMicro(int64(us))
	}
	if us, ok := sp["ExecMainStartTimestampMonotonic"].(uint64); ok {
		u.MainStartMono = time.Duration(us) * time.Microsecond
	}
	return u
}

// The D-Bus connection drops (dbus restarted); the client reconnects.
func TestDBusReconnect(t *testing.T) {
	s := realSystemd(t)
	bus := systemd.NewDBusAt(s.BusSocket())
	defer bus.Close()
	if _, err := bus.Unit(context.Background(), "kubelet.service"); err != nil {
		t.Fatal(err)
	}
	// Restarting dbus drops every connection, this one's included; the
	// job's answer may never arrive.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	bus.Restart(ctx, "dbus.service")
	cancel()
	deadline := time.Now().Add(15 * time.Second)
	for {
		u, err := bus.Unit(context.Background(), "kubelet.service")
		if err == nil && u.LoadState == "loaded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer after dbus restarted: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // dbus coming back
	}
	if bus.Reconnects == 0 {
		t.Error("the client answered without reconnecting: the bus did not drop?")
	}
}

// At boot kubelet waits for this daemon (Before=kubelet.service): its start
// job is queued. systemd reports the job, the repairer leaves the unit
// alone, and the condition is Unknown, not True.
func TestQueuedStartJobOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	if err := s.AddUnit(ctx, "gate.service", "[Unit]\nDefaultDependencies=no\n[Service]\nType=oneshot\nExecStart=/bin/sleep 3\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUnit(ctx, "late.service", "[Unit]\nDefaultDependencies=no\nAfter=gate.service\n[Service]\nExecStart=/bin/sleep infinity\n"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.StartUnit(ctx, "gate.service") })
	waitUnit(t, s, "gate.service", "gate activating", func(u systemd.Unit) bool { return u.ActiveState == "activating" })
	wg.Go(func() { s.StartUnit(ctx, "late.service") })
	u := waitUnit(t, s, "late.service", "a queued start job", func(u systemd.Unit) bool { return u.Job != 0 })
	if u.ActiveState != "inactive" {
		t.Errorf("late.service with a queued job: %+v", u)
	}
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	if res, msg := r.Repair(ctx, "late.service", time.Minute, "probe failed"); res != checks.RepairStarting {
		t.Errorf("repair of a starting unit: %s %q", res, msg)
	}
	waitUnit(t, s, "late.service", "late started after the gate", active)
	s.StopUnit(ctx, "late.service")
}

// At shutdown or reboot systemd stops kubelet before this daemon. Against
// a real systemd: a unit whose stop job runs (its ExecStop, 3 s) is read
// with the job's type, "stop", and the repairer leaves it alone ("systemd
// is stopping", not "systemd is already restarting", and no restart once
// it stopped); the manager's SystemState, read over the daemon's own
// connection, is one of systemd's words and not "stopping", so
// systemd.Stopping is false. (A real "stopping" is not reached here: a
// start job for shutdown.target stops system.slice, and with it the bus
// this test reads; TestStopping and TestSystemStateOverAFakeBus cover it.)
func TestStopJobOverRealSystemd(t *testing.T) {
	s := realSystemd(t)
	ctx := context.Background()
	if err := s.AddUnit(ctx, "slowstop.service", "[Unit]\nDefaultDependencies=no\n[Service]\nExecStart=/bin/sleep infinity\nExecStop=/bin/sleep 3\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "slowstop.service"); err != nil {
		t.Fatal(err)
	}
	waitUnit(t, s, "slowstop.service", "up", active)
	state, err := s.Bus.SystemState(ctx)
	if err != nil || (state != "running" && state != "degraded") {
		t.Errorf("SystemState: %q, %v; want running or degraded", state, err)
	}
	if stopping, err := systemd.Stopping(ctx, s.Bus); err != nil || stopping {
		t.Errorf("Stopping: %v, %v", stopping, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.StopUnit(ctx, "slowstop.service") })
	// The job is seen queued before it runs (active/running, under load):
	// awaited until it runs the unit's ExecStop.
	u := waitUnit(t, s, "slowstop.service", "its stop job running", func(u systemd.Unit) bool { return u.Job != 0 && u.ActiveState != "active" })
	if u.JobType != "stop" || u.ActiveState != "deactivating" {
		t.Errorf("stopping: %+v", u)
	}
	r := checks.NewRepairer(s.Bus, quiet(), time.Now, nil)
	if res, msg := r.Repair(ctx, "slowstop.service", 0, "probe failed"); res != checks.RepairUnitStopping {
		t.Errorf("repair of a unit being stopped: %s %q", res, msg)
	}
	r.Wait()
	// A restart would have replaced the stop job and the unit come back.
	waitUnit(t, s, "slowstop.service", "stopped", func(u systemd.Unit) bool { return u.ActiveState == "inactive" && u.Job == 0 })
	if st := r.Status("slowstop.service"); st.Repairs != 0 {
		t.Errorf("restarted: %+v", st)
	}
}
