package checks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// stoppedBy is what a shutdown leaves of a unit: inactive, its stop done.
func stoppedBy(name string) systemd.Unit {
	return systemd.Unit{Name: name, LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Result: "success"}
}

// switchable serves an HTTP endpoint that answers with ok until stop is
// called (the service the shutdown stopped), then refuses connections.
func switchable(t *testing.T, ok http.HandlerFunc) (url string, stop func()) {
	t.Helper()
	srv := httptest.NewServer(ok)
	t.Cleanup(srv.Close)
	return srv.URL, srv.Close
}

// At shutdown or reboot systemd stops the units in reverse order: kubelet,
// containerd, the operability units and the peers the checks probe stop
// before this daemon (ordered Before=kubelet.service), whose last write on
// SIGTERM puts its conditions on the Node for as long as the node is off.
// What a run finds in between (KubeletUnhealthy=True "kubelet.service is
// stopped", NodeServiceDown=True, ...) is not a failure: while systemd's
// SystemState is "stopping" every condition keeps its last state (status,
// reason, message, transition time), and nothing is restarted. Once the
// system is not shutting down (here: the state set back), the same finding
// is recorded. A healthy run, and a run that finds what the condition
// already says, never ask systemd (the cost at idle).
func TestConditionsKeepTheirStateWhileSystemdShutsDown(t *testing.T) {
	for _, tc := range []struct {
		name string
		cond string
		// setup configures env and returns what the shutdown does to the
		// check's service and unit.
		setup func(t *testing.T, env *Env, m *fakeManager) (shutdown func())
		want  report.Reason // the condition once recorded, True
	}{
		{name: "stop job", cond: "KubeletUnhealthy", want: report.ReasonKubeletHealthzFailed, setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			url, stop := switchable(t, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
			env.Config.Checks.KubeletUnhealthy.HealthzURL = url + "/healthz"
			return func() {
				stop()
				u := running("kubelet.service")
				u.ActiveState, u.SubState, u.Job, u.JobType = "deactivating", "stop-sigterm", 31, "stop"
				m.set(u)
			}
		}},
		{name: "stopped", cond: "KubeletUnhealthy", want: report.ReasonKubeletHealthzFailed, setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			url, stop := switchable(t, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
			env.Config.Checks.KubeletUnhealthy.HealthzURL = url + "/healthz"
			return func() { stop(); m.set(stoppedBy("kubelet.service")) }
		}},
		{cond: "ContainerRuntimeUnhealthy", want: report.ReasonCRIProbeFailed, setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			var down atomic.Bool
			env.Config.Checks.ContainerRuntimeUnhealthy.Socket = serveCRI(t, func(context.Context) (*runtimeapi.StatusResponse, error) {
				if down.Load() {
					return nil, errors.New("shutting down")
				}
				return conditions(&runtimeapi.RuntimeCondition{Type: "RuntimeReady", Status: true}), nil
			})
			return func() {
				// Its stop timed out: failed, which the repair restarts
				// when the system is not shutting down.
				down.Store(true)
				u := running("containerd.service")
				u.ActiveState, u.SubState, u.Result, u.MainStart = "failed", "failed", "timeout", time.Now().Add(-time.Hour)
				m.set(u)
			}
		}},
		{cond: "NodeServiceDown", want: report.ReasonUnitNotActive, setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			return func() { m.set(stoppedBy("syself-tunnel-agent.service")) }
		}},
		{cond: "ServiceNotRecovering", want: report.ReasonUnitFailed, setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			return func() {
				// Its stop timed out; systemd restarts nothing at shutdown.
				u := running("syself-proxy.service")
				u.ActiveState, u.SubState, u.Result = "failed", "failed", "timeout"
				m.set(u)
			}
		}},
		{cond: "TunnelDisconnected", want: report.ReasonTunnelMetricsUnreachable, setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			srv, conns := standinAgent(t)
			conns.WithLabelValues().Set(2)
			env.Config.Checks.TunnelDisconnected.MetricsURL = srv.URL + "/metrics"
			return func() { srv.Close(); m.set(stoppedBy("syself-tunnel-agent.service")) }
		}},
		{cond: "ProxyNotServing", want: "ProxyUnreachable", setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			url, stop := switchable(t, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "# TYPE ready gauge\nready 1\n") })
			env.Config.Checks.ProxyNotServing.MetricsURL = url + "/metrics"
			return func() { stop(); m.set(stoppedBy("syself-proxy.service")) }
		}},
		{cond: "CNIUnhealthy", want: "CiliumUnreachable", setup: func(t *testing.T, env *Env, m *fakeManager) func() {
			sock := filepath.Join(t.TempDir(), "cilium.sock")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, `{"cilium":{"state":"Ok","msg":""}}`)
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			env.Config.Checks.CNIUnhealthy.Socket = sock
			return func() { srv.Close() }
		}},
	} {
		name := tc.cond
		if tc.name != "" {
			name += "/" + tc.name
		}
		t.Run(name, func(t *testing.T) {
			m := newFakeManager(running("kubelet.service"), running("containerd.service"), running("syself-proxy.service"), running("syself-tunnel-agent.service"))
			env := snrEnv(t, m)
			env.Config.Runner.FirstRunSpread = config.Duration{}
			shutdown := tc.setup(t, env, m)
			store := report.NewStore("b")
			r, err := NewRunner(env, Options{Store: store, Only: []string{tc.cond}})
			if err != nil {
				t.Fatal(err)
			}
			run := func() report.Condition {
				t.Helper()
				r.RunOnce(t.Context())
				env.Repair.Wait()
				c, _ := store.Get(tc.cond)
				return c
			}
			healthy := run()
			if healthy.Status != report.StatusFalse {
				t.Fatalf("before the shutdown: %+v", healthy)
			}
			if again := run(); again.Status != report.StatusFalse || m.reads() != 0 {
				t.Fatalf("healthy runs read SystemState %d times (%+v)", m.reads(), again)
			}

			m.setState("stopping")
			shutdown()
			for range 2 {
				if c := run(); c.Status != healthy.Status || c.Reason != healthy.Reason || c.Message != healthy.Message || !c.LastTransitionTime.Equal(healthy.LastTransitionTime) {
					t.Errorf("while systemd shuts down: %s %s %q, want it kept: %s %s %q", c.Status, c.Reason, c.Message, healthy.Status, healthy.Reason, healthy.Message)
				}
			}
			if n := m.restartCount(); n != 0 {
				t.Errorf("%d restarts while systemd shuts down", n)
			}
			if m.reads() == 0 {
				t.Error("SystemState never read")
			}

			// Not shutting down (the same finding at any other time):
			// recorded, once; a run that finds it again reads nothing.
			m.setState("running")
			if c := run(); c.Status != report.StatusTrue || c.Reason != tc.want {
				t.Errorf("when not shutting down: %s %s %q, want True %s", c.Status, c.Reason, c.Message, tc.want)
			}
			reads := m.reads()
			run()
			if n := m.reads() - reads; n != 0 {
				t.Errorf("a run that changes nothing read SystemState %d times", n)
			}
		})
	}
}

