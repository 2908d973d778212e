package report

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Remove drops a condition: the observers that are Removers are told (the
// metrics drop its series), Changed fires, and the state file no longer
// holds it.
func TestRemove(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	s := NewStore("b")
	m := NewMetrics("test")
	s.Observe(m)
	m.InitConditions([]string{"NodeInfoStale", "DiskUsageHigh"})
	s.Set(Condition{Type: "NodeInfoStale", Status: StatusTrue, Reason: ReasonNodeInfoOutdated}, t0)
	s.Set(Condition{Type: "DiskUsageHigh", Status: StatusFalse, Reason: ReasonDiskUsageOK}, t0)
	changed := s.Changed()
	if !s.Remove("NodeInfoStale") {
		t.Fatal("Remove of a held condition reported none")
	}
	select {
	case <-changed:
	default:
		t.Error("Changed did not fire")
	}
	if _, ok := s.Get("NodeInfoStale"); ok {
		t.Error("still in the store")
	}
	if s.Remove("NodeInfoStale") {
		t.Error("a second Remove reported a condition")
	}
	// DiskUsageHigh's series are left: 3 statuses, a gauge per problem reason.
	d, _ := Lookup("DiskUsageHigh")
	if n := testutil.CollectAndCount(m.conditionStatus); n != 3 {
		t.Errorf("%d condition_status series left, want DiskUsageHigh's 3", n)
	}
	if n := testutil.CollectAndCount(m.problemGauge); n != len(d.ProblemReasons) {
		t.Errorf("%d problem_gauge series left, want DiskUsageHigh's %d", n, len(d.ProblemReasons))
	}
	dir := t.TempDir()
	if err := s.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	s2 := NewStore("b")
	if _, err := s2.Load(dir); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.Get("NodeInfoStale"); ok {
		t.Error("the state file still holds the removed condition")
	}
	if _, ok := s2.Get("DiskUsageHigh"); !ok {
		t.Error("the state file lost DiskUsageHigh")
	}
}

// RemovePart drops one source's part and sets the condition from the rest;
// the last part removed removes the condition.
func TestRemovePart(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	s := NewStore("b")
	s.SetPart(SourceKmsg, Condition{Type: "DisksFailure", Status: StatusFalse, Reason: ReasonDisksHealthy, Message: "no I/O errors"}, t0)
	s.SetPart(SourceCheck, Condition{Type: "DisksFailure", Status: StatusTrue, Reason: "NVMeCriticalWarning", Message: "nvme0 critical warning"}, t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue {
		t.Fatalf("with the check's True part: %+v", c)
	}
	if !s.RemovePart(SourceCheck, "DisksFailure", t0.Add(time.Minute)) {
		t.Error("RemovePart changed nothing")
	}
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || c.Message != "no I/O errors" {
		t.Errorf("after the check's part was removed: %+v", c)
	}
	if s.RemovePart(SourceCheck, "DisksFailure", t0) {
		t.Error("removing a part not there changed the condition")
	}
	s.RemovePart(SourceKmsg, "DisksFailure", t0)
	if c, ok := s.Get("DisksFailure"); ok {
		t.Errorf("no part left, still held: %+v", c)
	}
}
