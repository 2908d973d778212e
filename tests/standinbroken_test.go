//go:build integration

package tests

import (
	"os"
	"testing"
)

// A test that breaks a stand-in of the package's shared systemd and ends
// before it mends it (a t.Fatal before its os.Remove, here a subtest that
// returns) leaves it mended for the tests after it.
func TestBrokenStandinIsMendedAtTheTestsEnd(t *testing.T) {
	s := realSystemd(t)
	var broken string
	t.Run("ends with kubelet broken", func(t *testing.T) {
		broken = breakStandin(t, s, "kubelet-broken")
	})
	if _, err := os.Stat(broken); !os.IsNotExist(err) {
		os.Remove(broken)
		t.Fatalf("%s after the test that made it ended: %v (want it gone)", broken, err)
	}
}
