//go:build integration

package tests

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// Debian's containerd (apt install containerd; 1.6.20~ds1-1+deb12u3 in
// bookworm) with its own unit file, /usr/lib/systemd/system/containerd.service.
const (
	containerdBin  = "/usr/bin/containerd"
	containerdUnit = "/usr/lib/systemd/system/containerd.service"
)

// containerdConfig runs the CRI plugin with no CNI configuration (its Status
// then says NetworkReady=false, RuntimeReady=true, as on a node before the
// CNI is up) and the native snapshotter (/var/lib is a tmpfs inside).
const containerdConfig = `# written by tests/containerd_test.go
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "native"
`

// containerdDropIn keeps Debian's unit unchanged but for default
// dependencies, like every other unit of the test systemd.
var containerdDropIn = map[string]string{"containerd.service.d/10-test.conf": "[Unit]\nDefaultDependencies=no\n"}

func needContainerd(t testing.TB) {
	t.Helper()
	for _, p := range []string{containerdBin, containerdUnit} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the real containerd cannot run on this machine: %s missing (apt install containerd)", p)
		}
	}
}

// startContainerd writes containerd's configuration into the namespace and
// starts Debian's containerd.service there (Type=notify: the job is done
// once containerd serves).
func startContainerd(t testing.TB, s *harness.Systemd) systemd.Unit {
	t.Helper()
	p := s.Root("/etc/containerd/config.toml")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(containerdConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.StartUnit(ctx, "containerd.service"); err != nil {
		t.Fatalf("starting Debian's containerd.service: %v\n%s", err, s.Journal("containerd.service"))
	}
	u := waitUnit(t, s, "containerd.service", "containerd up", active)
	t.Logf("containerd.service active %s after StartUnit", time.Since(start).Round(time.Millisecond))
	return u
}

// criConditions calls RuntimeService/Status itself (what the probe calls).
func criConditions(t *testing.T, socket string) map[string]bool {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// containerd says it is ready (sd_notify) before its CRI plugin is:
	// until the plugin has initialised, Status answers Unknown "server is
	// not initialized yet" (the test failed so once in CI, 187 ms after the
	// start). Asked again until it answers otherwise, 10 s at most.
	deadline := time.Now().Add(10 * time.Second)
	var resp *runtimeapi.StatusResponse
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err = runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "server is not initialized yet") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // containerd tells no one when its plugin is up
	}
	if err != nil {
		t.Fatalf("CRI Status on %s: %v", socket, err)
	}
	out := map[string]bool{}
	for _, c := range resp.GetStatus().GetConditions() {
		out[c.GetType()] = c.GetStatus()
	}
	return out
}

// invocationLog samples a unit over D-Bus and keeps each invocation's main
// start time.
type invocationLog struct {
	starts map[string]time.Time
}

func newInvocationLog(u systemd.Unit) *invocationLog {
	return &invocationLog{starts: map[string]time.Time{u.Invocation: u.MainStart}}
}

func (l *invocationLog) sample(s *harness.Systemd, name string) systemd.Unit {
	u, err := s.Bus.Unit(context.Background(), name)
	// Only a running unit's ExecMainStartTimestamp is its invocation's:
	// while a new invocation starts, systemd still shows the last one's
	// (two "starts" 0 s apart before).
	if err == nil && u.Invocation != "" && !u.MainStart.IsZero() && active(u) {
		l.starts[u.Invocation] = u.MainStart
	}
	return u
}

