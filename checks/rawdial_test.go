package checks

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The dials of the probes of services absent from a node (kube-proxy's
// and the tunnel agent's metrics on 127.0.0.1, every 10 s; cilium-agent's
// socket, every 30 s) make no ordinary system call of their own
// (rawsys.Dial): the 18 a minute the idle benchmark's daemon made there
// (README, "The ordinary system calls left") do not wake the runtime's
// monitor thread. Left: the stat of cilium-agent's socket before its
// connect (keptSocket.dial), 1. Each count is the fewest of three.
func TestAbsentServicesProbeDialsMakeNoOrdinarySystemCall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	k := &keptSocket{path: filepath.Join(t.TempDir(), "cilium", "cilium.sock")}
	for _, d := range []struct {
		name string
		dial func() error
		want int64
	}{
		{"the scrape probes' dialLocal of " + refused, func() error { _, err := dialLocal(context.Background(), "tcp", refused); return err }, 0},
		{"cilium-agent's kept socket, absent", func() error { _, err := k.dial(context.Background(), "", ""); return err }, 1},
	} {
		least := int64(-1)
		for range 3 {
			var err error
			n := testenv.ThreadOrdinarySyscalls(t, func() { err = d.dial() })
			if err == nil {
				t.Fatalf("%s: connected", d.name)
			}
			if least < 0 || n < least {
				least = n
			}
		}
		if least != d.want {
			t.Errorf("%s: %d ordinary system calls, want %d", d.name, least, d.want)
		}
	}
}
