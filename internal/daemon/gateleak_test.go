package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/testenv"
)

// gateOpen is what the gate counts open now, and how many of those it
// believes are being answered.
func (g *metricsGate) gateOpen() (open, busy int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for e := g.conns.Front(); e != nil; e = e.Next() {
		if e.Value.(*gateConn).busy {
			busy++
		}
	}
	return g.conns.Len(), busy
}

// stalled is how many of the gate's connections have waited
// metricsStallAfter or more in a write for their client to read.
func (g *metricsGate) stalled() (n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for e := g.conns.Front(); e != nil; e = e.Next() {
		if e.Value.(*gateConn).stalledAt(now) {
			n++
		}
	}
	return n
}

// awaitGateEmpty waits until the daemon's gate counts no connection open
// (the server closes its side once it sees the client's close).
func awaitGateEmpty(t *testing.T, d *Daemon, after string) {
	t.Helper()
	await(t, d, "no connection counted open after "+after, func() bool {
		open, _ := d.gate.gateOpen()
		return open == 0
	})
}

// scrapeWorks scrapes /metrics on new connections until the gauge counts
// the scrape's own connection alone open, for at most 10 s: connections the
// daemon has yet to accept from the listen backlog, or to see closed, are
// open on its side until it has. Each scrape must be answered.
func scrapeWorks(t *testing.T, addr, after string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		code, page, err := probe(addr, "127.0.0.1", "/metrics")
		if err != nil || code != http.StatusOK {
			t.Fatalf("a scrape after %s: %d, %v; want 200", after, code, err)
		}
		var got []string
		for _, l := range strings.Split(page, "\n") {
			if strings.HasPrefix(l, "autopilot_health_http_connections_open ") {
				got = append(got, l)
			}
		}
		if len(got) == 1 && got[0] == "autopilot_health_http_connections_open 1" {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("scrapes after %s for 10 s: the last %q, want the scrape's own connection alone open", after, got)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// dialTCP connects to addr; linger 0 makes its Close a reset (RST).
func dialTCP(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c.(*net.TCPConn)
}

// postTooLarge writes a POST of /metrics with a body of 1 MiB on c, in a
// goroutine of its own: the write fails once the server has closed.
func postTooLarge(c net.Conn) {
	const size = 1 << 20
	go func() {
		fmt.Fprintf(c, "POST /metrics HTTP/1.1\r\nHost: n\r\nContent-Length: %d\r\n\r\n", size)
		c.Write(make([]byte, size))
	}()
}

// resetClose closes c with a reset (SO_LINGER 0).
func resetClose(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// The gate forgets every connection that is closed, however it ends: the
// client's close or reset before a byte, in the middle of its request,
// after one or many requests, while the answer is being written; the
// server's close after Connection: close, HEAD, 431, 405 with a body small
// or too large, 400, 501, 417, HTTP/2's preface. Had it kept one it no
// longer has, the count would creep up to metricsMaxConns over the weeks,
// and the listener would close or refuse every scrape and /healthz: the
// daemon dark to Prometheus while healthy. After each kind the count is
// back to 0, nothing is believed to be being answered, and a scrape is
// answered.
func TestMetricsGateForgetsEveryClosedConnection(t *testing.T) {
	d, addr, _ := floodDaemon(t)
	exchange := func(t *testing.T, req string) *http.Response {
		t.Helper()
		c := dialTCP(t, addr)
		defer c.Close()
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: strings.Fields(req)[0]})
		if err != nil {
			t.Fatalf("%.40q: %v", req, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// answers is a kind that sends req on a connection of its own and
	// wants code for it; what names the request in the error.
	answers := func(req string, code int, what string) func(*testing.T) {
		return func(t *testing.T) {
			if resp := exchange(t, req); resp.StatusCode != code {
				t.Errorf("%s answered %d", what, resp.StatusCode)
			}
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"a close before a byte", func(t *testing.T) { dialTCP(t, addr).Close() }},
		{"a reset before a byte", func(t *testing.T) { resetClose(dialTCP(t, addr)) }},
		{"a close in the middle of the headers", func(t *testing.T) {
			c := dialTCP(t, addr)
			io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n")
			c.Close()
		}},
		{"a reset in the middle of the headers", func(t *testing.T) {
			c := dialTCP(t, addr)
			io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n")
			resetClose(c)
		}},
		{"a reset in the middle of a body", func(t *testing.T) {
			c := dialTCP(t, addr)
			io.WriteString(c, "POST /metrics HTTP/1.1\r\nHost: n\r\nContent-Length: 100\r\n\r\nab")
			resetClose(c)
		}},
		{"a keep-alive connection of 200 requests, then closed", func(t *testing.T) {
			c := dialTCP(t, addr)
			defer c.Close()
			br := bufio.NewReader(c)
			for i := range 200 {
				path := []string{"/metrics", "/healthz", "/"}[i%3]
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: n\r\n\r\n", path)
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
					t.Fatalf("request %d on a kept-alive connection: %v, %v", i, resp, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}},
		{"a keep-alive connection reset while idle", func(t *testing.T) {
			c := dialTCP(t, addr)
			fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resetClose(c)
		}},
		{"ten pipelined requests, then closed", func(t *testing.T) {
			c := dialTCP(t, addr)
			defer c.Close()
			io.WriteString(c, strings.Repeat("GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n", 10))
			br := bufio.NewReader(c)
			for i := range 10 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("pipelined request %d: %v, %v", i, resp, err)
				}
				io.Copy(io.Discard, resp.Body)
			}
		}},
		{"Connection: close", func(t *testing.T) {
			if resp := exchange(t, "GET /metrics HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n"); resp.StatusCode != 200 || !resp.Close {
				t.Errorf("Connection: close answered %d, close %v", resp.StatusCode, resp.Close)
			}
		}},
		{"HEAD", answers("HEAD /metrics HTTP/1.1\r\nHost: n\r\n\r\n", http.StatusOK, "HEAD")},
		{"431", answers("GET /metrics HTTP/1.1\r\nHost: n\r\nX-Pad: "+strings.Repeat("a", 16<<10)+"\r\n\r\n",
			http.StatusRequestHeaderFieldsTooLarge, "16 KiB of headers")},
		{"405 with a small body", answers("POST /metrics HTTP/1.1\r\nHost: n\r\nContent-Length: 2\r\n\r\nab", http.StatusMethodNotAllowed, "POST")},
		{"405 with a body too large to read", func(t *testing.T) {
			c := dialTCP(t, addr)
			defer c.Close()
			postTooLarge(c)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
				t.Fatalf("POST of 1 MiB: %v, %v; want 405", resp, err)
			}
		}},
		{"400", answers("GET /metrics HTTP/1.1\r\nHost: n\r\nBad Header\r\n\r\n", http.StatusBadRequest, "a malformed header")},
		{"501", answers("POST /metrics HTTP/1.1\r\nHost: n\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", http.StatusNotImplemented, "an unknown transfer coding")},
		{"417", answers("GET /metrics HTTP/1.1\r\nHost: n\r\nExpect: nothing\r\n\r\n", http.StatusExpectationFailed, "Expect: nothing")},
		{"HTTP/2's preface", func(t *testing.T) {
			c := dialTCP(t, addr)
			defer c.Close()
			io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
			io.ReadAll(c)
		}},
		{"a reset while the answer is written", func(t *testing.T) {
			c := dialTCP(t, addr)
			c.SetReadBuffer(1024)
			fmt.Fprint(c, "GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
			if _, err := c.Read(make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			resetClose(c)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t)
			awaitGateEmpty(t, d, tc.name)
			if _, busy := d.gate.gateOpen(); busy != 0 {
				t.Errorf("after %s: %d connections believed to be being answered", tc.name, busy)
			}
			scrapeWorks(t, addr, tc.name)
		})
	}
}

// 10,000 short connections one after the other, each closed (half after a
// request answered, half by a reset before a byte), leave nothing counted
// and the gate's set of connections empty: the heap does not grow with
// them.
func TestMetricsGateForgetsManySequentialConnections(t *testing.T) {
	d, addr, _ := floodDaemon(t)
	scrapeWorks(t, addr, "the start")
	awaitGateEmpty(t, d, "the first scrape")
	heap0, _ := heapAndGoroutines()
	const n = 10000
	for i := range n {
		c := dialTCP(t, addr)
		if i%2 == 0 {
			resetClose(c)
			continue
		}
		fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d: %v, %v", i, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		c.Close()
	}
	awaitGateEmpty(t, d, fmt.Sprintf("%d sequential connections", n))
	heap1, _ := heapAndGoroutines()
	t.Logf("%d sequential connections: heap and stacks %.2f -> %.2f MiB", n, float64(heap0)/(1<<20), float64(heap1)/(1<<20))
	if grown := int64(heap1) - int64(heap0); grown > 1<<20 {
		t.Errorf("%d closed connections grew the heap and stacks by %.2f MiB, want less than 1 MiB", n, float64(grown)/(1<<20))
	}
	d.gate.mu.Lock()
	over, closed := d.gate.over, d.gate.closed
	d.gate.mu.Unlock()
	if over || closed != 0 {
		t.Errorf("sequential connections, never more than one open: the gate believes it was over its bound (%v, %d closed)", over, closed)
	}
	scrapeWorks(t, addr, fmt.Sprintf("%d sequential connections", n))
}

// Clients that connect and close or reset in a flood, from many
// goroutines, some over the bound, while Prometheus scrapes: no scrape
// waits unanswered (a scrape may be closed for the bound when 256 newer
// connections arrive before its request is read), and once the flood is
// over nothing is counted open and a scrape is answered (run with -race).
func TestMetricsGateFloodOfConnectAndCloseWhileScraping(t *testing.T) {
	d, addr, _ := floodDaemon(t)
	stop := make(chan struct{})
	var scrapes, answered, evicted atomic.Int32
	var scraper sync.WaitGroup
	scraper.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			code, _, err := probe(addr, "127.0.0.2", "/metrics")
			scrapes.Add(1)
			switch {
			case err == nil && code == http.StatusOK:
				answered.Add(1)
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Errorf("a scrape during the flood not answered within 5 s: %v", err)
			default:
				// Closed for the bound before its handler started: 256
				// newer connections came first (README: thousands a
				// second, on 2 loaded cores).
				evicted.Add(1)
				t.Logf("a scrape during the flood: %d, %v", code, err)
			}
		}
	})
	var wg sync.WaitGroup
	var heldMu sync.Mutex
	var held []net.Conn
	for w := range 8 {
		wg.Go(func() {
			for i := range 300 {
				dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 10+w))}, Timeout: 5 * time.Second}
				nc, err := dl.Dial("tcp", addr)
				if err != nil {
					t.Errorf("worker %d, connection %d: %v", w, i, err)
					return
				}
				c := nc.(*net.TCPConn)
				switch i % 4 {
				case 0:
					resetClose(c)
				case 1:
					io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n\r\n")
					c.Close()
				case 2:
					// Held a while: the flood goes over the bound.
					io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n\r\n")
					heldMu.Lock()
					held = append(held, c)
					heldMu.Unlock()
				case 3:
					c.Close()
				}
			}
		})
	}
	wg.Wait()
	// The held connections stay until the gate has gone over its bound:
	// on loaded cores the dials finish in the kernel's backlog before the
	// daemon accepts them (a CI run at load 11 reset them all within
	// 0.6 s, the bound never reached); well within the server's 10 s
	// header timeout, which would close them first.
	for deadline := time.Now().Add(8 * time.Second); testutil.ToFloat64(d.gate.refused.WithLabelValues(refusedConnections)) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	for _, c := range held {
		resetClose(c.(*net.TCPConn))
	}
	close(stop)
	scraper.Wait()
	if answered.Load() == 0 {
		t.Errorf("none of %d scrapes during the flood answered", scrapes.Load())
	}
	if v := testutil.ToFloat64(d.gate.refused.WithLabelValues(refusedConnections)); v == 0 {
		t.Errorf("the flood never went over the bound: the test tests less than it says")
	}
	t.Logf("%d of %d scrapes answered during the flood (%d closed for the bound); %v connections closed or refused for the bound", answered.Load(), scrapes.Load(), evicted.Load(), testutil.ToFloat64(d.gate.refused.WithLabelValues(refusedConnections)))
	scrapeWorks(t, addr, "the flood")
}

