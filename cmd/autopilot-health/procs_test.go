package main

import (
	"runtime"
	"testing"
)

// The daemon runs on one P unless GOMAXPROCS is set in its environment
// (README, Cost); an operator's GOMAXPROCS is left as it is.
func TestLimitProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(4)
	t.Setenv("GOMAXPROCS", "")
	if got := limitProcs(); got != 1 {
		t.Errorf("GOMAXPROCS unset: %d Ps, want 1", got)
	}
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "3")
	if got := limitProcs(); got != 3 {
		t.Errorf("GOMAXPROCS=3: %d Ps, want 3", got)
	}
}
