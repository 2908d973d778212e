package report

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsExposition(t *testing.T) {
	m := NewMetrics("v1.2.3")
	m.InitConditions([]string{"DiskUsageHigh", "ClockNotSynchronized"})
	m.InitEvents([]string{"TaskHung"})
	s := NewStore("b")
	s.Observe(m)

	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var 96%"), t0.Add(time.Minute)) // no new occurrence
	s.Set(cond("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", ""), t0)
	s.Set(cond("ClockNotSynchronized", StatusFalse, "ClockSynchronized", ""), t0.Add(time.Minute))
	s.Emit(Event{Reason: "TaskHung", Message: "x", Time: t0})
	s.Emit(Event{Reason: "TaskHung", Message: "y", Time: t0})
	m.CheckRun("DiskUsageHigh", ResultProblem, 20*time.Millisecond)
	m.CheckRun("ClockNotSynchronized", ResultTimeout, 5*time.Second)

	want := `
# HELP problem_counter Number of times a specific type of problem has occurred (events, and conditions turning True).
# TYPE problem_counter counter
problem_counter{reason="ClockUnsynchronized"} 1
problem_counter{reason="FilesystemSpaceHigh"} 1
problem_counter{reason="TaskHung"} 2
# HELP problem_gauge Whether a specific type of problem is affecting the node (1) or not (0).
# TYPE problem_gauge gauge
problem_gauge{reason="ClockErrorTooLarge",type="ClockNotSynchronized"} 0
problem_gauge{reason="ClockUnsynchronized",type="ClockNotSynchronized"} 0
problem_gauge{reason="FilesystemInodesHigh",type="DiskUsageHigh"} 0
problem_gauge{reason="FilesystemSpaceHigh",type="DiskUsageHigh"} 1
problem_gauge{reason="ThinPoolSpaceHigh",type="DiskUsageHigh"} 0
problem_gauge{reason="VolumeGroupSpaceHigh",type="DiskUsageHigh"} 0
# HELP autopilot_health_condition_status Current status of each condition the daemon owns: 1 for the status it has, 0 for the others.
# TYPE autopilot_health_condition_status gauge
autopilot_health_condition_status{condition="ClockNotSynchronized",status="False"} 1
autopilot_health_condition_status{condition="ClockNotSynchronized",status="True"} 0
autopilot_health_condition_status{condition="ClockNotSynchronized",status="Unknown"} 0
autopilot_health_condition_status{condition="DiskUsageHigh",status="False"} 0
autopilot_health_condition_status{condition="DiskUsageHigh",status="True"} 1
autopilot_health_condition_status{condition="DiskUsageHigh",status="Unknown"} 0
# HELP autopilot_health_check_runs_total Check runs by result: ok, problem, error, timeout, panic.
# TYPE autopilot_health_check_runs_total counter
autopilot_health_check_runs_total{check="ClockNotSynchronized",result="timeout"} 1
autopilot_health_check_runs_total{check="DiskUsageHigh",result="problem"} 1
`
	if err := testutil.GatherAndCompare(m.Gatherer(), strings.NewReader(want),
		"problem_counter", "problem_gauge", "autopilot_health_condition_status", "autopilot_health_check_runs_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(m.Gatherer(), "autopilot_health_check_duration_seconds"); err != nil || n != 2 {
		t.Errorf("check_duration_seconds has %d series, want 2 (%v)", n, err)
	}
	mfs, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "autopilot_health_build_info" {
			for _, l := range mf.Metric[0].Label {
				found = found || (l.GetName() == "version" && l.GetValue() == "v1.2.3")
			}
		}
	}
	if !found {
		t.Error("autopilot_health_build_info{version=\"v1.2.3\"} missing")
	}
	if problems, err := testutil.GatherAndLint(m.Gatherer()); err != nil || len(problems) > 0 {
		// problem_counter/problem_gauge keep NPD's names on purpose.
		for _, p := range problems {
			if p.Metric != "problem_counter" && p.Metric != "problem_gauge" {
				t.Errorf("lint %s: %s", p.Metric, p.Text)
			}
		}
	}
}

func TestRestoredTrueIsNotCountedAgain(t *testing.T) {
	dir := t.TempDir()
	s := NewStore("b")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	if err := s.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics("x")
	s2 := NewStore("b")
	s2.Observe(m)
	s2.Load(dir)
	if v := testutil.ToFloat64(m.problemGauge.WithLabelValues("DiskUsageHigh", "FilesystemSpaceHigh")); v != 1 {
		t.Errorf("restored True: problem_gauge = %v, want 1", v)
	}
	if n := testutil.CollectAndCount(m.problemCounter); n != 0 {
		t.Errorf("restoring counted %d problem occurrences again", n)
	}
}
