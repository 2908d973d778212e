package report

import (
	"slices"
	"testing"
	"time"
)

// redateRecorder records what the store told a Redater.
type redateRecorder struct {
	recorder
	redated []string
}

func (r *redateRecorder) TransitionRedated(c Condition, was time.Time, from string) {
	r.redated = append(r.redated, c.Type+" "+from+" "+was.Format(time.TimeOnly)+">"+c.LastTransitionTime.Format(time.TimeOnly))
}

// A transition time read back from the Node or the state file that lies in
// the future was written while the clock was ahead (an RTC that ran ahead,
// before chrony's makestep stepped it back; a VM resumed with a wrong
// clock). Taken over as it was, "True for N s" timers (a MachineHealthCheck's
// unhealthyConditions timeout, Prometheus' `for:`, now - lastTransitionTime)
// did not start until the clock caught up, and the Node's word won over a
// fresher local state by a time no one can order. Such a time is taken as
// now (status and reason kept, the change told once per condition), and
// orders nothing: when the statuses differ, the local state keeps its word.
func TestAFutureTransitionTimeIsTakenAsNow(t *testing.T) {
	now := t0.Add(time.Hour) // the clock, stepped back an hour since the writes
	ahead := now.Add(time.Hour)
	dir := t.TempDir()
	writeStateFile(t, dir, stateFile{Version: stateVersion, BootID: "b", SavedAt: ahead,
		Conditions: []Condition{
			{Type: "ClockNotSynchronized", Status: StatusTrue, Reason: "ClockUnsynchronized", LastTransitionTime: ahead, LastUpdateTime: ahead},
			{Type: "CNIUnhealthy", Status: StatusFalse, Reason: "CNIHealthy", LastTransitionTime: t0, LastUpdateTime: now.Add(-5 * time.Minute)},
		},
	})
	s := NewStore("b")
	s.SetBootStart(t0)
	s.SetClock(func() time.Time { return now })
	rec := &redateRecorder{}
	s.Observe(rec)
	if _, err := s.Load(dir); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Get("ClockNotSynchronized"); c.Status != StatusTrue || c.Reason != "ClockUnsynchronized" ||
		!c.LastTransitionTime.Equal(now) || !c.LastUpdateTime.Equal(now) {
		t.Errorf("ClockNotSynchronized from the state file = %+v; want True since %v", c, now)
	}

	node := func(ty string, st Status, reason Reason) Condition {
		return Condition{Type: ty, Status: st, Reason: reason, Message: "from the node", LastTransitionTime: ahead}
	}
	// Not in the store: taken over since now.
	if !s.Adopt(node("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh"), "b") {
		t.Error("DiskUsageHigh from the Node not adopted")
	}
	if c, _ := s.Get("DiskUsageHigh"); c.Status != StatusTrue || c.Reason != "FilesystemSpaceHigh" || !c.LastTransitionTime.Equal(now) {
		t.Errorf("DiskUsageHigh = %+v; want True since %v", c, now)
	}
	// A kernel condition held for this boot: taken over since now.
	if !s.Adopt(node("KernelDeadlock", StatusTrue, ReasonCriticalTaskHung), "b") {
		t.Error("KernelDeadlock from the Node not adopted")
	}
	if c, _ := s.Get("KernelDeadlock"); c.Status != StatusTrue || !c.LastTransitionTime.Equal(now) {
		t.Errorf("KernelDeadlock = %+v; want True since %v", c, now)
	}
	// Another status in the state file, evaluated five minutes ago: the
	// Node's time orders nothing; the local state keeps its word.
	if s.Adopt(node("CNIUnhealthy", StatusTrue, ReasonCiliumNotOk), "b") {
		t.Error("the Node's True dated in the future replaced the state file's False")
	}
	if c, _ := s.Get("CNIUnhealthy"); c.Status != StatusFalse {
		t.Errorf("CNIUnhealthy = %+v; want the state file's False", c)
	}
	// A time within the slack is kept as it is.
	near := now.Add(futureSlack)
	if !s.Adopt(Condition{Type: "ReadonlyFilesystem", Status: StatusFalse, Reason: "FilesystemIsNotReadOnly", LastTransitionTime: near}, "b") {
		t.Error("ReadonlyFilesystem from the Node not adopted")
	}
	if c, _ := s.Get("ReadonlyFilesystem"); !c.LastTransitionTime.Equal(near) {
		t.Errorf("ReadonlyFilesystem = %+v; want since %v", c, near)
	}
	want := []string{
		"ClockNotSynchronized state file 12:00:00>11:00:00",
		"DiskUsageHigh node 12:00:00>11:00:00",
		"KernelDeadlock node 12:00:00>11:00:00",
	}
	if len(rec.redated) != len(want) {
		t.Fatalf("redated %q; want %q", rec.redated, want)
	}
	for i := range want {
		if rec.redated[i] != want[i] {
			t.Errorf("redated %q; want %q", rec.redated, want)
			break
		}
	}
}

// A condition read from the Node without a transition time (edited by
// hand, or written so by an earlier build) is taken as now when the store
// has none of it, the Redaters told, and replaces no time the store has:
// the store's time for the same status stays, and is written next.
func TestAdoptDatesANodeConditionWithoutATransitionTime(t *testing.T) {
	now := t0.Add(time.Hour)
	s := NewStore("b")
	s.SetBootStart(t0)
	s.SetClock(func() time.Time { return now })
	rec := &redateRecorder{}
	s.Observe(rec)
	s.SetRun(Condition{Type: "DiskUsageHigh", Status: StatusFalse, Reason: "DiskUsageOK"}, t0, t0)

	if s.Adopt(Condition{Type: "DiskUsageHigh", Status: StatusFalse, Reason: "DiskUsageOK"}, "b") {
		t.Error("the Node's DiskUsageHigh without a transition time changed the store's")
	}
	if c, _ := s.Get("DiskUsageHigh"); !c.LastTransitionTime.Equal(t0) {
		t.Errorf("DiskUsageHigh since %v after the Node's word without a time; want the store's %v", c.LastTransitionTime, t0)
	}
	if !s.Adopt(Condition{Type: "CNIUnhealthy", Status: StatusFalse, Reason: "CNIHealthy"}, "b") {
		t.Error("CNIUnhealthy from the Node not adopted")
	}
	if c, _ := s.Get("CNIUnhealthy"); c.Status != StatusFalse || !c.LastTransitionTime.Equal(now) {
		t.Errorf("CNIUnhealthy from the Node without a transition time = %+v; want False since %v", c, now)
	}
	if want := []string{"CNIUnhealthy node 00:00:00>11:00:00"}; !slices.Equal(rec.redated, want) {
		t.Errorf("redated %q; want %q", rec.redated, want)
	}
}
