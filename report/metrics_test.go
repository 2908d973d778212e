package report

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
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
# HELP problem_counter Number of times a specific type of problem has occurred (events, and conditions turning True or True with a new reason).
# TYPE problem_counter counter
problem_counter{reason="ClockErrorTooLarge"} 0
problem_counter{reason="ClockUnsynchronized"} 1
problem_counter{reason="FilesystemInodesHigh"} 0
problem_counter{reason="FilesystemSpaceHigh"} 1
problem_counter{reason="TaskHung"} 2
problem_counter{reason="ThinPoolSpaceHigh"} 0
problem_counter{reason="VolumeGroupSpaceHigh"} 0
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

// problem_gauge is 1 only while the condition is True with that reason,
// however the condition got where it is: restored True from the state file,
// then the Node's later False adopted at start (a save that failed before
// the stop), then the same False from the next run; or restored True and
// True again with another reason.
func TestProblemGaugeFollowsAdoptedCondition(t *testing.T) {
	dir := t.TempDir()
	s := NewStore("b")
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/var"), t0)
	s.Set(cond("ClockNotSynchronized", StatusTrue, "ClockUnsynchronized", "off"), t0)
	if err := s.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics("x")
	m.InitConditions([]string{"DiskUsageHigh", "ClockNotSynchronized"})
	s2 := NewStore("b")
	s2.Observe(m)
	s2.Load(dir)
	gauge := func(typ, reason string) float64 {
		return testutil.ToFloat64(m.problemGauge.WithLabelValues(typ, reason))
	}
	if v := gauge("DiskUsageHigh", "FilesystemSpaceHigh"); v != 1 {
		t.Fatalf("restored True: problem_gauge = %v, want 1", v)
	}
	later := Condition{Type: "DiskUsageHigh", Status: StatusFalse, Reason: ReasonDiskUsageOK, LastTransitionTime: t0.Add(5 * time.Minute)}
	if !s2.Adopt(later, "") {
		t.Fatal("the Node's later False was not adopted")
	}
	if v := gauge("DiskUsageHigh", "FilesystemSpaceHigh"); v != 0 {
		t.Errorf("after adopting the Node's False: problem_gauge{FilesystemSpaceHigh} = %v, want 0", v)
	}
	s2.Set(cond("DiskUsageHigh", StatusFalse, ReasonDiskUsageOK, "ok"), t0.Add(6*time.Minute))
	if v := gauge("DiskUsageHigh", "FilesystemSpaceHigh"); v != 0 {
		t.Errorf("after the next run's False: problem_gauge{FilesystemSpaceHigh} = %v, want 0", v)
	}
	// True with another reason: the old one goes to 0, the new one to 1.
	s2.Set(cond("ClockNotSynchronized", StatusTrue, "ClockErrorTooLarge", "far"), t0.Add(time.Minute))
	if a, b := gauge("ClockNotSynchronized", "ClockUnsynchronized"), gauge("ClockNotSynchronized", "ClockErrorTooLarge"); a != 0 || b != 1 {
		t.Errorf("True with a new reason: problem_gauge old %v new %v, want 0 and 1", a, b)
	}
}

// A check that stopped (a reload disabled it) leaves the metrics: its runs,
// durations and loop progress are gone from the next scrape, the cached
// exposition's as from promhttp's, while the other checks' stay; started
// again, it makes its series anew, from 0.
func TestRemoveCheckAndLoop(t *testing.T) {
	m := NewMetrics("v1")
	ours := m.Handler(nil)
	theirs := promhttp.HandlerFor(m.Gatherer(), promhttp.HandlerOpts{})
	for _, c := range []string{"AAA", "NodeInfoStale", "ZZZ"} {
		m.CheckRun(c, ResultOK, time.Millisecond)
		m.CheckRun(c, ResultProblem, time.Millisecond)
		m.LoopProgress("check/"+c, time.Unix(1700000000, 0))
	}
	gone := []string{`check="NodeInfoStale"`, `loop="check/NodeInfoStale"`}
	served := func(step string) string {
		t.Helper()
		want, _ := scrape(t, theirs, "", "")
		for _, enc := range []string{"", "gzip"} {
			if got, _ := scrape(t, ours, "", enc); stable(got) != stable(want) {
				t.Fatalf("%s, Accept-Encoding %q: served\n%s\npromhttp serves\n%s", step, enc, stable(got), stable(want))
			}
		}
		return want
	}
	page := served("before") // the texts are cached now
	for _, s := range gone {
		if !strings.Contains(page, s) {
			t.Fatalf("before: no %s:\n%s", s, page)
		}
	}
	m.RemoveCheck("NodeInfoStale")
	m.RemoveLoop("check/NodeInfoStale")
	m.RemoveCheck("NeverRan") // no series: nothing to do
	m.RemoveLoop("check/NeverRan")
	page = served("removed")
	for _, s := range gone {
		if strings.Contains(page, s) {
			t.Errorf("removed: %s still served:\n%s", s, page)
		}
	}
	for _, s := range []string{`autopilot_health_check_runs_total{check="AAA",result="ok"} 1`, `autopilot_health_check_duration_seconds_count{check="ZZZ"} 2`, `loop="check/ZZZ"`} {
		if !strings.Contains(page, s) {
			t.Errorf("removed: another check's %s is gone:\n%s", s, page)
		}
	}
	m.CheckRun("NodeInfoStale", ResultOK, time.Millisecond)
	m.LoopProgress("check/NodeInfoStale", time.Unix(1700000100, 0))
	page = served("started again")
	for _, s := range []string{
		`autopilot_health_check_runs_total{check="NodeInfoStale",result="ok"} 1`,
		`autopilot_health_check_duration_seconds_count{check="NodeInfoStale"} 1`,
		`autopilot_health_loop_last_progress_timestamp_seconds{loop="check/NodeInfoStale"} 1.7000001e+09`,
	} {
		if !strings.Contains(page, s) {
			t.Errorf("started again: no %s:\n%s", s, page)
		}
	}
	if strings.Contains(page, `check_runs_total{check="NodeInfoStale",result="problem"}`) {
		t.Errorf("started again: the run before the stop is still counted:\n%s", page)
	}
}

