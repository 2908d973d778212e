package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pipeListener hands the server the server ends of net.Pipe connections:
// in a synctest bubble, the server's deadlines run on the bubble's clock.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "pipe"} }

// The metrics server closes a keep-alive connection left idle after a
// scrape (IdleTimeout; before, only ReadHeaderTimeout was set and an idle
// connection stayed open for ever), and one that never sends a whole
// request. Run's own server, on the bubble's clock.
func TestMetricsServerClosesIdleConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newPipeListener()
		srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }))
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()

		// A scrape, then the connection left open.
		c := ln.dial()
		defer c.Close()
		fmt.Fprint(c, "GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("scrape: %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
		}
		idleSince := time.Now()
		// A bound for the test, far past the timeout.
		c.SetReadDeadline(idleSince.Add(10 * time.Minute))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("idle connection: %v, want it closed by the server (EOF)", err)
		} else if idle := time.Since(idleSince); idle != serverIdleTimeout {
			t.Errorf("idle connection closed after %v, want %v", idle, serverIdleTimeout)
		}

		// A request that never ends its headers.
		c2 := ln.dial()
		defer c2.Close()
		start := time.Now()
		fmt.Fprint(c2, "GET /metrics HTTP/1.1\r\nHost: node\r\n")
		c2.SetReadDeadline(start.Add(10 * time.Minute))
		b, err := io.ReadAll(c2)
		if errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > serverReadTimeout {
			t.Errorf("a request without the end of its headers: %v, %q after %v; want closed within %v", err, b, time.Since(start), serverReadTimeout)
		}

		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
}
