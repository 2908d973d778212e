package daemon

import (
	"net"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/report"
)

// gauges are the values of a gauge family's series in a gather, by the
// value of one label, among the series whose other label has a value.
func gauges(t *testing.T, d *Daemon, name, key, where, is string) map[string]float64 {
	t.Helper()
	mfs, err := d.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label(m, where) == is {
				out[label(m, key)] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// identityDaemon is a daemon, not running, on a node whose role and GPU
// are detected (none fixed by the configuration), with the kernel log
// monitor: a worker, with a GPU or not.
func identityDaemon(t *testing.T, gpu bool) *Daemon {
	t.Helper()
	cfg := testConfig(t)
	cfg.Kmsg.Enabled = true
	cfg.Role, cfg.GPU = "", "auto"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := quietLog()
	env := &checks.Env{Config: cfg, NodeName: cfg.NodeName, Role: report.RoleWorker, GPU: gpu, Log: log, Sys: halfFull{checks.RealSys()}, Now: time.Now}
	d, err := New(cfg, log, Options{Version: "test", Listener: ln, Env: env, BootID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return d
}

// agreeWithStore fails the test unless the gauges of each condition say
// what the store holds (README, Metrics: condition_status "1 for the
// status each condition has, including Unknown", problem_gauge "1 while a
// condition is True with that reason", every reason's series there).
func agreeWithStore(t *testing.T, d *Daemon, step string, conds ...string) {
	t.Helper()
	for _, typ := range conds {
		c, ok := d.Store().Get(typ)
		if !ok {
			t.Fatalf("%s: %s not in the store", step, typ)
		}
		st := gauges(t, d, "autopilot_health_condition_status", "status", "condition", typ)
		for _, s := range []report.Status{report.StatusTrue, report.StatusFalse, report.StatusUnknown} {
			want := 0.0
			if s == c.Status {
				want = 1
			}
			if got, ok := st[string(s)]; !ok || got != want {
				t.Errorf("%s: %s is %s %s, condition_status{status=%q} %v (exists %v), want %v", step, typ, c.Status, c.Reason, s, got, ok, want)
			}
		}
		desc, _ := report.Lookup(typ)
		pg := gauges(t, d, "problem_gauge", "reason", "type", typ)
		for _, r := range desc.ProblemReasons {
			want := 0.0
			if c.Status == report.StatusTrue && c.Reason == r {
				want = 1
			}
			if got, ok := pg[string(r)]; !ok || got != want {
				t.Errorf("%s: %s is %s %s, problem_gauge{reason=%q} %v (exists %v), want %v", step, typ, c.Status, c.Reason, r, got, ok, want)
			}
		}
	}
}

// A condition the store keeps while it does not apply to the node's new
// role or GPU (set aside Unknown / NotApplicable, or held True until the
// reboot) keeps gauges that say so when the role or GPU changes back: the
// series of the conditions that apply again were made anew at 0 over
// their values, so that a worker-only condition set aside on a control
// plane node showed no status at all once the node was a worker again,
// until its check's next run (up to runner.first_run_spread and its
// interval), and a GPU-only condition held True showed problem_gauge 0
// while the Node had it True.
func TestIdentityChangedBackKeepsTheGaugesOfTheHeldConditions(t *testing.T) {
	d := identityDaemon(t, true)
	// ProxyNotServing as its check's run on the worker left it, and a GPU
	// that fell off the bus.
	d.Store().Set(report.Condition{Type: "ProxyNotServing", Status: report.StatusFalse, Reason: report.ReasonProxyServing, Message: "ready"}, time.Now())
	d.Store().Set(report.Condition{Type: "GpuFallenOffBus", Status: report.StatusTrue, Reason: report.ReasonGpuFellOffBus, Message: "GPU 0000:3b:00.0 has fallen off the bus"}, time.Now())
	agreeWithStore(t, d, "a GPU worker", "ProxyNotServing", "GpuFallenOffBus")

	d.replanIdentity(report.RoleControlPlane, "test", true, "test")
	if c, _ := d.Store().Get("ProxyNotServing"); c.Reason != report.ReasonNotApplicable {
		t.Fatalf("on a control plane node: ProxyNotServing %s %s, want it set aside", c.Status, c.Reason)
	}
	agreeWithStore(t, d, "a control plane node", "ProxyNotServing", "GpuFallenOffBus")
	d.replanIdentity(report.RoleWorker, "test", true, "test")
	agreeWithStore(t, d, "a worker again, before the check's first run", "ProxyNotServing", "GpuFallenOffBus")

	// The GPU gone from the detection (a GPU that fell off the bus may
	// leave the PCI bus) and back: GpuFallenOffBus is held True all along.
	d.replanIdentity(report.RoleWorker, "test", false, "test")
	if c, _ := d.Store().Get("GpuFallenOffBus"); c.Status != report.StatusTrue {
		t.Fatalf("the GPU no longer detected: GpuFallenOffBus %s, want it held True", c.Status)
	}
	agreeWithStore(t, d, "the GPU no longer detected", "GpuFallenOffBus")
	d.replanIdentity(report.RoleWorker, "test", true, "test")
	agreeWithStore(t, d, "the GPU detected again", "GpuFallenOffBus")
}

// A GPU detected after the start (README, "a GPU may be added or
// activated later") makes the series of its kernel log condition at 0,
// as a start on a GPU node does: problem_counter{reason="GpuFellOffBus"}
// so that increase() sees the first time the GPU falls off the bus, and
// GpuFallenOffBus's problem_gauge. The daemon made them with the kernel
// log monitor still on the node without a GPU, which evaluated no
// GpuFallenOffBus then, so they were never made.
func TestGPUDetectedAfterTheStartMakesItsConditionSeries(t *testing.T) {
	d := identityDaemon(t, false)
	if _, ok := gauges(t, d, "problem_gauge", "reason", "type", "GpuFallenOffBus")[string(report.ReasonGpuFellOffBus)]; ok {
		t.Fatal("no GPU, yet GpuFallenOffBus has a problem_gauge series")
	}
	d.replanIdentity(report.RoleWorker, "test", true, "test")
	if _, ok := d.Store().Get("GpuFallenOffBus"); !ok {
		t.Fatal("the GPU detected after the start: GpuFallenOffBus not evaluated")
	}
	counter, ok := 0.0, false
	mfs, err := d.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "problem_counter" && label(m, "reason") == string(report.ReasonGpuFellOffBus) {
				counter, ok = m.GetCounter().GetValue(), true
			}
		}
	}
	if !ok || counter != 0 {
		t.Errorf("the GPU detected after the start: problem_counter{reason=%q} %v (exists %v), want 0", report.ReasonGpuFellOffBus, counter, ok)
	}
	agreeWithStore(t, d, "the GPU detected after the start", "GpuFallenOffBus")
}
