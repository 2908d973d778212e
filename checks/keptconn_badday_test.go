package checks

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// countedConn counts its Close for the connections the client still holds.
type countedConn struct {
	net.Conn
	open *atomic.Int32
	done atomic.Bool
}

func (c *countedConn) Close() error {
	if c.done.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// badDayCRI is a CRI client dialing l, counting its dials and the
// connections it has not closed.
func badDayCRI(l *pipeListener) (*criClient, *int, *atomic.Int32) {
	c := newCRIClient("/nonexistent/cri.sock")
	dials := new(int)
	open := new(atomic.Int32)
	c.sock.dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		*dials++
		conn, err := l.dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return &countedConn{Conn: conn, open: open}, nil
	}
	return c, dials, open
}

func readyCRIServer() *grpc.Server {
	s := grpc.NewServer()
	ready := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
		return conditions(ready), nil
	}})
	return s
}

// probeCRI is one probe as the check makes it (status, 8 s: 4/5 of the
// check's 10 s timeout).
func probeCRI(c *criClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	return c.status(ctx)
}

// A runtime that accepts the connection and never answers (hung): every
// probe fails at its deadline, and over many probes the client holds at
// most two connections and no growing number of goroutines (each call's
// deadline closes its connection, and the next probe dials anew; before,
// x/net's transport kept a connection whose reset streams awaited a PING's
// answer until its concurrency ran out, and its idle timer let it go).
func TestCRIProbeOfAHungRuntimeLeaksNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPipeListener()
		defer l.Close()
		var held []net.Conn
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				held = append(held, conn) // never read, never answered
			}
		}()
		c, dials, open := badDayCRI(l)
		defer c.close()
		base := 0
		maxOpen := int32(0)
		for i := range 300 {
			if err := probeCRI(c); err == nil {
				t.Fatalf("probe %d of a hung runtime passed", i)
			}
			time.Sleep(2 * time.Second) // the rest of the 10 s grid
			synctest.Wait()
			maxOpen = max(maxOpen, open.Load())
			if i == 20 {
				base = goroutines()
			}
		}
		t.Logf("300 probes of a hung runtime: %d dials, at most %d connections open, goroutines %d after 20 probes, %d after 300", *dials, maxOpen, base, goroutines())
		if maxOpen > 2 {
			t.Errorf("300 probes of a hung runtime: %d connections open at once, want at most 2", maxOpen)
		}
		if g := goroutines(); g > base+4 {
			t.Errorf("goroutines: %d after 20 probes, %d after 300", base, g)
		}
		c.close()
		time.Sleep(keptConnIdle + time.Second)
		synctest.Wait()
		if n := open.Load(); n != 0 {
			t.Errorf("%d connections open %s after the last probe and the close", n, keptConnIdle)
		}
	})
}

// The runtime restarted between two probes (its connections closed, a new
// server on the socket), stopped gracefully (GOAWAY first), or closing
// connections idle for 3 s (grpc-go's MaxConnectionIdle, a GOAWAY and a
// close between every two probes): no probe fails.
func TestCRIProbeAcrossRestartsGoAwayAndIdleCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPipeListener()
		defer l.Close()
		s := readyCRIServer()
		go s.Serve(keptListener(l))
		c, dials, open := badDayCRI(l)
		defer c.close()
		probe := func(what string) {
			t.Helper()
			if err := probeCRI(c); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		probe("first")
		time.Sleep(10 * time.Second)
		// Restarted: connections dropped at once, a new server.
		s.Stop()
		s = readyCRIServer()
		go s.Serve(keptListener(l))
		synctest.Wait()
		probe("after a restart")
		time.Sleep(10 * time.Second)
		// Stopped gracefully: a GOAWAY, then the close.
		s.GracefulStop()
		s = readyCRIServer()
		go s.Serve(keptListener(l))
		synctest.Wait()
		probe("after a graceful stop")
		s.Stop()
		// A server closing connections idle for 3 s.
		s = grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 3 * time.Second}))
		ready := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
		runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
			return conditions(ready), nil
		}})
		go s.Serve(keptListener(l))
		defer s.Stop()
		for i := range 30 {
			time.Sleep(10 * time.Second)
			probe(fmt.Sprintf("an idle-closing server, probe %d", i))
		}
		synctest.Wait()
		t.Logf("%d dials, %d connections open, %d calls retried", *dials, open.Load(), c.retried)
		if n := open.Load(); n > 1 {
			t.Errorf("%d connections open, want at most 1", n)
		}
	})
}

// goroutines is the number of goroutines (of the bubble and the test's
// process).
func goroutines() int { return runtime.NumGoroutine() }

// serverListener is one server's view of the socket: its Close stops
// that server's Accept and leaves the socket for the next server (a
// restarted runtime's new one).
type serverListener struct {
	*pipeListener
	stop chan struct{}
	once sync.Once
}

func keptListener(l *pipeListener) *serverListener {
	return &serverListener{pipeListener: l, stop: make(chan struct{})}
}

func (s *serverListener) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		s.accepted.Add(1)
		return c, nil
	case <-s.stop:
		return nil, net.ErrClosed
	}
}

