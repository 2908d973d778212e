package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A condition restored with a reason this build does not know (a rollback
// past an added reason, an upgrade past a renamed one) is never shown,
// written to the Node or counted with that reason, but its status and
// lastTransitionTime are kept for the first evaluation: a True that stays
// True keeps the time its watchers (a MachineHealthCheck's timeout, an
// alert's `for:`) have been timing.
func TestUnknownReasonKeepsTheTransitionTimeOfATrue(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	node := Condition{Type: "ServiceNotRecovering", Status: StatusTrue, Reason: "UnitSomethingNew", Message: "kubelet.service: new", LastTransitionTime: since}
	now := t0.Add(time.Minute)
	eachRestoreSource(t, now, node, "b", func(t *testing.T, s *Store, fromState func() LoadResult, fromNode func() bool) {
		if res := fromState(); res.Restored != 0 {
			t.Fatalf("Load = %+v", res)
		}
		if fromNode() {
			t.Error("Adopt of a reason this build does not know changed the store")
		}
		// Never shown as current with a reason this build cannot name.
		if c, ok := s.Get("ServiceNotRecovering"); ok || len(s.All()) != 0 {
			t.Fatalf("the unknown reason is current: %+v", c)
		}
		s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFailed, "kubelet.service failed"), now)
		if c, _ := s.Get("ServiceNotRecovering"); !c.LastTransitionTime.Equal(since) || c.Reason != ReasonUnitFailed {
			t.Errorf("True stayed True: lastTransitionTime %v, want %v (reason %s)", c.LastTransitionTime, since, c.Reason)
		}
	})
}

// A different status at the first evaluation is a real transition: now.
func TestUnknownReasonAnotherStatusIsATransition(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	now := t0.Add(time.Minute)
	s := NewStore("b")
	s.SetClock(func() time.Time { return now })
	s.Adopt(Condition{Type: "ServiceNotRecovering", Status: StatusTrue, Reason: "UnitSomethingNew", LastTransitionTime: since}, "b")
	s.Set(cond("ServiceNotRecovering", StatusFalse, ReasonCriticalUnitsRecovering, ""), now)
	if c, _ := s.Get("ServiceNotRecovering"); !c.LastTransitionTime.Equal(now) {
		t.Errorf("True to False: lastTransitionTime %v, want now %v", c.LastTransitionTime, now)
	}
	// Spent: a later True is a transition of its own.
	s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFailed, ""), now.Add(time.Minute))
	if c, _ := s.Get("ServiceNotRecovering"); !c.LastTransitionTime.Equal(now.Add(time.Minute)) {
		t.Errorf("False to True: lastTransitionTime %v, want %v", c.LastTransitionTime, now.Add(time.Minute))
	}
}

// Until the first evaluation, a save writes the condition back as it was
// read (a restart before the first run keeps it, a rollback to the build
// that knows the reason finds it); the first evaluation replaces it.
func TestUnknownReasonIsSavedBackAsReadUntilTheFirstSet(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	raw := Condition{Type: "ServiceNotRecovering", Status: StatusTrue, Reason: "UnitSomethingNew", Message: "m",
		LastTransitionTime: since, LastUpdateTime: t0}
	dir := t.TempDir()
	b, _ := json.Marshal(stateFile{Version: stateVersion, BootID: "b", SavedAt: t0, Conditions: []Condition{raw}})
	os.WriteFile(filepath.Join(dir, StateFileName), b, 0o644)
	now := t0.Add(time.Minute)
	s := NewStore("b")
	s.SetClock(func() time.Time { return now })
	s.Load(dir)
	if err := s.Save(dir, now); err != nil {
		t.Fatal(err)
	}
	var sf stateFile
	b, _ = os.ReadFile(filepath.Join(dir, StateFileName))
	if err := json.Unmarshal(b, &sf); err != nil || len(sf.Conditions) != 1 || sf.Conditions[0] != raw {
		t.Fatalf("saved before the first Set: %+v, %v; want %+v", sf.Conditions, err, raw)
	}
	// A restart before the first run keeps it.
	s = NewStore("b")
	s.SetClock(func() time.Time { return now })
	s.Load(dir)
	s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFlapping, ""), now)
	if c, _ := s.Get("ServiceNotRecovering"); !c.LastTransitionTime.Equal(since) {
		t.Errorf("after a restart before the first run: lastTransitionTime %v, want %v", c.LastTransitionTime, since)
	}
	s.Save(dir, now)
	b, _ = os.ReadFile(filepath.Join(dir, StateFileName))
	if strings.Contains(string(b), "UnitSomethingNew") || !strings.Contains(string(b), string(ReasonUnitFlapping)) {
		t.Errorf("saved after the first Set:\n%s", b)
	}
}

