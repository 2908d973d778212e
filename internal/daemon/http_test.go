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

// newServer, the server of the metrics listener and of the status socket,
// holds no connection for ever: a keep-alive connection left idle after an
// answer is closed (IdleTimeout; before, only ReadHeaderTimeout was set and
// an idle connection, a scrape's or a `curl --unix-socket` left open, stayed
// open for ever), as is one that never sends a whole request: its headers
// (ReadHeaderTimeout) or its body (ReadTimeout), and one whose client does
// not read the answer (WriteTimeout; before, it held a goroutine and a file
// descriptor of the daemon until it stopped). The daemon's own server, on
// the bubble's clock.
func TestServerClosesIdleSlowAndUnreadConnections(t *testing.T) {
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
		// A bound for the test, far past the timeouts.
		c.SetReadDeadline(idleSince.Add(10 * time.Minute))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("idle connection: %v after %v, want it closed by the server (EOF)", err, time.Since(idleSince))
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
		if errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > serverReadHeaderTimeout {
			t.Errorf("a request without the end of its headers: %v, %q after %v; want closed within %v", err, b, time.Since(start), serverReadHeaderTimeout)
		}

		// A request whose body never arrives whole.
		c3 := ln.dial()
		defer c3.Close()
		start = time.Now()
		fmt.Fprint(c3, "POST /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 10\r\n\r\nab")
		c3.SetReadDeadline(start.Add(10 * time.Minute))
		b, err = io.ReadAll(c3)
		if errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > serverReadTimeout {
			t.Errorf("a request with 2 bytes of its body's 10: %v, %q after %v; want closed within %v", err, b, time.Since(start), serverReadTimeout)
		}

		// A whole request whose client does not read the answer: the
		// server's write gives up, and the connection is closed.
		c4 := ln.dial()
		defer c4.Close()
		fmt.Fprint(c4, "GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
		time.Sleep(serverWriteTimeout + time.Second) // the client reads nothing meanwhile
		synctest.Wait()
		c4.SetReadDeadline(time.Now().Add(10 * time.Minute))
		b, err = io.ReadAll(c4)
		if err != nil || len(b) != 0 {
			t.Errorf("a client that read nothing for %v: then read %d bytes, %v; want the connection closed without the answer (EOF) after %v", serverWriteTimeout+time.Second, len(b), err, serverWriteTimeout)
		}

		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
}

// newServer answers "OPTIONS *" 405 naming GET and HEAD for the status
// socket's handler as for the metrics listener's (net/http's own answer is
// 200 with no Allow, and a mux's any request for "*" 400).
func TestServerAnswersOptionsStar(t *testing.T) {
	d := &Daemon{}
	ln := newPipeListener()
	srv := newServer(d.statusHandler())
	go srv.Serve(ln)
	defer srv.Close()
	c := ln.dial()
	defer c.Close()
	fmt.Fprint(c, "OPTIONS * HTTP/1.1\r\nHost: node\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("OPTIONS * on the status socket's server: %s, Allow %q; want 405, Allow \"GET, HEAD\"", resp.Status, resp.Header.Get("Allow"))
	}
}
