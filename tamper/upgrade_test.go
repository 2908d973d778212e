package tamper

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// loadFixture loads the state file testdata/name the way the daemon does at
// start (Keeper.Load, boot-1), and returns the keeper and Load's error.
func loadFixture(t *testing.T, name string) (*Keeper, string, error) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StateFileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	k := NewKeeper(dir, "boot-1", false)
	return k, dir, k.Load(t0.Add(time.Hour))
}

// An upgrade: tamper.json as the first build wrote it (3c089ea: no
// baseline scope, no tolerated changes, no retake) is read whole, its
// findings and baseline kept (a baseline without a scope is compared
// everywhere).
func TestStateOfTheFirstBuild(t *testing.T) {
	k, _, err := loadFixture(t, "tamper-3c089ea.json")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	st := k.State()
	if len(st.FindingsFor(CondNode)) != 1 || len(st.FindingsFor(CondSealed)) != 1 || len(st.Findings) != 2 {
		t.Errorf("findings: %+v, want the file's two", st.Findings)
	}
	if st.Baseline == nil || st.Baseline.BootID != "boot-1" || len(st.Baseline.Entries) != 1 {
		t.Fatalf("baseline: %+v", st.Baseline)
	}
	if _, ok := st.Baseline.Scope(); ok {
		t.Error("a baseline without patterns has a scope")
	}
	if st.Sealed == nil || st.Sealed.Recorded["root"] == "" {
		t.Errorf("recorded hashes first seen: %+v", st.Sealed)
	}
}

// A rollback: tamper.json as a newer build writes it, with fields this
// build does not know (a newer build adds fields without raising the
// version), is read for what this build knows. Refusing it moved the file
// aside: the SealedOSTampered finding was lost and NodeTampered was set
// (BaselineCorrupt) on every node rolled back.
func TestStateOfANewerBuildWithNewFields(t *testing.T) {
	k, dir, err := loadFixture(t, "tamper-newer-fields.json")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	st := k.State()
	if fs := st.FindingsFor(CondSealed); len(fs) != 1 || fs[0].Kind != HashMismatch {
		t.Errorf("SealedOSTampered findings: %+v, want the file's", fs)
	}
	if fs := st.FindingsFor(CondNode); len(fs) != 0 {
		t.Errorf("NodeTampered findings: %+v, want none", fs)
	}
	if st.Baseline == nil || st.Baseline.Digest != "sha256:030d0070b354c0f7ccb9b018ad28eae5539ca595482f1fc3b2fe9834cc8a631f" {
		t.Errorf("baseline: %+v", st.Baseline)
	}
	if _, err := os.Stat(filepath.Join(dir, StateFileName+".corrupt")); err == nil {
		t.Error("moved aside")
	}
}

// A rollback over a change of the format (a higher version): the file is
// moved aside and is a BaselineCorrupt finding, as any file this build
// cannot read, but its findings are kept (they keep their meaning in every
// version), so a rollback never drops a finding.
func TestStateOfAHigherVersionKeepsItsFindings(t *testing.T) {
	k, dir, err := loadFixture(t, "tamper-version-2.json")
	var ce *CorruptError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("Load: %v, want a CorruptError naming version 2", err)
	}
	if _, err := os.Stat(filepath.Join(dir, StateFileName+".corrupt")); err != nil {
		t.Errorf("not moved aside: %v", err)
	}
	st := k.State()
	if fs := st.FindingsFor(CondSealed); len(fs) != 1 || fs[0].Kind != HashMismatch || fs[0].Path != "root" {
		t.Errorf("SealedOSTampered findings: %+v, want the file's", fs)
	}
	fs := st.FindingsFor(CondNode)
	if len(fs) != 2 || fs[0].Kind != Modified || fs[1].Kind != Corrupt {
		t.Errorf("NodeTampered findings: %+v, want the file's, then baseline-corrupt", fs)
	}
	if st.Baseline != nil {
		t.Errorf("baseline of a version not known kept: %+v", st.Baseline)
	}
	// Saved at once: a restart before the next finding keeps them.
	s, err := LoadState(dir)
	if err != nil || s == nil || len(s.Findings) != 3 {
		t.Errorf("saved state: %+v, %v; want the three findings", s, err)
	}
}

// A read-only keeper (`autopilot-health check` beside the daemon) that
// cannot read the daemon's tamper.json, here one of a higher version (the
// daemon newer than the binary asked), leaves it where it is and adds no
// finding: the file is the daemon's, and what the one-shot check cannot
// read is no evidence of tampering.
func TestReadOnlyKeeperLeavesAFileItCannotRead(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "tamper-version-2.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	k := NewKeeper(dir, "boot-1", true)
	if err := k.Load(t0.Add(time.Hour)); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("Load: %v, want the error naming version 2", err)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != string(b) {
		t.Errorf("the daemon's tamper.json was not left as it was: %v", err)
	}
	if m, _ := filepath.Glob(p + ".corrupt*"); len(m) > 0 {
		t.Errorf("a read-only keeper moved the file aside: %v", m)
	}
	if fs := k.State().Findings; len(fs) != 0 {
		t.Errorf("findings of a file a read-only keeper cannot read: %+v", fs)
	}
}