// stopOnRead is a manager whose SystemState read is cut short by the
// daemon's own stop (SIGTERM ends the runner's context during the read).
type stopOnRead struct {
	*fakeManager
	stop context.CancelFunc
}

func (m stopOnRead) SystemState(ctx context.Context) (string, error) {
	m.stop()
	<-ctx.Done()
	return "", ctx.Err()
}

// A change whose SystemState read the daemon's stop cuts short is not
// recorded: the runner records nothing once it is stopping, and the
// daemon's last write must not carry what a shutdown caused.
func TestChangeCutShortByTheDaemonsStopIsNotRecorded(t *testing.T) {
	status := report.StatusFalse
	probe := probeFunc(func(context.Context) (Result, error) {
		if status == report.StatusFalse {
			return Result{Status: report.StatusFalse, Reason: report.ReasonNodeServicesActive, Message: "active"}, nil
		}
		return Result{Status: report.StatusTrue, Reason: report.ReasonUnitNotActive, Message: "syself-tunnel-agent.service is not active (inactive/dead)"}, nil
	})
	env := testEnv(t, nil)
	ctx, stop := context.WithCancel(t.Context())
	env.Systemd = stopOnRead{newFakeManager(), stop}
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Only: []string{"NodeServiceDown"}, Factories: map[string]Factory{"NodeServiceDown": fixed(probe)}})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(ctx)
	status = report.StatusTrue
	r.RunOnce(ctx)
	if ctx.Err() == nil {
		t.Fatal("SystemState was not read")
	}
	if c, _ := store.Get("NodeServiceDown"); c.Status != report.StatusFalse {
		t.Errorf("recorded during the daemon's stop: %+v", c)
	}
}

