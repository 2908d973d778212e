package harness

import (
	"path/filepath"
	"testing"
)

// Two systemds whose directories end alike ("ns", as most tests name
// theirs) run in cgroups of their own: one shared cgroup had each remove
// the other's units' cgroups when they ran at once.
func TestCgroupNameIsEachDirectorysOwn(t *testing.T) {
	a := filepath.Join(t.TempDir(), "ns")
	b := filepath.Join(t.TempDir(), "ns")
	if cgroupName(a) == cgroupName(b) {
		t.Fatalf("%s and %s share the cgroup %s", a, b, cgroupName(a))
	}
	if cgroupName(a) != cgroupName(a) {
		t.Fatalf("one directory, two cgroup names")
	}
}
