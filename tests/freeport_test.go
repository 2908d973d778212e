//go:build integration

package tests

import "testing"

// freeLoopbackPort never gives a test the shipped metrics port, free as it
// may be when asked: the deb and sysext tests (harness.Parallel's
// "port20257") need it for their daemons at the same time, and one of
// them found it taken ("port 20257, the shipped metrics port, is taken")
// or read another daemon's /metrics there.
func TestFreeLoopbackPortIsNeverTheShippedMetricsPort(t *testing.T) {
	other := freeTCPPort(t)
	picks := []int{shippedMetricsPort, other}
	p, err := freeLoopbackPortOf(func() int { p := picks[0]; picks = picks[1:]; return p })
	if err != nil {
		t.Fatal(err)
	}
	if p != other {
		t.Errorf("freeLoopbackPortOf gave %d, want %d (the pick after %d)", p, other, shippedMetricsPort)
	}
}
