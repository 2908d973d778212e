package harness

import (
	"net"
	"testing"
)

// unGivenPort returns a port free now that FreeLoopbackPort never gave
// (the kernel's pick, in its ephemeral range).
func unGivenPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// picking returns the ports in turn, then fails t.
func picking(t *testing.T, ports ...int) func() int {
	return func() int {
		if len(ports) == 0 {
			t.Fatal("freeLoopbackPortOf asked for more ports than the test has")
		}
		p := ports[0]
		ports = ports[1:]
		return p
	}
}

// FreeLoopbackPort never gives a test the shipped metrics port, free as it
// may be when asked: the deb and sysext tests (Parallel's "port20257")
// need it for their daemons at the same time, and one of them found it
// taken ("port 20257, the shipped metrics port, is taken") or read another
// daemon's /metrics there.
func TestFreeLoopbackPortIsNeverTheShippedMetricsPort(t *testing.T) {
	other := unGivenPort(t)
	p, err := freeLoopbackPortOf(picking(t, ShippedMetricsPort, other))
	if err != nil {
		t.Fatal(err)
	}
	if p != other {
		t.Errorf("freeLoopbackPortOf gave %d, want %d (the pick after %d)", p, other, ShippedMetricsPort)
	}
}

// FreeLoopbackPort gives a port once per process: free again while the
// daemon given it restarts, it is not given to another test's daemon.
func TestFreeLoopbackPortGivesAPortOnce(t *testing.T) {
	given, err := FreeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	other := unGivenPort(t)
	p, err := freeLoopbackPortOf(picking(t, given, other))
	if err != nil {
		t.Fatal(err)
	}
	if p != other {
		t.Errorf("freeLoopbackPortOf gave %d, want %d: %d was given before (free, not held by the test given it)", p, other, given)
	}
}
