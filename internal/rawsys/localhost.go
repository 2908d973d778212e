package rawsys

import (
	"context"
	"net"
	"strings"
	"time"
)

// DialFunc is a dial function: net.Dialer's DialContext, Dial, DialWith's.
type DialFunc = func(ctx context.Context, network, address string) (net.Conn, error)

// DialLocal returns dial, except that a localhost name (localhost, a name
// under .localhost, either with a final dot) is loopback without a lookup
// (RFC 6761 §6.3): 127.0.0.1 first, then ::1 (a "tcp4" or "tcp6" network
// only its own). Go's resolver does not make the name special: it reads
// /etc/hosts and, where the name is not there, asks the DNS servers, a
// question off the node at each new connection (of a probe that followed
// the tunnel agent's redirect to localhost, checks'
// TestProbeReachesLocalhostWithoutALookup; of the connection to an API
// server a kubeconfig names as localhost, report/kube's
// TestAPIServerAtLocalhostWithoutALookup). Only the address dialled
// changes: a TLS client above still verifies the server's certificate
// against the name it was given (localhost), not against the loopback
// address. ::1 is dialled as net.Dialer dials a name's two families (Happy
// Eyeballs, RFC 8305): at once when 127.0.0.1 failed, else LocalFallback
// after it, both then in flight, the first connection taken; a 127.0.0.1
// whose SYNs are dropped does not take the probe's whole time
// (TestDialLocalDoesNotWaitOutABlackholedLoopback). The error of a failed
// dial is the first address's (127.0.0.1's where both were tried).
func DialLocal(dial DialFunc) DialFunc {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(address)
		if err != nil || !IsLocalhostName(host) {
			return dial(ctx, network, address)
		}
		return dialLoopback(ctx, dial, network, address, port)
	}
}

// dialLoopback dials a localhost name's address by dial: DialLocal.
func dialLoopback(ctx context.Context, dial DialFunc, network, address, port string) (net.Conn, error) {
	switch network {
	case "tcp":
	case "tcp4":
		return dial(ctx, network, net.JoinHostPort("127.0.0.1", port))
	case "tcp6":
		return dial(ctx, network, net.JoinHostPort("::1", port))
	default:
		return dial(ctx, network, address)
	}
	type dialed struct {
		c     net.Conn
		err   error
		first bool
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan dialed, 2) // buffered: a loser never blocks
	try := func(ip string, first bool) {
		c, err := dial(ctx, network, net.JoinHostPort(ip, port))
		results <- dialed{c, err, first}
	}
	go try("127.0.0.1", true)
	fallback := time.NewTimer(LocalFallback)
	defer fallback.Stop()
	var firstErr, secondErr error
	started, pending := false, 1
	for {
		select {
		case <-fallback.C:
			if !started {
				started, pending = true, pending+1
				go try("::1", false)
			}
			continue
		case r := <-results:
			pending--
			if r.err == nil {
				if pending > 0 {
					// The other is still in flight: cancel it and close
					// what it may yet connect.
					go func() {
						if o := <-results; o.c != nil {
							o.c.Close()
						}
					}()
				}
				return r.c, nil
			}
			if r.first {
				firstErr = r.err
			} else {
				secondErr = r.err
			}
		}
		if !started && ctx.Err() == nil {
			started, pending = true, pending+1
			go try("::1", false)
		}
		if pending == 0 {
			if firstErr == nil {
				firstErr = secondErr
			}
			return nil, firstErr
		}
	}
}

// LocalFallback is how long dialLocal waits on 127.0.0.1 before it dials
// ::1 beside it: net.Dialer's default FallbackDelay for a name's two
// families.
const LocalFallback = 300 * time.Millisecond

// IsLocalhostName reports whether host is localhost or a name under
// .localhost (in any case, with or without a final dot): RFC 6761 §6.3's
// names, always loopback.
func IsLocalhostName(host string) bool {
	h := strings.TrimSuffix(host, ".")
	return strings.EqualFold(h, "localhost") ||
		(len(h) > len(".localhost") && strings.EqualFold(h[len(h)-len(".localhost"):], ".localhost"))
}