// flakyListener fails its first n Accepts with a temporary error (EMFILE:
// the daemon out of file descriptors), then hands out l's connections.
type flakyListener struct {
	*pipeListener
	n atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.n.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.pipeListener.Accept()
}

// The connections the server closes on its own clock: one that sends
// nothing or only part of its request (10 s), one whose client does not
// read the answer (the write times out at 30 s), one left idle after an
// answer (90 s); and those the server's Shutdown and Close end, a
// connection the handler hijacks and closes, and Accept failing with
// EMFILE for a while (net/http backs off and accepts again). Each is
// forgotten: the gate counts none open after, and believes none is being
// answered. The gate's server and listener as Run serves them, on the
// bubble's clock.
func TestMetricsGateForgetsConnectionsTheServerEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		g := newMetricsGate(slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
		hold := make(chan struct{})
		srv := g.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/hold":
				<-hold
			case "/hijack":
				c, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
				c.Close()
				return
			}
			fmt.Fprintln(w, "ok")
		}))
		srv.ErrorLog = log.New(io.Discard, "", 0)
		ln := &flakyListener{pipeListener: newPipeListener()}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(g.listener(ln)) }()
		open := func(t *testing.T) int {
			t.Helper()
			synctest.Wait()
			n, busy := g.gateOpen()
			if v := testutil.ToFloat64(gaugeOf(t, reg, "autopilot_health_http_connections_open")); int(v) != n {
				t.Errorf("autopilot_health_http_connections_open %v, the gate's set %d", v, n)
			}
			if busy != 0 {
				t.Errorf("%d connections believed to be being answered", busy)
			}
			return n
		}
		// ask sends a request on a new connection and reads the answer.
		ask := func(t *testing.T, path string) {
			t.Helper()
			c := ln.dial()
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: n\r\n\r\n", path)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %v, %v", path, resp, err)
			}
			io.Copy(io.Discard, resp.Body)
		}
		// send writes req on a new connection.
		send := func(req string) net.Conn {
			c := ln.dial()
			io.WriteString(c, req)
			return c
		}
		for _, tc := range []struct {
			name  string
			after time.Duration // for the server to close it
			start func(t *testing.T) net.Conn
		}{
			{"nothing sent", serverReadHeaderTimeout, func(t *testing.T) net.Conn { return ln.dial() }},
			{"half the headers", serverReadHeaderTimeout, func(t *testing.T) net.Conn { return send("GET /metrics HTTP/1.1\r\nHost: n") }},
			{"half the body", serverReadTimeout, func(t *testing.T) net.Conn {
				c := send("POST /metrics HTTP/1.1\r\nHost: n\r\nContent-Length: 10\r\n\r\nab")
				go io.Copy(io.Discard, c)
				return c
			}},
			{"the answer not read", serverWriteTimeout, func(t *testing.T) net.Conn { return send("GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n") }},
			{"idle after an answer", serverIdleTimeout, func(t *testing.T) net.Conn {
				c := send("GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
					t.Fatalf("a scrape: %v, %v", resp, err)
				}
				return c
			}},
		} {
			func() { // t.Run cannot run in a bubble
				c := tc.start(t)
				defer c.Close()
				synctest.Wait()
				if n, _ := g.gateOpen(); n != 1 {
					t.Fatalf("%s: %d open, want 1", tc.name, n)
				}
				time.Sleep(tc.after - time.Millisecond)
				if n, _ := g.gateOpen(); n != 1 {
					t.Errorf("%s: closed before %v", tc.name, tc.after)
				}
				time.Sleep(time.Millisecond)
				if n := open(t); n != 0 {
					t.Errorf("%s: %d counted open %v later, when the server has closed it", tc.name, n, tc.after)
				}
				ask(t, "/healthz")
				if n := open(t); n != 0 {
					t.Errorf("%s: %d counted open after a scrape", tc.name, n)
				}
			}()
		}

		ask(t, "/hijack")
		if n := open(t); n != 0 {
			t.Errorf("a hijacked connection closed: %d counted open", n)
		}

		// Serve is in Accept already: the EMFILEs come at the next one.
		ln.n.Store(5)
		ln.dial().Close()
		start := time.Now()
		ask(t, "/healthz")
		if waited := time.Since(start); waited == 0 {
			t.Errorf("accepted at once after 5 EMFILEs, want net/http's backoff")
		}
		if n := open(t); n != 0 {
			t.Errorf("after EMFILE: %d counted open", n)
		}

		// Shutdown (the daemon's stop): with a connection idle, one new
		// and one being answered, it closes the idle one, the new one once
		// it has been silent over 5 s, and waits for the answer.
		idle := ln.dial()
		defer idle.Close()
		io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil {
			t.Fatal(err)
		}
		silent := ln.dial()
		defer silent.Close()
		held := ln.dial()
		defer held.Close()
		io.WriteString(held, "GET /hold HTTP/1.1\r\nHost: n\r\n\r\n")
		synctest.Wait()
		if n, busy := g.gateOpen(); n != 3 || busy != 1 {
			t.Fatalf("before the stop: %d open, %d being answered; want 3, 1", n, busy)
		}
		go io.Copy(io.Discard, held)
		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			shut <- srv.Shutdown(ctx)
		}()
		time.Sleep(8 * time.Second)
		synctest.Wait()
		if n, busy := g.gateOpen(); n != 1 || busy != 1 {
			t.Errorf("8 s into the stop: %d open, %d being answered; want the one being answered", n, busy)
		}
		close(hold)
		if err := <-shut; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if n := open(t); n != 0 {
			t.Errorf("after Shutdown: %d counted open", n)
		}
		<-served
	})
}

