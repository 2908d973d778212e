package report

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// loadStateFixture loads testdata/name as the state file of boot1.
func loadStateFixture(t *testing.T, name string) (*Store, LoadResult) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StateFileName), b, 0o644); err != nil {
		t.Fatal(err)
	}
	s := NewStore("boot1")
	res, err := s.Load(dir)
	if err != nil || res.Corrupt != nil {
		t.Fatalf("Load = %+v, %v", res, err)
	}
	return s, res
}

// wantRestored checks that condType was restored True with its
// transition time.
func wantRestored(t *testing.T, s *Store, condType, at string) {
	t.Helper()
	c, ok := s.Get(condType)
	want, _ := time.Parse(time.RFC3339, at)
	if !ok || c.Status != StatusTrue || !c.LastTransitionTime.Equal(want) {
		t.Errorf("%s restored as %+v (%v), want True since %s", condType, c, ok, at)
	}
}

// An upgrade: state.json as the build of 3dea3fa wrote it (no parts, no
// transitionsObserved) is read whole: every condition with its transition
// time, the kept values, and DisksFailure's parts as the condition says
// (the part that reports first does not decide alone).
func TestLoadStateOfAnOlderBuild(t *testing.T) {
	s, res := loadStateFixture(t, "state-3dea3fa.json")
	if res.Restored != 3 || res.Dropped != 0 {
		t.Errorf("Load = %+v, want 3 restored", res)
	}
	wantRestored(t, s, "DiskUsageHigh", "2026-12-01T09:00:00Z")
	wantRestored(t, s, "DisksFailure", "2026-12-01T09:30:00Z")
	wantRestored(t, s, "KernelDeadlock", "2026-12-01T09:45:00Z")
	var cur struct{ Seq int }
	if !s.Memo("kmsg/cursor", &cur) || cur.Seq != 4711 {
		t.Errorf("kept value: %+v", cur)
	}
	if len(s.parts["DisksFailure"]) != 2 || len(s.restoredParts["DisksFailure"]) != 2 {
		t.Errorf("DisksFailure parts: %+v (restored %v), want both, seeded", s.parts["DisksFailure"], s.restoredParts["DisksFailure"])
	}
}

// A rollback: state.json as a newer build might write it, with fields this
// build does not know (top level, in a condition, in a part, in a kept
// value), is read for what it knows, not moved aside.
func TestLoadStateOfANewerBuild(t *testing.T) {
	s, res := loadStateFixture(t, "state-newer-fields.json")
	if res.Restored != 2 || res.Dropped != 0 {
		t.Errorf("Load = %+v, want 2 restored", res)
	}
	wantRestored(t, s, "DiskUsageHigh", "2026-12-01T09:00:00Z")
	wantRestored(t, s, "DisksFailure", "2026-12-01T09:30:00Z")
	if !s.observed["DiskUsageHigh"] {
		t.Error("DiskUsageHigh's transition not observed")
	}
	if p := s.parts["DisksFailure"]; p["kernel-io-errors"].Status != StatusTrue || p["nvme-smart"].Status != StatusFalse {
		t.Errorf("DisksFailure parts: %+v", p)
	}
	var cur struct{ Seq int }
	if !s.Memo("kmsg/cursor", &cur) || cur.Seq != 4711 {
		t.Errorf("kept value: %+v", cur)
	}
}
