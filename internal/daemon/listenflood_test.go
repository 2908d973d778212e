package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/testenv"
)

// floodDaemon runs a daemon whose metrics listener is a real TCP listener
// on 127.0.0.1, served as Run serves it, until the test ends; it returns
// the daemon, its address and its log, once /healthz answers.
func floodDaemon(t *testing.T) (*Daemon, string, *testenv.SyncBuffer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	d, err := New(testConfig(t), slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	addr := ln.Addr().String()
	await(t, d, "/healthz answering", func() bool {
		code, _, err := probe(addr, "127.0.0.1", "/healthz")
		return err == nil && code == http.StatusOK
	})
	return d, addr, &logs
}

// probe sends one GET for path to addr from the local address from (a
// loopback address other than 127.0.0.1 is another peer) on a new
// connection and reads the answer, within 5 s.
func probe(addr, from, path string) (int, string, error) {
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := dl.Dial("tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// heapAndGoroutines are the live heap and the goroutines' stacks after a
// collection, and the goroutines of the test process.
func heapAndGoroutines() (uint64, int) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc + ms.StackInuse, runtime.NumGoroutine()
}

// The metrics listener is on every interface of every node. A client that
// opens connections and sends each request slowly, within the 10 s the
// server allows it (a scanner, a sidecar opening connections in a loop, a
// slowloris), held a goroutine, its buffers and a file descriptor of the
// daemon per connection, without bound: 1,000 such connections were 1,000
// goroutines and megabytes of heap, on the daemon's one P. Now at most
// metricsMaxConns are open at once; a new connection over the bound closes
// the oldest one whose request is not being answered, so a probe of
// /healthz, which sends its request at once, is answered through the flood;
// each such close is counted, and the flood is logged once.
func TestMetricsListenerBoundsSlowConnections(t *testing.T) {
	d, addr, logs := floodDaemon(t)
	heap0, gr0 := heapAndGoroutines()

	const n = 1000
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := range n {
		// From 10 peers: more than any one peer's share.
		from := fmt.Sprintf("127.0.0.%d", 10+i%10)
		dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := dl.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		slow = append(slow, c)
		// Headers that never end (the server waits up to 10 s).
		fmt.Fprint(c, "GET /metrics HTTP/1.1\r\nHost: node\r\nX-Slow: ")
	}
	// The listener accepts in order: a probe after the flood is accepted
	// after all of it.
	code, body, err := probe(addr, "127.0.0.2", "/healthz")
	if err != nil || code != http.StatusOK || !strings.HasPrefix(body, "ok: ") {
		t.Errorf("/healthz after %d slow connections: %d %q, %v; want 200 ok", n, code, body, err)
	}
	heap1, gr1 := heapAndGoroutines()
	t.Logf("%d slow connections: goroutines %d -> %d, heap and stacks %.1f -> %.1f MiB", n, gr0, gr1, float64(heap0)/(1<<20), float64(heap1)/(1<<20))
	if grown := gr1 - gr0; grown > metricsMaxConns+16 {
		t.Errorf("%d slow connections grew the goroutines by %d, want at most the %d connections the listener keeps (+16)", n, grown, metricsMaxConns)
	}
	if grown := int64(heap1) - int64(heap0); grown > 6<<20 {
		t.Errorf("%d slow connections grew the heap and stacks by %.1f MiB, want at most 6 MiB", n, float64(grown)/(1<<20))
	}
	// Those closed are closed at once (the rest wait for their 10 s).
	var closed atomic.Int32
	var wg sync.WaitGroup
	deadline := time.Now().Add(500 * time.Millisecond)
	for _, c := range slow {
		wg.Go(func() {
			c.SetReadDeadline(deadline)
			// EOF, or a reset where the daemon closed it with the
			// request's bytes unread.
			if _, err := c.Read(make([]byte, 1)); err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if want := n - metricsMaxConns; int(closed.Load()) < want {
		t.Errorf("%d of %d slow connections closed by the daemon, want at least %d", closed.Load(), n, want)
	}
	_, page, _ := probe(addr, "127.0.0.2", "/metrics")
	if got := grepLines(page, "autopilot_health_http_refused_total{reason=\"connections\"}"); got == "" || strings.HasSuffix(got, " 0") {
		t.Errorf("closed connections not counted: %q", got)
	}
	if n := strings.Count(logs.String(), "metrics listener at its bound of open connections"); n != 1 {
		t.Errorf("the flood logged %d times, want once:\n%s", n, logs.String())
	}
	for _, c := range slow {
		c.Close()
	}
	await(t, d, "the end of the flood logged", func() bool {
		return strings.Contains(logs.String(), `msg="metrics listener back under its bound of open connections" open_max=256 closed=`)
	})
}

// A request's headers were read up to net/http's default MaxHeaderBytes,
// 1 MiB (and 4 KiB more), before the server gave up on them: each of the
// connections a client may hold at once could hold a MiB of the daemon's
// heap for the 10 s its headers may take, 256 MiB for the 256 connections
// the listener keeps. A scrape's headers are a few hundred bytes (a bearer
// token a few KB); more than serverMaxHeaderBytes is answered 431 at once.
func TestMetricsListenerBoundsHeaderBytes(t *testing.T) {
	_, addr, _ := floodDaemon(t)
	heap0, _ := heapAndGoroutines()

	const n, size = 64, 256 << 10
	line := "X-Pad: " + strings.Repeat("a", 1000) + "\r\n"
	pad := []byte(strings.Repeat(line, size/len(line)))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			deadline := time.Now().Add(2 * time.Second)
			c.SetDeadline(deadline)
			// Headers that do not end; the write fails once the server
			// has closed the connection.
			fmt.Fprint(c, "GET /metrics HTTP/1.1\r\nHost: node\r\n")
			c.Write(pad)
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				codes[i] = resp.StatusCode
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	heap1, _ := heapAndGoroutines()
	t.Logf("%d connections sending %d KiB of headers: heap and stacks %.1f -> %.1f MiB", n, size>>10, float64(heap0)/(1<<20), float64(heap1)/(1<<20))
	if grown := int64(heap1) - int64(heap0); grown > 4<<20 {
		t.Errorf("%d connections with %d KiB of headers each grew the heap and stacks by %.1f MiB, want at most 4 MiB", n, size>>10, float64(grown)/(1<<20))
	}
	for i, code := range codes {
		if code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("connection %d, %d KiB of headers: answered %d (0: nothing within 2 s), want 431", i, size>>10, code)
			break
		}
	}
	// Headers of the size a scrape sends are answered.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: node\r\nAuthorization: Bearer %s\r\n\r\n", strings.Repeat("t", 4096))
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz with a 4 KiB bearer token: %v, %v; want 200", resp, err)
	}
}

// rawExchange sends req on a new connection to addr and reads one answer.
func rawExchange(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: strings.Fields(req)[0]})
	if err != nil {
		rest, _ := io.ReadAll(br)
		t.Fatalf("%q: %v (then %q)", req, err, rest)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The metrics listener, on every interface, serves its three pages to GET
// and HEAD and nothing else: other methods are 405 naming GET and HEAD,
// other paths 404 (net/http/pprof's /debug/pprof/ and expvar's /debug/vars,
// which register on net/http's DefaultServeMux, are not served: expvar is
// linked into the binary by a dependency), and it speaks HTTP/1.1 only: no
// h2c, neither by prior knowledge (HTTP/2's preface) nor by an Upgrade
// header, which would bring HTTP/2's per-connection state and its own
// flood surface (streams, SETTINGS, CONTINUATION) to the node network.
func TestMetricsListenerServesOnlyItsPages(t *testing.T) {
	_, addr, _ := floodDaemon(t)
	for _, tc := range []struct {
		req        string
		code       int
		allow      string
		bodyPrefix string
	}{
		{req: "GET /metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 200, bodyPrefix: "# HELP "},
		{req: "HEAD /metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 200},
		{req: "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n", code: 200, bodyPrefix: "ok: "},
		{req: "HEAD /healthz HTTP/1.1\r\nHost: n\r\n\r\n", code: 200},
		{req: "GET / HTTP/1.1\r\nHost: n\r\n\r\n", code: 200, bodyPrefix: "autopilot-health: "},
		{req: "POST /metrics HTTP/1.1\r\nHost: n\r\nContent-Length: 2\r\n\r\nab", code: 405, allow: "GET, HEAD"},
		{req: "PUT /healthz HTTP/1.1\r\nHost: n\r\nContent-Length: 0\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "DELETE /metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "TRACE /healthz HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "OPTIONS /metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		// The server-wide OPTIONS, which net/http answers itself, 200
		// and no Allow, unless told not to.
		{req: "OPTIONS * HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "GET /debug/pprof/ HTTP/1.1\r\nHost: n\r\n\r\n", code: 404},
		{req: "GET /debug/pprof/goroutine?debug=2 HTTP/1.1\r\nHost: n\r\n\r\n", code: 404},
		{req: "GET /debug/vars HTTP/1.1\r\nHost: n\r\n\r\n", code: 404},
		{req: "GET /metrics/x HTTP/1.1\r\nHost: n\r\n\r\n", code: 404},
		{req: "GET * HTTP/1.1\r\nHost: n\r\n\r\n", code: 400},
		// README's "other methods 405 naming them" for HEAD, OPTIONS of
		// each page, CONNECT (of a page, and of a host: authority form,
		// no path), a method net/http does not know, an absolute URI, and
		// "OPTIONS *" in HTTP/1.0.
		{req: "HEAD / HTTP/1.1\r\nHost: n\r\n\r\n", code: 200},
		{req: "OPTIONS / HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "OPTIONS /healthz HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "OPTIONS /debug/vars HTTP/1.1\r\nHost: n\r\n\r\n", code: 404},
		{req: "CONNECT /metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "CONNECT n:443 HTTP/1.1\r\nHost: n:443\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "FOO /metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "OPTIONS http://n/metrics HTTP/1.1\r\nHost: n\r\n\r\n", code: 405, allow: "GET, HEAD"},
		{req: "OPTIONS * HTTP/1.0\r\n\r\n", code: 405, allow: "GET, HEAD"},
		// An Upgrade to h2c is ignored: the answer is HTTP/1.1's.
		{req: "GET /healthz HTTP/1.1\r\nHost: n\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", code: 200, bodyPrefix: "ok: "},
	} {
		resp, body := rawExchange(t, addr, tc.req)
		line := strings.SplitN(tc.req, "\r\n", 2)[0]
		if resp.StatusCode != tc.code || resp.ProtoMajor != 1 || resp.Header.Get("Allow") != tc.allow || !strings.HasPrefix(body, tc.bodyPrefix) {
			t.Errorf("%s: %s %s, Allow %q, body %.40q; want HTTP/1.x %d, Allow %q, a body starting %q", line, resp.Proto, resp.Status, resp.Header.Get("Allow"), body, tc.code, tc.allow, tc.bodyPrefix)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			t.Errorf("%s: switched protocols to %q", line, resp.Header.Get("Upgrade"))
		}
	}
	// HTTP/2 by prior knowledge: the preface is refused, not answered with
	// HTTP/2's SETTINGS frame.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 ") {
		t.Errorf("HTTP/2's preface answered %q, want an HTTP/1.1 refusal", b)
	}
	t.Logf("HTTP/2's preface: %.60q", b)
}

// A connection whose request is being answered is never closed for the
// bound: with all metricsMaxConns open ones being answered (a handler that
// waits), a new connection is refused with a 503 that says why, and
// counted; the answers in progress are all written once the handler goes
// on. The gate's server and listener, as Run serves them, with a handler
// of the test's.
func TestMetricsGateRefusesWhenAllAreBeingAnswered(t *testing.T) {
	var logs testenv.SyncBuffer
	reg := prometheus.NewRegistry()
	g := newMetricsGate(slog.New(slog.NewTextHandler(&logs, nil)), reg)
	release := make(chan struct{})
	var answering atomic.Int32
	allAnswering := make(chan struct{})
	srv := g.server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if answering.Add(1) == metricsMaxConns {
			close(allAnswering)
		}
		<-release
		fmt.Fprintln(w, "answered")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(g.listener(ln)) }()
	defer func() {
		srv.Close()
		<-served
	}()
	addr := ln.Addr().String()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range metricsMaxConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		fmt.Fprint(c, "GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
	}
	<-allAnswering // every connection's request is being answered

	resp, body := rawExchange(t, addr, "GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
	if resp.StatusCode != http.StatusServiceUnavailable || body != refusalText || !resp.Close {
		t.Errorf("a connection over the bound with all being answered: %s %q, close %v; want 503 %q and the connection closed", resp.Status, body, resp.Close, refusalText)
	}
	close(release)
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("connection %d, being answered when the bound was reached: %v, %v; want its answer", i, resp, err)
		}
	}
	if v := testutil.ToFloat64(g.refused.WithLabelValues(refusedConnections)); v != 1 {
		t.Errorf("refused counted %v, want 1", v)
	}
	if n := strings.Count(logs.String(), "metrics listener at its bound of open connections"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
}