// The gate's server closed (Close) with connections open in each state:
// none is counted after.
func TestMetricsGateForgetsConnectionsAtClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newMetricsGate(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		hold := make(chan struct{})
		defer close(hold)
		srv := g.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				<-hold
			}
		}))
		ln := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(g.listener(ln)) }()
		var conns []net.Conn
		for _, req := range []string{"", "GET /metrics HTTP/1.1\r\n", "GET /hold HTTP/1.1\r\nHost: n\r\n\r\n"} {
			c := ln.dial()
			defer c.Close()
			go io.Copy(io.Discard, c)
			io.WriteString(c, req)
			conns = append(conns, c)
		}
		synctest.Wait()
		if n, _ := g.gateOpen(); n != len(conns) {
			t.Fatalf("%d open, want %d", n, len(conns))
		}
		srv.Close()
		<-served
		synctest.Wait()
		if n, _ := g.gateOpen(); n != 0 {
			t.Errorf("after Close: %d counted open", n)
		}
	})
}

// gaugeOf is the gauge name of reg's.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gatheredGauge{reg, name}
}

// gatheredGauge collects the one metric of reg's family name.
type gatheredGauge struct {
	reg  *prometheus.Registry
	name string
}

func (g gatheredGauge) Describe(ch chan<- *prometheus.Desc) {}

