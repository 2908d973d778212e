// Package testenv helps tests that need a part of the machine (root, a
// system tool) decide what to do when it is missing.
package testenv

import (
	"os"
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
