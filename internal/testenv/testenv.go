// Package testenv helps tests that need a part of the machine (root, a
// system tool) decide what to do when it is missing.
package testenv

import (
	"bytes"
	"os"
	"sync"
	"testing"
)

// CI reports whether the tests run in CI (CI=true), where every tier is
// meant to run.
func CI() bool { return os.Getenv("CI") == "true" }

// Skip skips the test on a developer's machine that lacks what it needs,
// and fails it in CI: there, a tier that cannot run is a broken CI machine,
// not a pass.
func Skip(t testing.TB, why string) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true and this test cannot run: %s", why)
	}
	t.Skip(why)
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes: a log handler's
// output that a test reads while the code under test still logs.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
