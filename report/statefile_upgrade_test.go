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

// An upgrade from the previous release: state.json as the build of 535a78f
// (main at the end of 2026-12-04) wrote it for a node holding a kernel and
// a tamper condition (TestUpgradeAndRollbackKeepConditions' first run,
// bootID and paths shortened), without the parts, transitionsObserved, and
// the Events, ioErrorSuppressed and repair fields added since, is read
// whole: every condition with its transition time, the kernel log cursor
// and the tamper digest as kept values, DisksFailure's parts as the
// condition says, and no transition taken as one the store saw (the Node's
// time for the same status wins: Adopt).
func TestLoadStateOfThePreviousRelease(t *testing.T) {
	s, res := loadStateFixture(t, "state-535a78f.json")
	if res.Restored != 6 || res.Dropped != 0 {
		t.Errorf("Load = %+v, want 6 restored", res)
	}
	wantRestored(t, s, "ReadonlyFilesystem", "2026-12-05T16:12:47.635003907Z")
	wantRestored(t, s, "NodeTampered", "2026-12-05T16:12:48.588532522Z")
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || c.Reason != "DisksHealthy" {
		t.Errorf("DisksFailure %+v", c)
	}
	var cur struct {
		Seq  uint64
		Have bool
	}
	if !s.Memo("kmsg", &cur) || cur.Seq != 5291269 || !cur.Have {
		t.Errorf("kernel log cursor: %+v", cur)
	}
	var digest string
	if !s.Memo("tamper", &digest) || digest != "sha256:c1e7089d70549dfa04e1a7e98bbd4b523b073ccd0a584126f37b34860fa825be" {
		t.Errorf("tamper digest: %q", digest)
	}
	if p := s.parts["DisksFailure"]; len(p) != 2 || p["kernel-io-errors"].Reason != ReasonNoData || p["nvme-smart"].Reason != ReasonNoData {
		t.Errorf("DisksFailure parts: %+v, want both seeded, without data", p)
	}
	// The kernel log's part decides first: DisksFailure stays False since
	// its time, the SMART part not run yet.
	was, _ := s.Get("DisksFailure")
	s.SetPart(SourceKmsg, Condition{Type: "DisksFailure", Status: StatusFalse, Reason: "DisksHealthy", Message: "the kernel logged 0 disk I/O errors in the last 10m0s (threshold 5)"}, was.LastUpdateTime.Add(time.Minute))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || !c.LastTransitionTime.Equal(was.LastTransitionTime) {
		t.Errorf("DisksFailure after the kernel part: %+v, want False since %s", c, was.LastTransitionTime)
	}
	for ty, o := range s.observed {
		if o {
			t.Errorf("%s's transition taken as one the store saw", ty)
		}
	}
}