// The Node read after the first run: its time for the same status is taken
// as for a reason this build knows (the store's reason kept); another
// status with a reason this build cannot name changes nothing.
func TestUnknownReasonOnTheNodeAfterTheFirstSet(t *testing.T) {
	since := t0.Add(-3 * time.Hour)
	now := t0.Add(time.Minute)
	s := NewStore("b")
	s.SetClock(func() time.Time { return now })
	s.Set(cond("ServiceNotRecovering", StatusTrue, ReasonUnitFailed, ""), now)
	s.Set(cond("DiskUsageHigh", StatusFalse, ReasonDiskUsageOK, ""), now)
	if !s.Adopt(Condition{Type: "ServiceNotRecovering", Status: StatusTrue, Reason: "UnitSomethingNew", LastTransitionTime: since}, "b") {
		t.Error("the Node's time for the same status not taken")
	}
	if c, _ := s.Get("ServiceNotRecovering"); !c.LastTransitionTime.Equal(since) || c.Reason != ReasonUnitFailed {
		t.Errorf("ServiceNotRecovering = %+v, want since %v with reason UnitFailed", c, since)
	}
	if s.Adopt(Condition{Type: "DiskUsageHigh", Status: StatusTrue, Reason: "Renamed", LastTransitionTime: t0.Add(30 * time.Second)}, "b") {
		t.Error("another status with an unknown reason changed the store")
	}
	if c, _ := s.Get("DiskUsageHigh"); c.Status != StatusFalse || c.Reason != ReasonDiskUsageOK {
		t.Errorf("DiskUsageHigh = %+v", c)
	}
	if len(s.Aside()) != 0 {
		t.Errorf("Aside = %v", s.Aside())
	}
}

// A condition no longer evaluated here (Remove) is not saved back.
func TestUnknownReasonRemoved(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, StateFileName), []byte(`{"version":1,"bootID":"b","conditions":[
	 {"type":"DiskUsageHigh","status":"True","reason":"Renamed","lastTransitionTime":"2026-12-01T07:00:00Z"}]}`), 0o644)
	s := NewStore("b")
	s.Load(dir)
	s.Remove("DiskUsageHigh")
	s.Save(dir, t0)
	b, _ := os.ReadFile(filepath.Join(dir, StateFileName))
	if strings.Contains(string(b), "Renamed") || len(s.Aside()) != 0 {
		t.Errorf("saved after Remove:\n%s", b)
	}
}

// A tamper condition (held True until an operator's clear) restored with a
// reason this build does not know, from the state file or the Node: its
// check's first runs without the findings (tamper.json lost or refused, a
// baseline taken again: Unknown, then False) do not lower it, as they do
// not lower one restored with a reason this build knows. It stays True,
// since the other build's time, under this build's first reason for it and
// with the other build's reason in its message.
func TestUnknownReasonTamperTrueIsHeld(t *testing.T) {
	since := t0.Add(-30 * time.Hour)
	node := Condition{Type: "NodeTampered", Status: StatusTrue, Reason: "ProtectedFileReplaced", Message: "/var/lib/kubelet/config.yaml replaced", LastTransitionTime: since}
	now := t0.Add(time.Minute)
	eachRestoreSource(t, now, node, "a", func(t *testing.T, s *Store, fromState func() LoadResult, fromNode func() bool) {
		fromState()
		s.Set(cond("NodeTampered", StatusUnknown, ReasonBaselinePending, "this boot's baseline is being taken"), now)
		fromNode()
		s.Set(cond("NodeTampered", StatusFalse, ReasonNodeIntact, "no protected file changed"), now.Add(time.Minute))
		c, _ := s.Get("NodeTampered")
		if c.Status != StatusTrue || c.Reason != ReasonProtectedFileChanged || !c.LastTransitionTime.Equal(since) ||
			!strings.Contains(c.Message, "config.yaml replaced") || !strings.Contains(c.Message, "ProtectedFileReplaced") {
			t.Errorf("after Unknown and False runs: %s/%s since %v (%q), want True/ProtectedFileChanged since %v with the other build's reason and message",
				c.Status, c.Reason, c.LastTransitionTime, c.Message, since)
		}
	})
}

// restoreSources are the ways a condition saved by another build comes
// back at the start: from the state file and the Node, the state file
// only, the Node only.
var restoreSources = []struct {
	name            string
	fromState, node bool
}{{"state file and Node", true, true}, {"state file only", true, false}, {"Node only", false, true}}

// eachRestoreSource runs f once for each of restoreSources, as a subtest,
// with a new store of boot "b" whose clock says now: fromState loads a state
// file of boot that holds c (a LoadResult of nothing where the source has no
// state file), fromNode adopts c as the Node of boot holds it (false where
// the source has no Node); f calls each once, in the order it tests.
func eachRestoreSource(t *testing.T, now time.Time, c Condition, boot string, f func(t *testing.T, s *Store, fromState func() LoadResult, fromNode func() bool)) {
	for _, tc := range restoreSources {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore("b")
			s.SetClock(func() time.Time { return now })
			f(t, s, func() LoadResult {
				if !tc.fromState {
					return LoadResult{}
				}
				return loadOne(t, s, boot, c)
			}, func() bool { return tc.node && s.Adopt(c, boot) })
		})
	}
}

// loadOne loads into s a state file of boot, saved at t0, that holds c as
// the Node holds it, with lastUpdateTime t0.
func loadOne(t *testing.T, s *Store, boot string, c Condition) LoadResult {
	t.Helper()
	dir := t.TempDir()
	state := `{"version":1,"bootID":"` + boot + `","savedAt":"` + t0.Format(time.RFC3339) + `","conditions":[
	 {"type":"` + c.Type + `","status":"` + string(c.Status) + `","reason":"` + string(c.Reason) + `","message":"` + c.Message + `","lastTransitionTime":"` +
		c.LastTransitionTime.Format(time.RFC3339) + `","lastUpdateTime":"` + t0.Format(time.RFC3339) + `"}]}`
	if err := os.WriteFile(filepath.Join(dir, StateFileName), []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := s.Load(dir)
	if err != nil {
		t.Fatalf("Load = %+v, %v", res, err)
	}
	return res
}