func (g gatheredGauge) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == g.name && len(mf.Metric) == 1 {
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.GaugeValue, mf.Metric[0].GetGauge().GetValue())
		}
	}
}

// A request the server will not read (headers over 8 KiB: 431; a body too
// large to read: 405 with Connection: close) is answered, then the
// connection closed with the request's bytes unread, which resets it.
// net/http ends its answer first (CloseWrite, a FIN) and waits 500 ms
// before the close, so the client reads the answer whole and then its end.
// The gate's connection hid CloseWrite from net/http: the 431's body, which
// runs to the connection's end, was read as "connection reset by peer"
// after 500 ms (curl: "Recv failure", exit 56), and a 405's connection
// ended in a reset, not an end.
func TestMetricsListenerEndsTheAnswerToAnUnreadRequest(t *testing.T) {
	_, addr, _ := floodDaemon(t)

	c := dialTCP(t, addr)
	defer c.Close()
	io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n\r\nX-Pad: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("64 KiB of headers: %v, %v; want 431", resp, err)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "431 Request Header Fields Too Large" {
		t.Errorf("64 KiB of headers: the 431's body read %q, %v; want it whole, to the connection's end", b, err)
	}

	c2 := dialTCP(t, addr)
	defer c2.Close()
	postTooLarge(c2)
	br := bufio.NewReader(c2)
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed || !resp.Close {
		t.Fatalf("POST of 1 MiB: %v, %v; want 405, Connection: close", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("POST of 1 MiB: after the 405, read %d bytes, %v; want the connection's end (EOF)", n, err)
	}
}

// A client that asks for pages and does not read them (200 requests
// pipelined on each connection, its receive buffer small) keeps each of its
// connections being answered for the 30 s a write may take: 256 such
// connections, opened again every 30 s (9 a second, 7 KiB each), had every
// other connection refused with a 503, every scrape and /healthz: the daemon
// dark to Prometheus while healthy. A connection whose answer has waited
// metricsStallAfter for its client to read it is not being answered, and is
// closed for a new one like one that sends slowly.
func TestMetricsListenerClosesAnswersTheClientDoesNotRead(t *testing.T) {
	stallAfter := metricsStallAfter
	t.Cleanup(func() { metricsStallAfter = stallAfter }) // after the daemon stopped
	metricsStallAfter = 100 * time.Millisecond
	d, addr, _ := floodDaemon(t)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range metricsMaxConns {
		dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 10+i%10))}}
		c, err := dl.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c.(*net.TCPConn).SetReadBuffer(1024)
		conns = append(conns, c)
		io.WriteString(c, strings.Repeat("GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n", 200))
	}
	// Each connection's first pages fill the sockets' buffers before its
	// answer waits: hundreds of pages, seconds on 2 loaded cores, and more
	// than 30 s under the race detector (make test-race's third whole run:
	// all 256 still being written to at 30 s).
	wait := 30 * time.Second
	if testenv.Race {
		wait = 2 * time.Minute
	}
	start := time.Now()
	for deadline := start.Add(wait); ; {
		open, busy := d.gate.gateOpen()
		stalled := d.gate.stalled()
		if open == metricsMaxConns && busy == metricsMaxConns && stalled == metricsMaxConns {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %d open, %d being answered, %d waiting for their clients; want %d each", wait, open, busy, stalled, metricsMaxConns)
		}
		time.Sleep(10 * time.Millisecond) // polled, as await does
	}
	t.Logf("256 connections' answers waiting for their clients after %v", time.Since(start).Round(time.Millisecond))
	code, body, err := probe(addr, "127.0.0.2", "/healthz")
	if err != nil || code != http.StatusOK {
		t.Errorf("/healthz with %d connections whose answers are not read: %d %q, %v; want 200", metricsMaxConns, code, body, err)
	}
	if open, _ := d.gate.gateOpen(); open > metricsMaxConns {
		t.Errorf("%d open, want at most %d", open, metricsMaxConns)
	}
	if v := testutil.ToFloat64(d.gate.refused.WithLabelValues(refusedConnections)); v != 1 {
		t.Errorf("closed for the bound counted %v, want 1", v)
	}
}

