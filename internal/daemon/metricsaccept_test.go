package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// failingAccepts is a real TCP listener whose first n Accepts fail with err,
// as the kernel's accept4 fails them: Linux passes a connection's pending
// network error (EPROTO, ENETUNREACH, EHOSTUNREACH, ...) to accept, and fails
// it with ENOMEM or ENOBUFS under memory pressure (accept(2)).
type failingAccepts struct {
	net.Listener
	n   atomic.Int32
	err error
}

func (l *failingAccepts) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: l.err}
	}
	return l.Listener.Accept()
}

// An accept that fails is no reason to stop the daemon: net/http's Serve
// returned at the first error it did not call temporary (EPROTO, ENOMEM,
// ENOBUFS, EPERM, ENETUNREACH...), and Run stopped every check, repair and
// the kernel log with it ("metrics server: accept4: protocol error"), a
// node under memory pressure left without its health daemon. The accept is
// tried again with backoff, the failure logged once, and /metrics served on.
func TestFailedAcceptDoesNotStopTheDaemon(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EPROTO, syscall.ENOBUFS, syscall.ENOMEM, syscall.EHOSTUNREACH} {
		t.Run(errno.Error(), func(t *testing.T) {
			tcp, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &failingAccepts{Listener: tcp, err: os.NewSyscallError("accept4", errno)}
			ln.n.Store(5)
			var logs testenv.SyncBuffer
			d, err := New(testConfig(t), slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			addr := tcp.Addr().String()
			for {
				code, _, err := probe(addr, "127.0.0.1", "/healthz")
				if err == nil && code == http.StatusOK {
					break
				}
				select {
				case err := <-done:
					t.Fatalf("Run returned while accepts failed: %v", err)
				default:
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			if n := strings.Count(logs.String(), "metrics listener: accepting a connection failed"); n != 1 {
				t.Errorf("the failed accepts logged %d times, want once:\n%s", n, logs.String())
			}
			if !strings.Contains(logs.String(), "metrics listener accepting again") {
				t.Errorf("the end of the failures not logged:\n%s", logs.String())
			}
		})
	}
}
