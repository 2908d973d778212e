package checks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// pipeListener is a listener of in-memory connections (net.Pipe), so that
// a server and its client can run in a synctest bubble.
type pipeListener struct {
	conns    chan net.Conn
	done     chan struct{}
	once     sync.Once
	accepted atomic.Int32
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := chanPipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, errors.New("listener closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		l.accepted.Add(1)
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "unix"} }

// chanConn is one end of an in-memory connection whose writes are
// buffered (net.Pipe's are not: an HTTP/2 client and server that both write
// their settings first would wait on each other); a synctest bubble sees
// its waits as durable.
type chanConn struct {
	in, out    chan []byte
	rest       []byte
	done, peer chan struct{}
	once       *sync.Once
}

func chanPipe() (net.Conn, net.Conn) {
	a, b := make(chan []byte, 1024), make(chan []byte, 1024)
	da, db := make(chan struct{}), make(chan struct{})
	return &chanConn{in: a, out: b, done: da, peer: db, once: new(sync.Once)},
		&chanConn{in: b, out: a, done: db, peer: da, once: new(sync.Once)}
}

func (c *chanConn) Read(p []byte) (int, error) {
	if len(c.rest) == 0 {
		select {
		case c.rest = <-c.in:
		case <-c.done:
			return 0, net.ErrClosed
		case <-c.peer:
			select {
			case c.rest = <-c.in:
			default:
				return 0, io.EOF
			}
		}
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

func (c *chanConn) Write(p []byte) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	case <-c.peer:
		return 0, syscall.EPIPE
	case c.out <- bytes.Clone(p):
		return len(p), nil
	}
}

func (c *chanConn) Close() error                     { c.once.Do(func() { close(c.done) }); return nil }
func (c *chanConn) LocalAddr() net.Addr              { return &net.UnixAddr{Name: "pipe", Net: "unix"} }
func (c *chanConn) RemoteAddr() net.Addr             { return &net.UnixAddr{Name: "pipe", Net: "unix"} }
func (c *chanConn) SetDeadline(time.Time) error      { return nil }
func (c *chanConn) SetReadDeadline(time.Time) error  { return nil }
func (c *chanConn) SetWriteDeadline(time.Time) error { return nil }

// The CRI probe's kept connection stays the one connection while probes
// use it, past keptConnIdle from its dial: only a connection unused for
// keptConnIdle is let go. Before, net/http's pool timed its HTTP/2
// connection from the dial, not from its last use, and every first probe
// more than 90 s after the last dial dialed containerd anew, the new
// connection closed unused at once (the idle daemon's strace: a connect to
// containerd.sock and its close every 100 s).
func TestCRIProbeKeepsItsConnectionPastTheIdleTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPipeListener()
		s := grpc.NewServer()
		ready := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
		runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
			return conditions(ready), nil
		}})
		go s.Serve(l)
		defer s.Stop()
		c := newCRIClient("/nonexistent/cri.sock")
		defer c.close()
		dials := 0
		c.sock.dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials++
			return l.dial(ctx, network, addr)
		}
		probe := func(what string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, _, err := c.callOnce(ctx); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
		// A probe every 10 s for 5 minutes: one connection.
		for range 30 {
			probe("every 10 s")
			time.Sleep(10 * time.Second)
		}
		if dials != 1 || l.accepted.Load() != 1 {
			t.Errorf("30 probes 10 s apart: %d dials, %d connections; want 1 kept", dials, l.accepted.Load())
		}
		// Unused for longer than keptConnIdle: let go, and the next probe
		// dials anew.
		time.Sleep(keptConnIdle + 10*time.Second)
		synctest.Wait()
		probe("after the idle timeout")
		if dials != 2 {
			t.Errorf("a probe after %s unused: %d dials, want 2 (the idle connection let go)", keptConnIdle+10*time.Second, dials)
		}
	})
}
