package daemon

import (
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// problemCounters is problem_counter's series of d, by reason.
func problemCounters(t *testing.T, d *Daemon) map[string]float64 {
	t.Helper()
	mfs, err := d.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "problem_counter" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[label(m, "reason")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// problem_counter counts problems: the spec's temp rules ("emit a one-shot
// Node event and increment the problem_counter metric") and conditions
// turning True. An operator's tamper clear is an Event on the Node, not a
// problem: it has no problem_counter series, at 0 or counted, so that the
// shipped dashboard's "Problems" panel and an alert on
// increase(problem_counter[...]) do not show a clear as a problem
// occurrence. A kernel event is counted as before.
func TestTamperClearIsNoProblem(t *testing.T) {
	d := identityDaemon(t, false)
	pc := problemCounters(t, d)
	if v, ok := pc["TaskHung"]; !ok || v != 0 {
		t.Fatalf("at the start: problem_counter{reason=\"TaskHung\"} %v (exists %v), want 0", v, ok)
	}
	if v, ok := pc[report.EventTamperCleared]; ok {
		t.Errorf("at the start: problem_counter{reason=%q} %v, want no series: a clear is no problem", report.EventTamperCleared, v)
	}
	now := time.Now()
	d.Store().Emit(report.Event{Reason: report.EventTamperCleared, Message: "NodeTampered and SealedOSTampered cleared by root: reviewed", Time: now})
	d.Store().Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:1 blocked for more than 120 seconds.", Time: now})
	pc = problemCounters(t, d)
	if v, ok := pc[report.EventTamperCleared]; ok {
		t.Errorf("after a clear: problem_counter{reason=%q} %v, want no series: a clear is no problem", report.EventTamperCleared, v)
	}
	if v := pc["TaskHung"]; v != 1 {
		t.Errorf("after a hung task: problem_counter{reason=\"TaskHung\"} %v, want 1", v)
	}
}
