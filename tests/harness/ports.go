package harness

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
)

// ShippedMetricsPort is the shipped configuration's metrics port (:20257),
// which the deb and sysext tests' daemons listen on in the host's network
// namespace while they hold Parallel's "port20257": a free port given to
// another Parallel test's daemon must not be it, or theirs cannot bind it.
const ShippedMetricsPort = 20257

// givenPorts are the ports FreeLoopbackPort gave in this process: a port
// is free only while nothing holds it, and a daemon restarted by its test
// (a kill, a watchdog, a reload that fails) or a port refused for a while
// (Proxy.Refuse, StopKubeAPIServer) is free until its next bind, where a
// test asking then was given the same port, and one of the two could not
// listen.
var givenPorts = struct {
	sync.Mutex
	m map[int]bool
}{m: map[int]bool{}}

// FreeLoopbackPort returns a port of 127.0.0.1 that is free now, for a
// listener to take later or to take again after a pause: below the
// kernel's ephemeral range (32768-60999 by default), where a bind to port
// 0 and the outgoing connections of everything else on the machine would
// otherwise take it in between; never ShippedMetricsPort; never one it gave
// before in this process.
func FreeLoopbackPort() (int, error) {
	lo, hi := belowEphemeral()
	return freeLoopbackPortOf(func() int { return lo + rand.IntN(hi-lo) })
}

// belowEphemeral is the ports FreeLoopbackPort picks from, lo to hi-1:
// 20000-31999 where the kernel's ephemeral range starts at 32768 (its
// default), else the 12000 ports below where it starts (1024 at the
// lowest): a machine set to start it lower has the ports kept below it.
func belowEphemeral() (lo, hi int) {
	hi = min(32000, EphemeralStart())
	return max(1024, hi-12000), hi
}

// EphemeralStart is the lowest port of the kernel's ephemeral range
// (ip_local_port_range), the ports a bind to port 0 and an outgoing
// connection are given; 32768, the kernel's default, where it cannot be
// read.
func EphemeralStart() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var l, h int
		if _, err := fmt.Sscan(string(b), &l, &h); err == nil && l > 1024 {
			return l
		}
	}
	return 32768
}

// freeLoopbackPortOf is FreeLoopbackPort with the ports to try from pick.
func freeLoopbackPortOf(pick func() int) (int, error) {
	givenPorts.Lock()
	defer givenPorts.Unlock()
	for range 100 {
		p := pick()
		if p == ShippedMetricsPort || givenPorts.m[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err == nil {
			l.Close()
			givenPorts.m[p] = true
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free loopback port below the ephemeral range")
}