func (s *serverListener) Close() error { s.once.Do(func() { close(s.stop) }); return nil }

// A reload that closes the client while a probe is using its connection
// (the runtime answering slowly): the probe still gets its answer, and the
// connection, not idle at the close, is closed keptConnIdle after the
// probe (criClient's idle timer, from the connection's last use); a close
// between probes closes it at once.
func TestCRIProbeClosedDuringAProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newPipeListener()
		defer l.Close()
		s := grpc.NewServer()
		ready := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
		runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
			time.Sleep(2 * time.Second)
			return conditions(ready), nil
		}})
		go s.Serve(keptListener(l))
		defer s.Stop()
		c, _, open := badDayCRI(l)
		if err := probeCRI(c); err != nil {
			t.Fatal(err)
		}
		c.close()
		synctest.Wait()
		if n := open.Load(); n != 0 {
			t.Fatalf("closed between probes: %d connections open, want 0", n)
		}
		c, _, open = badDayCRI(l)
		if err := probeCRI(c); err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- probeCRI(c) }()
		time.Sleep(time.Second)
		c.close() // the reload, a probe in flight
		if err := <-done; err != nil {
			t.Errorf("the probe in flight at the close: %v", err)
		}
		synctest.Wait()
		if n := open.Load(); n != 1 {
			t.Errorf("just after the probe in flight at the close: %d connections open, want 1 (closed on idle later)", n)
		}
		time.Sleep(keptConnIdle + time.Second)
		synctest.Wait()
		if n := open.Load(); n != 0 {
			t.Errorf("%s after the probe in flight at the close: %d connections open, want 0", keptConnIdle+time.Second, n)
		}
	})
}

// The hung runtime over a real unix socket (accepted, never read): 200
// probes with a short deadline (20 ms) leave the client's descriptors and
// goroutines where they were after the first few. Each call's deadline
// closes its connection and the next probe dials anew (205 connections
// accepted), so no socket's buffer fills here; a call waiting in a write is
// TestCRIProbeEndsDuringABlockedWrite. Before (x/net's transport, its
// connection kept), once the buffer was full, the blocked write held the
// connection's write lock for as long as the runtime hung, and each later
// probe left a goroutine waiting on it.
func TestCRIProbeOfAHungRuntimeLeaksNoDescriptor(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn) // never read, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	c := newCRIClient(sock)
	defer c.close()
	probe := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if err := c.status(ctx); err == nil {
			t.Fatal("a probe of a hung runtime passed")
		}
	}
	fds := func() int { es, _ := os.ReadDir("/proc/self/fd"); return len(es) }
	accepted := func() int { mu.Lock(); defer mu.Unlock(); return len(held) }
	for range 5 {
		probe()
	}
	fd0, g0, a0 := fds(), runtime.NumGoroutine(), accepted()
	for range 200 {
		probe()
	}
	fd1, g1, a1 := fds(), runtime.NumGoroutine(), accepted()
	t.Logf("205 probes of a hung runtime: %d connections accepted; descriptors %d after 5 probes, %d after 205; goroutines %d and %d", a1, fd0, fd1, g0, g1)
	// The server's side of every connection stays open (held): the
	// client's descriptors are the growth beyond the server's.
	if grown := (fd1 - fd0) - (a1 - a0); grown > 2 {
		t.Errorf("the client's descriptors grew by %d over 200 probes of a hung runtime", grown)
	}
	if g1 > g0+4 {
		t.Errorf("goroutines: %d after 5 probes of a hung runtime, %d after 205", g0, g1)
	}
}

// A call waiting in its request's write (a runtime that takes no byte: the
// connection a net.Pipe, whose writes wait for a read) ends at its context's
// end, canceled (the daemon's stop) or past its deadline, as a call waiting
// for an answer does (TestCRIProbeCanceledDuringAHungCall): the context's
// end closes the connection, which the write then returns from.
func TestCRIProbeEndsDuringABlockedWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string
	}{
		{"canceled", "rpc error: code = Canceled desc = context canceled"},
		{"deadline", "rpc error: code = DeadlineExceeded desc = context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCRIClient("/nonexistent/cri.sock")
				defer c.close()
				runtimeEnd := make(chan net.Conn, 1)
				c.sock.dialer = func(context.Context, string, string) (net.Conn, error) {
					client, server := net.Pipe()
					runtimeEnd <- server // never read
					return client, nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				if tc.name == "deadline" {
					ctx, cancel = context.WithTimeout(context.Background(), 8*time.Second)
				}
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- c.status(ctx) }()
				server := <-runtimeEnd
				defer server.Close()
				synctest.Wait() // the call waits in its write
				select {
				case err := <-done:
					t.Fatalf("the call returned with its write not read: %v", err)
				default:
				}
				if tc.name == "canceled" {
					cancel()
				}
				select {
				case err := <-done:
					if err == nil || !strings.Contains(err.Error(), tc.want) {
						t.Errorf("%v, want %q", err, tc.want)
					}
				case <-time.After(time.Minute):
					t.Fatal("a call waiting in its write went on a minute past its context's end")
				}
				kept := c.kept.peek()
				if kept != nil {
					t.Error("the connection of a call ended in its write was kept")
				}
			})
		})
	}
}