// With every open connection being answered, one whose answer has waited
// less than metricsStallAfter for its client (flow control of a moment)
// is not closed for a new one: the new one is refused with a 503. Once the
// answers have waited metricsStallAfter, the oldest is closed and the new
// one answered. The gate's server and listener, on the bubble's clock.
func TestMetricsGateClosesOnlyAnswersStalledLong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newMetricsGate(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		srv := g.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") }))
		ln := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(g.listener(ln)) }()
		defer func() {
			srv.Close()
			<-served
		}()
		// Clients that ask and do not read: a pipe's write waits for
		// the reader.
		var conns []net.Conn
		for range metricsMaxConns {
			c := ln.dial()
			defer c.Close()
			io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
			conns = append(conns, c)
		}
		synctest.Wait()
		time.Sleep(metricsStallAfter - time.Millisecond)
		if open, busy := g.gateOpen(); open != metricsMaxConns || busy != metricsMaxConns || g.stalled() != 0 {
			t.Fatalf("%d open, %d being answered, %d stalled; want %d, %d, 0", open, busy, g.stalled(), metricsMaxConns, metricsMaxConns)
		}
		ask := func() (*http.Response, error) {
			c := ln.dial()
			defer c.Close()
			// A pipe's write waits for the reader: the 503 is written
			// before the request is read.
			go io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
			return http.ReadResponse(bufio.NewReader(c), nil)
		}
		if resp, err := ask(); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("all answers waiting for less than %v: a new connection answered %v, %v; want 503", metricsStallAfter, resp, err)
		}
		time.Sleep(time.Millisecond)
		if resp, err := ask(); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("all answers waiting for %v: a new connection answered %v, %v; want 200", metricsStallAfter, resp, err)
		}
		// The oldest was closed: its answer cut short, the connection's end.
		conns[0].SetReadDeadline(time.Now().Add(time.Minute))
		if b, err := io.ReadAll(conns[0]); err != nil || len(b) != 0 {
			t.Errorf("the oldest connection: read %q, %v; want it closed", b, err)
		}
		synctest.Wait()
		if n, _ := g.gateOpen(); n != metricsMaxConns-1 {
			t.Errorf("%d open, want %d (the oldest closed, the new one done)", n, metricsMaxConns-1)
		}
	})
}

