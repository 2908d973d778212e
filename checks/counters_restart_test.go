package checks

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// README ("Metrics (port 20257)"): at a daemon restart within the boot
// syself_node_unit_restarts resumes from the state file, and every other
// counter starts at 0 (a counter reset to Prometheus). One of each kind,
// wired as assemble.go wires them (one registry, the store as the memos):
// after two repairs and a restart, syself_node_unit_restarts{unit} is 2
// again once the unit is read, while autopilot_health_repairs_total starts
// at 0, although the repair status (status's "Repairs:", the services
// report) does carry the two repairs over.
func TestCountersAcrossADaemonRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		k := running("kubelet.service")
		k.MainStart = time.Now().Add(-time.Hour)
		m := newFakeManager(k, running("containerd.service"), running("syself-proxy.service"))
		type daemon struct {
			store *report.Store
			reg   *prometheus.Registry
			rep   *Repairer
			check Check
		}
		start := func() daemon {
			t.Helper()
			d := daemon{store: report.NewStore("boot-1"), reg: prometheus.NewRegistry()}
			if _, err := d.store.Load(dir); err != nil {
				t.Fatal(err)
			}
			env := testEnv(t, nil)
			env.Systemd = m
			env.Repair = NewRepairer(m, quietLog(), time.Now, d.reg)
			env.Units = NewUnitWatch(d.store, d.reg)
			env.Repair.SetUnitWatch(env.Units)
			env.Repair.KeepIn(d.store)
			d.rep = env.Repair
			d.check, _ = newServiceNotRecovering(env)
			return d
		}
		restarted := func(d daemon) float64 {
			return testutil.ToFloat64(d.rep.repairs.WithLabelValues("kubelet.service", RepairRestarted))
		}

		d1 := start()
		if _, err := d1.check.Probe(context.Background()); err != nil { // the first pass: the baseline read
			t.Fatal(err)
		}
		for range 2 {
			if res, _ := d1.rep.Repair(context.Background(), "kubelet.service", time.Minute, "healthz"); res != RepairRestarted {
				t.Fatalf("repair: %s", res)
			}
			d1.rep.Wait()
			time.Sleep(61 * time.Second)
		}
		if got, rep := unitRestarts(t, d1.reg, "kubelet.service"), restarted(d1); got != 2 || rep != 2 {
			t.Fatalf("before the restart: syself_node_unit_restarts %v, repairs_total{restarted} %v, want 2 and 2", got, rep)
		}
		if err := d1.store.Save(dir, time.Now()); err != nil {
			t.Fatal(err)
		}

		d2 := start()
		if _, err := d2.check.Probe(context.Background()); err != nil { // the first pass reads the unit
			t.Fatal(err)
		}
		if got := unitRestarts(t, d2.reg, "kubelet.service"); got != 2 {
			t.Errorf("syself_node_unit_restarts after the daemon's restart: %v, want 2 (resumed from the state file)", got)
		}
		if got := restarted(d2); got != 0 {
			t.Errorf("autopilot_health_repairs_total{restarted} after the daemon's restart: %v, want 0 (not restored)", got)
		}
		if st := d2.rep.Status("kubelet.service"); st.Repairs != 2 {
			t.Errorf("the repair status after the daemon's restart: %d repairs, want 2", st.Repairs)
		}
	})
}