// problem_counter has a series at 0 for every problem reason of every
// condition that applies, as for every event reason (and as
// node-problem-detector makes them for every rule, perm and temp): a
// series that first appears at 1 is no increase to Prometheus, so an
// alert or the dashboard's increase(problem_counter[1h]) would miss the
// first time a condition turns True. The served text, cached before, has
// them as well.
func TestProblemCounterOfEachConditionReasonStartsAtZero(t *testing.T) {
	m := NewMetrics("v1")
	ours := m.Handler(nil)
	scrape(t, ours, "", "") // cached before the conditions are initialised
	m.InitConditions([]string{"ServiceNotRecovering", "ReadonlyFilesystem"})
	page, _ := scrape(t, ours, "", "")
	for _, r := range []string{"UnitFailed", "UnitFlapping", "RepairNotHelping", "FilesystemIsReadOnly"} {
		if want := `problem_counter{reason="` + r + `"} 0`; !strings.Contains(page, want) {
			t.Errorf("no %s before the first problem:\n%s", want, page)
		}
	}
	if strings.Contains(page, `reason="CriticalUnitsRecovering"`) || strings.Contains(page, `reason="FilesystemIsNotReadOnly"`) {
		t.Errorf("a healthy reason has a problem series:\n%s", page)
	}
	// A condition no longer evaluated drops them, as it drops its gauges.
	m.ConditionRemoved(Condition{Type: "ReadonlyFilesystem", Status: StatusFalse, Reason: ReasonFilesystemIsNotReadOnly})
	page, _ = scrape(t, ours, "", "")
	if strings.Contains(page, `reason="FilesystemIsReadOnly"`) {
		t.Errorf("removed condition: its problem series are still served:\n%s", page)
	}
	if !strings.Contains(page, `problem_counter{reason="UnitFailed"} 0`) {
		t.Errorf("removing a condition dropped another's series:\n%s", page)
	}
}

// A condition that stays True with another problem reason is an occurrence
// of that problem: problem_counter counts it, as node-problem-detector
// counts a condition whose reason changed. A unit that flapped and then
// failed (systemd's start limit) is ServiceNotRecovering, UnitFlapping and
// then UnitFailed: an alert on increase(problem_counter{reason="UnitFailed"})
// must fire. A new message alone is not a new occurrence.
func TestProblemCounterCountsANewReasonWhileTrue(t *testing.T) {
	m := NewMetrics("v1")
	m.InitConditions([]string{"ServiceNotRecovering"})
	s := NewStore("b")
	s.Observe(m)
	s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFlapping, "kubelet.service restarted 3 times"), t0)
	s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFlapping, "kubelet.service restarted 4 times"), t0.Add(time.Minute))
	s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFailed, "kubelet.service failed"), t0.Add(2*time.Minute))
	count := func(r Reason) float64 { return testutil.ToFloat64(m.problemCounter.WithLabelValues(string(r))) }
	if f, u := count(ReasonUnitFlapping), count(ReasonUnitFailed); f != 1 || u != 1 {
		t.Errorf("problem_counter UnitFlapping %v, UnitFailed %v; want 1 and 1", f, u)
	}
}