// A client that reads its answers, but slowly (a few KiB every 300 ms), has
// no write of the server wait a second, and yet keeps its connection being
// answered for the 30 s a write may take: 256 such connections had every
// other one refused with a 503. The writes of an answer that have waited
// metricsStallAfter in all count as one that waits: the oldest such
// connection is closed for a new one. On the bubble's clock.
func TestMetricsGateClosesAnswersReadTooSlowly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newMetricsGate(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
		piece := []byte(strings.Repeat("x", 4<<10))
		srv := g.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/healthz" {
				fmt.Fprintln(w, "ok")
				return
			}
			rc := http.NewResponseController(w)
			for range 1000 { // 4 MiB, in pieces
				if _, err := w.Write(piece); err != nil {
					return
				}
				if rc.Flush() != nil {
					return
				}
			}
		}))
		ln := newPipeListener()
		served := make(chan error, 1)
		go func() { served <- srv.Serve(g.listener(ln)) }()
		defer func() {
			srv.Close()
			<-served
		}()
		done := make(chan struct{})
		defer close(done)
		for range metricsMaxConns {
			c := ln.dial()
			defer c.Close()
			io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n")
			go func() {
				b := make([]byte, 64<<10)
				for {
					select {
					case <-done:
						return
					case <-time.After(300 * time.Millisecond):
					}
					if _, err := c.Read(b); err != nil {
						return
					}
				}
			}()
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if open, busy := g.gateOpen(); open != metricsMaxConns || busy != metricsMaxConns {
			t.Fatalf("%d open, %d being answered; want %d each", open, busy, metricsMaxConns)
		}
		c := ln.dial()
		defer c.Close()
		go io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%d answers read a few KiB every 300 ms for 3 s: a new connection answered %v, %v; want 200", metricsMaxConns, resp, err)
		}
	})
}