// A tamper finding is recorded even while systemd shuts the system down:
// no shutdown stops what NodeTampered watches, and a finding made then
// (a file changed on the way down) is never hidden. systemd is not asked.
func TestTamperFindingIsRecordedWhileSystemdShutsDown(t *testing.T) {
	found := false
	probe := probeFunc(func(context.Context) (Result, error) {
		if !found {
			return Result{Status: report.StatusFalse, Reason: report.ReasonNodeIntact, Message: "intact"}, nil
		}
		return Result{Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged, Message: "/var/lib/kubelet/config.yaml changed"}, nil
	})
	m := newFakeManager()
	m.setState("stopping")
	env := testEnv(t, nil)
	env.Systemd = m
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Only: []string{"NodeTampered"}, Factories: map[string]Factory{"NodeTampered": fixed(probe)}})
	if err != nil {
		t.Fatal(err)
	}
	r.RunOnce(t.Context())
	found = true
	r.RunOnce(t.Context())
	if c, _ := store.Get("NodeTampered"); c.Status != report.StatusTrue || c.Reason != report.ReasonProtectedFileChanged {
		t.Errorf("while systemd shuts down: %+v, want the finding", c)
	}
	if m.reads() != 0 {
		t.Errorf("SystemState read %d times", m.reads())
	}
}

// A failure that stays the same asks systemd nothing, even when its
// message is longer than the Node's cap (report.MaxMessageLen: the store
// keeps a condition's message cut, the probe says it whole at every run):
// a node with many units down, or a long error, must not cost a D-Bus call
// at every run. The same for a part (DisksFailure's NVMe SMART), which
// the store keeps as the probe said it.
func TestLongMessageThatStaysTheSameReadsNoSystemState(t *testing.T) {
	for _, tc := range []struct {
		cond   string
		reason report.Reason
	}{
		{"NodeServiceDown", report.ReasonUnitNotActive},
		{"DisksFailure", report.ReasonNVMeCriticalWarning},
	} {
		long := "not what it should be: " + strings.Repeat("x", 2*report.MaxMessageLen)
		probe := probeFunc(func(context.Context) (Result, error) {
			return Result{Status: report.StatusTrue, Reason: tc.reason, Message: long}, nil
		})
		m := newFakeManager()
		env := testEnv(t, nil)
		env.Systemd = m
		store := report.NewStore("b")
		r, err := NewRunner(env, Options{Store: store, Only: []string{tc.cond}, Factories: map[string]Factory{tc.cond: fixed(probe)}})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			r.RunOnce(t.Context())
		}
		if c, _ := store.Get(tc.cond); c.Status != report.StatusTrue || !strings.HasSuffix(c.Message, "...(truncated)") {
			t.Fatalf("%s: recorded %s %q, want True, its message cut", tc.cond, c.Status, c.Message)
		}
		if n := m.reads(); n != 0 {
			t.Errorf("%s: 3 runs of the same failure read SystemState %d times, want 0", tc.cond, n)
		}
	}
}
