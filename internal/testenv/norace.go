//go:build !race

package testenv

// Race is true when the race detector is built in: it allocates on its
// own, so tests that bound a call's allocations skip those bounds.
const Race = false
