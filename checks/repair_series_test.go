package checks

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/config"
)

// The units the daemon repairs have their repairs_total series of a
// restart and of a failure at 0 before any repair (increase() cannot see a
// series' first sample: one born at 1 hid each unit's first repair from
// the dashboard's "Repairs" panel), and a reload that renames a unit or
// disables its check removes the old unit's series, every result of them,
// where they would stand at their last value.
func TestRepairSeriesExistFromZeroAndFollowTheConfiguration(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRepairer(nil, quietLog(), time.Now, reg)
	cfg := config.Default()
	r.Repaired(RepairedUnits(cfg))
	compareRepairSeries(t, reg, "at the start",
		`autopilot_health_repairs_total{result="failed",unit="containerd.service"} 0`,
		`autopilot_health_repairs_total{result="failed",unit="kubelet.service"} 0`,
		`autopilot_health_repairs_total{result="restarted",unit="containerd.service"} 0`,
		`autopilot_health_repairs_total{result="restarted",unit="kubelet.service"} 0`,
	)

	// A repair's decision of another result, then a reload that renames
	// kubelet's unit and disables containerd's check.
	r.repairs.WithLabelValues("kubelet.service", RepairCooldown).Inc()
	cfg.Checks.KubeletUnhealthy.Unit = "kubelet2.service"
	cfg.Checks.ContainerRuntimeUnhealthy.Enabled = false
	r.Repaired(RepairedUnits(cfg))
	compareRepairSeries(t, reg, "after the reload",
		`autopilot_health_repairs_total{result="failed",unit="kubelet2.service"} 0`,
		`autopilot_health_repairs_total{result="restarted",unit="kubelet2.service"} 0`,
	)
}

// repairsHelp is the family's help text, as registered.
func repairsHelp(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "autopilot_health_repairs_total" {
			return mf.GetHelp()
		}
	}
	t.Fatal("no autopilot_health_repairs_total family")
	return ""
}

// A restart still running when a reload renames its unit (or disables its
// check: an operator turning the repair off while it acts) counts its
// result when its job ends: the old unit's series, removed by the reload,
// must not come back then, at 1, left on the page until the next reload.
// Before, the restart's goroutine made the series again (fails with the
// check in countRepair removed).
func TestRepairInFlightAcrossAReloadLeavesNoSeriesOfTheOldUnit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		u := running("kubelet.service")
		u.MainStart = time.Now().Add(-time.Hour)
		m := gatedManager{newFakeManager(u), make(chan struct{}), make(chan struct{})}
		close(m.state)
		r := NewRepairer(m, quietLog(), time.Now, reg)
		cfg := config.Default()
		r.Repaired(RepairedUnits(cfg))
		if res, _ := r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed"); res != RepairRestarted {
			t.Fatalf("repair: %s, want %s", res, RepairRestarted)
		}
		synctest.Wait() // the restart's job waits for the test
		cfg.Checks.KubeletUnhealthy.Unit = "kubelet2.service"
		r.Repaired(RepairedUnits(cfg))
		close(m.restart)
		r.Wait()
		compareRepairSeries(t, reg, "after the restart begun before the reload ended",
			`autopilot_health_repairs_total{result="failed",unit="containerd.service"} 0`,
			`autopilot_health_repairs_total{result="failed",unit="kubelet2.service"} 0`,
			`autopilot_health_repairs_total{result="restarted",unit="containerd.service"} 0`,
			`autopilot_health_repairs_total{result="restarted",unit="kubelet2.service"} 0`,
		)
		if st := r.Status("kubelet.service"); st.Repairs != 1 {
			t.Errorf("the restart itself: status %+v, want it recorded", st)
		}
		// A unit no reload dropped counts, also before Repaired names it
		// (a reload's Apply starts the renamed unit's check first), and a
		// unit named again counts again.
		newUnit := running("kubelet3.service")
		newUnit.MainStart = time.Now().Add(-time.Hour)
		m.set(newUnit)
		r.Repair(context.Background(), "kubelet3.service", time.Minute, "healthz failed")
		cfg.Checks.KubeletUnhealthy.Unit = "kubelet.service"
		r.Repaired(RepairedUnits(cfg))
		r.Repair(context.Background(), "kubelet.service", time.Minute, "healthz failed")
		r.Wait()
		for _, s := range []struct{ unit, result string }{{"kubelet3.service", RepairRestarted}, {"kubelet.service", RepairCooldown}} {
			if n := testutil.ToFloat64(r.repairs.WithLabelValues(s.unit, s.result)); n != 1 {
				t.Errorf("%s's %s: %v, want 1", s.unit, s.result, n)
			}
		}
	})
}

// compareRepairSeries fails the test, saying when, unless reg's
// autopilot_health_repairs_total holds exactly series (in the exposition
// format, sorted as the registry sorts them).
func compareRepairSeries(t *testing.T, reg *prometheus.Registry, when string, series ...string) {
	t.Helper()
	want := "# HELP autopilot_health_repairs_total " + repairsHelp(t, reg) + "\n# TYPE autopilot_health_repairs_total counter\n" + strings.Join(series, "\n") + "\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autopilot_health_repairs_total"); err != nil {
		t.Errorf("%s: %v", when, err)
	}
}