// sorted returns the main start times, oldest first.
func (l *invocationLog) sorted() []time.Time {
	var ts []time.Time
	for _, s := range l.starts {
		ts = append(ts, s)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return ts
}

// checkCooldown asserts that restarts observed over window respect the
// cooldown: no two starts closer than cooldown, at least one restart, at
// most ceil(window/cooldown)+1. It returns the number of restarts.
func checkCooldown(t *testing.T, what string, starts []time.Time, window, cooldown time.Duration) int {
	t.Helper()
	restarts := len(starts) - 1
	var gaps []string
	for i := 1; i < len(starts); i++ {
		gap := starts[i].Sub(starts[i-1])
		gaps = append(gaps, gap.Round(time.Millisecond).String())
		if gap < cooldown {
			t.Errorf("%s: two starts %s apart, closer than the %s cooldown (starts %v)", what, gap, cooldown, starts)
		}
	}
	most := int(math.Ceil(float64(window)/float64(cooldown))) + 1
	t.Logf("%s: %d restarts in %s with a %s cooldown (allowed 1..%d); gaps between starts: %s", what, restarts, window, cooldown, most, strings.Join(gaps, ", "))
	if restarts < 1 || restarts > most {
		t.Errorf("%s: %d restarts in %s with a %s cooldown, want 1..%d", what, restarts, window, cooldown, most)
	}
	return restarts
}

// The real containerd (Debian's package and unit) answers the daemon's CRI
// probe; killed, systemd's own Restart= brings it back and the daemon stays
// out of its way; hung, the daemon restarts it over D-Bus, never twice
// within the cooldown; its socket gone, the condition names the socket and
// the restart brings the socket back.
func TestRealContainerdRepair(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	needContainerd(t)
	dir, err := os.MkdirTemp("", "autopilot-health-containerd-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s, err := harness.StartSystemd(dir, containerdDropIn)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("namespaced systemd ready in %s (pid %d)", time.Since(start).Round(time.Millisecond), s.PID)
	t.Cleanup(func() { s.Stop(); os.RemoveAll(dir) })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal of containerd.service:\n%s", s.Journal("containerd.service"))
		}
	})
	first := startContainerd(t, s)
	socket := s.Root("/run/containerd/containerd.sock")

	// What the probe depends on: RuntimeReady. Without a CNI configuration
	// containerd says NetworkReady=false, which the probe ignores.
	conds := criConditions(t, socket)
	t.Logf("real containerd's CRI Status conditions: %v", conds)
	if !conds[runtimeapi.RuntimeReady] {
		t.Fatalf("containerd's RuntimeReady is false: %v", conds)
	}

	const cooldown = 2 * time.Second
	env, store := sdEnv(t, s, func(c *config.Config) {
		c.Checks.ContainerRuntimeUnhealthy.Socket = socket
		c.Checks.ContainerRuntimeUnhealthy.Interval = dur(500 * time.Millisecond)
		c.Checks.ContainerRuntimeUnhealthy.Timeout = dur(500 * time.Millisecond)
		c.Checks.ContainerRuntimeUnhealthy.RestartCooldown = dur(cooldown)
	})
	stop := runChecks(t, env, store, "ContainerRuntimeUnhealthy")
	defer stop()
	waitFor(t, store, nil, 10*time.Second, "ContainerRuntimeUnhealthy=False", condIs(store, "ContainerRuntimeUnhealthy", report.StatusFalse))
	if c, _ := store.Get("ContainerRuntimeUnhealthy"); !strings.Contains(c.Message, "RuntimeReady") {
		t.Errorf("healthy message %q", c.Message)
	}
	time.Sleep(time.Until(first.MainStart.Add(cooldown))) // the cooldown counts from the unit's start

	// 1. SIGKILL: Debian's unit has Restart=always, RestartSec=5: systemd
	// restarts containerd itself; the daemon sees the auto-restart and does
	// not restart it too.
	killedAt := time.Now()
	if err := s.KillMain(context.Background(), "containerd.service", int32(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, store, nil, 10*time.Second, "ContainerRuntimeUnhealthy=True after SIGKILL", condIs(store, "ContainerRuntimeUnhealthy", report.StatusTrue))
	c, _ := store.Get("ContainerRuntimeUnhealthy")
	t.Logf("killed: %s after the kill: %s", time.Since(killedAt).Round(time.Millisecond), c.Message)
	if !strings.Contains(c.Message, "containerd.sock") {
		t.Errorf("message after SIGKILL does not name the socket: %q", c.Message)
	}
	afterKill := waitUnit(t, s, "containerd.service", "containerd back after SIGKILL", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != first.Invocation
	})
	waitFor(t, store, nil, 15*time.Second, "ContainerRuntimeUnhealthy=False after systemd's restart", condIs(store, "ContainerRuntimeUnhealthy", report.StatusFalse))
	repairs := env.Repair.Status("containerd.service").Repairs
	t.Logf("killed: back %s after the kill (systemd restarts: %d; restarts by the daemon: %d)", afterKill.MainStart.Sub(killedAt).Round(time.Millisecond), afterKill.NRestarts, repairs)
	// The daemon restarts only a unit that systemd is not restarting; a
	// probe landing in the few ms before systemd noticed the death may
	// still restart it once, and then systemd's own restart does not come
	// (CI under load: the probe 18 ms after the kill, NRestarts 0, one
	// restart by the daemon). One restart in all, whoever made it.
	if repairs > 1 {
		t.Errorf("the daemon restarted containerd %d times while systemd was restarting it", repairs)
	}
	if n := int(afterKill.NRestarts) + repairs; n != 1 {
		t.Errorf("after SIGKILL: systemd restarted containerd %d times and the daemon %d, want one restart in all", afterKill.NRestarts, repairs)
	}

	// 2. Hung (SIGSTOP: the socket accepts, Status never answers): the
	// daemon restarts it over D-Bus. Every new invocation is stopped again
	// for a window; the restarts must respect the cooldown.
	time.Sleep(time.Until(afterKill.MainStart.Add(cooldown)))
	log := newInvocationLog(afterKill)
	stopped := map[string]bool{}
	const window = 5 * time.Second
	hungAt := time.Now()
	// The condition is sampled with the invocations: at any one instant a
	// restart may be in flight (the socket gone, "already restarting"), so
	// what is asserted is that a hung containerd was seen as one.
	var sawHung bool
	var last report.Condition
	for time.Since(hungAt) < window {
		u := log.sample(s, "containerd.service")
		if active(u) && !stopped[u.Invocation] {
			if err := s.KillMain(context.Background(), "containerd.service", int32(syscall.SIGSTOP)); err != nil {
				// The daemon's restart of the hung one began between
				// the sample and the kill (CI under load at c8d07c2):
				// the next sample sees the new invocation.
				if strings.Contains(err.Error(), "No main process") {
					continue
				}
				t.Fatal(err)
			}
			stopped[u.Invocation] = true
		}
		last, _ = store.Get("ContainerRuntimeUnhealthy")
		sawHung = sawHung || (last.Status == report.StatusTrue && strings.Contains(last.Message, "DeadlineExceeded"))
		time.Sleep(20 * time.Millisecond) // sampling invocations over a fixed window
	}
	if !sawHung {
		t.Errorf("hung: condition never True with DeadlineExceeded within %s; last %s %q", window, last.Status, last.Message)
	}
	// Let the last one run again; wait out a restart job in flight.
	s.KillMain(context.Background(), "containerd.service", int32(syscall.SIGCONT))
	waitFor(t, store, nil, 15*time.Second, "ContainerRuntimeUnhealthy=False after the hang", condIs(store, "ContainerRuntimeUnhealthy", report.StatusFalse))
	log.sample(s, "containerd.service")
	n := checkCooldown(t, "hung containerd", log.sorted(), window, cooldown)
	if got := env.Repair.Status("containerd.service").Repairs - repairs; got != n {
		t.Logf("hung containerd: the daemon counted %d restarts, %d new invocations seen", got, n)
	}

	// 3. The socket removed (containerd keeps running without it): the
	// condition names the socket and the error; the restart brings it back.
	before := waitUnit(t, s, "containerd.service", "containerd up", active)
	time.Sleep(time.Until(before.MainStart.Add(cooldown)))
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	waitFor(t, store, nil, 10*time.Second, "ContainerRuntimeUnhealthy=True without a socket", condIs(store, "ContainerRuntimeUnhealthy", report.StatusTrue))
	c, _ = store.Get("ContainerRuntimeUnhealthy")
	t.Logf("socket removed: %s", c.Message)
	if !strings.Contains(c.Message, socket) || !strings.Contains(c.Message, "no such file or directory") {
		t.Errorf("message without the socket: %q", c.Message)
	}
	waitUnit(t, s, "containerd.service", "containerd restarted by the daemon", func(u systemd.Unit) bool {
		return active(u) && u.Invocation != before.Invocation
	})
	waitFor(t, store, nil, 15*time.Second, "ContainerRuntimeUnhealthy=False with the socket back", condIs(store, "ContainerRuntimeUnhealthy", report.StatusFalse))
	if _, err := os.Stat(socket); err != nil {
		t.Errorf("socket after the restart: %v", err)
	}
	t.Logf("whole test: %s", time.Since(start).Round(time.Millisecond))
}
