package checks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// Each answer a peer may give, read by the GET on the probe's goroutine and
// by net/http's client (viaClient, the probe's client before): the same
// outcome, in the same words.
func TestHealthzGetReadsAsNetHTTPRead(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	for _, tc := range []struct {
		name string
		peer func(c net.Conn, n int) bool
		want string // in both messages; "" for healthy
		kept bool   // the connection serves the next GET
	}{
		{"kubelet's answer", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: Mon, 07 Dec 2026 05:00:00 GMT\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, "", true},
		{"kubelet's failed check", func(c net.Conn, _ int) bool {
			b := "[+]ping ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n"
			fmt.Fprintf(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
			return true
		}, "HTTP 500: [+]ping ok\n[-]syncloop failed: reason withheld\nhealthz check failed", false},
		{"Connection: close", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
			return false
		}, "", false},
		{"chunked", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\no\r\n1\r\nk\r\n0\r\n\r\n")
			return true
		}, "", true},
		{"chunked and Content-Length", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n2\r\nok\r\n0\r\n\r\n")
			return true
		}, "", true},
		{"bad chunk", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n")
			return false
		}, "reading the answer: ", false},
		{"HTTP/1.0 until close", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.0 200 OK\r\n\r\nok")
			return false
		}, "", false},
		{"HTTP/1.0 keep-alive", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, "", true},
		{"204", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 204 No Content\r\n\r\n")
			return true
		}, ": HTTP 204: ", false},
		{"304 with a Location", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 304 Not Modified\r\nLocation: /healthz\r\n\r\n")
			return true
		}, ": HTTP 304: ", false},
		{"302 without a Location", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 302 Found\r\nContent-Length: 0\r\n\r\n")
			return true
		}, ": HTTP 302: ", false},
		{"100 then 200", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, "", false},
		{"split in segments", func(c net.Conn, _ int) bool {
			for _, s := range []string{"HTT", "P/1.1 2", "00 OK\r", "\nContent-Le", "ngth: 2\r\n", "\r\n", "o", "k"} {
				c.Write([]byte(s))
				time.Sleep(5 * time.Millisecond) // the pause between segments is what is tested
			}
			return true
		}, "", true},
		{"no status text", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, "", true},
		{"200, 512 bytes of a longer body, then nothing", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n"+strings.Repeat("o", 512))
			<-release
			return false
		}, "", false},
		{"bad Content-Length", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\nok")
			return false
		}, "bad Content-Length", false},
		{"two Content-Lengths", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok")
			return false
		}, "Content-Length", false},
		{"HTTP/2.0 status line", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, "", false},
		{"status 999", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 999 Odd\r\nContent-Length: 3\r\n\r\nodd")
			return true
		}, ": HTTP 999: odd", false},
		{"more than Content-Length", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
			return true
		}, "", false},
		{"headers without end", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\n")
			line := []byte("X-A: " + strings.Repeat("a", 1000) + "\r\n")
			for {
				select {
				case <-release:
					return false
				default:
				}
				if _, err := c.Write(line); err != nil {
					return false
				}
			}
		}, "server response headers exceeded 10485760 bytes; aborted", false},
		{"a header line without end", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nX-A: ")
			chunk := []byte(strings.Repeat("a", 64<<10))
			for {
				select {
				case <-release:
					return false
				default:
				}
				if _, err := c.Write(chunk); err != nil {
					return false
				}
			}
		}, "server response headers exceeded 10485760 bytes; aborted", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := rawPeer(t, tc.peer)
			u := "http://" + addr + "/healthz"
			// A check timeout of a minute: an answer read whole or cut off
			// is not one the timeout ends.
			g := newHealthzGet(u, time.Minute)
			defer g.close()
			if g.addr == "" {
				t.Fatal("the GET goes through net/http")
			}
			addr2, accepted := rawPeer(t, tc.peer)
			g2 := newHealthzGet("http://"+addr2+"/healthz", time.Minute)
			defer g2.close()
			for i := range 2 {
				if err := errString(getBounded(t, g2, 3*time.Second)); (err == "") != (tc.want == "") {
					t.Fatalf("GET %d: %q, want one with %q", i+1, err, tc.want)
				}
			}
			if tc.kept && accepted.Load() != 1 {
				t.Errorf("an answer read whole: %d connections for 2 GETs, want 1", accepted.Load())
			}
			got := errString(getBounded(t, g, 3*time.Second))
			want := errString(getBounded(t, &healthzGet{url: u, client: g.client}, 3*time.Second))
			if got != want || !strings.Contains(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("the GET says\n\t%q\nnet/http said\n\t%q\nwant both with %q", got, want, tc.want)
			}
		})
	}
}

// getBounded is g.get under a context that ends after bound, far sooner
// than the check's timeout: a GET it ends is one held too long.
func getBounded(t *testing.T, g *healthzGet, bound time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	err := g.get(ctx)
	if ctx.Err() != nil {
		t.Errorf("the GET was held %s (the check's timeout is a minute): %v", bound, err)
	}
	return err
}

// kubeletHealthz is kubelet's /healthz handler as it answers (k8s.io/apiserver
// healthz: text/plain, nosniff, "ok"), on a net/http server as kubelet serves
// it (http.ListenAndServe: HTTP/1.1 with keep-alive).
func kubeletHealthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	fmt.Fprint(w, "ok")
}

// A net/http server that closes its idle connections between two probes
// (its IdleTimeout shorter than the probes' interval), one that closes them
// with a reset, and kubelet restarted on the same port between two probes:
// each probe healthy, the GET on the closed kept connection made again on
// a new one. The same on [::1] and through a localhost URL.
func TestHealthzGetAgainstARealServerThatLetsConnectionsGo(t *testing.T) {
	for _, tc := range []struct{ name, network, listen, host string }{
		{"127.0.0.1", "tcp4", "127.0.0.1:0", "127.0.0.1"},
		{"[::1]", "tcp6", "[::1]:0", "[::1]"},
		{"localhost", "tcp4", "127.0.0.1:0", "localhost"},
	} {
		for _, reset := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reset=%v", tc.name, reset), func(t *testing.T) {
				l, err := net.Listen(tc.network, tc.listen)
				if err != nil {
					testenv.Skip(t, fmt.Sprintf("no %s listener on this machine: %v", tc.network, err))
				}
				port := l.Addr().(*net.TCPAddr).Port
				srv := &http.Server{Handler: http.HandlerFunc(kubeletHealthz), IdleTimeout: 50 * time.Millisecond}
				if reset { // its closes are resets (SO_LINGER 0)
					srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
						c.(*net.TCPConn).SetLinger(0)
						return ctx
					}
				}
				go srv.Serve(l)
				defer srv.Close()
				u := fmt.Sprintf("http://%s:%d/healthz", tc.host, port)
				g := newHealthzGet(u, 4*time.Second)
				defer g.close()
				if g.addr == "" {
					t.Fatal("the GET goes through net/http")
				}
				if err := getWithin(t, g); err != nil {
					t.Fatal(err)
				}
				// The server's idle close (a FIN) comes before the next probe.
				waitFor(t, "the server's idle close", func() bool { return keptClosedByPeer(g) })
				if err := getWithin(t, g); err != nil {
					t.Fatalf("after the server's idle close: %v", err)
				}
				if g.retried != 1 {
					t.Errorf("%d GETs made again; want 1 (the one on the closed connection)", g.retried)
				}
				if err := getWithin(t, g); err != nil {
					t.Fatal(err)
				}
				// kubelet restarted: its connections reset, a new server on the port.
				srv.Close()
				waitFor(t, "the old server's close", func() bool { return keptClosedByPeer(g) })
				l2, err := net.Listen(tc.network, l.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				srv2 := &http.Server{Handler: http.HandlerFunc(kubeletHealthz)}
				go srv2.Serve(l2)
				defer srv2.Close()
				if err := getWithin(t, g); err != nil {
					t.Fatalf("after kubelet restarted: %v", err)
				}
			})
		}
	}
}

// keptClosedByPeer: g's kept connection has the peer's end (EOF or a reset).
func keptClosedByPeer(g *healthzGet) bool {
	h := g.kept.peek()
	if h == nil {
		return false
	}
	h.conn.SetReadDeadline(time.Now().Add(time.Millisecond))
	defer h.conn.SetReadDeadline(time.Time{})
	_, err := h.br.Peek(1)
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 1000 {
			t.Fatalf("%s did not come within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The GET under the check's timeout at its bounds (the configuration's
// 100 ms, a direct caller's 2 ns, whose probe share is 1 ns), canceled by its
// caller (a reload, the daemon's stop): the outcome and the words of
// net/http's client. A peer that answers before it read the request and
// closes is healthy.
func TestHealthzGetAtTheBoundsSaysWhatNetHTTPSaid(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	healthy := func(c net.Conn, _ int) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	}
	silent := func(c net.Conn, _ int) bool { <-release; return false }
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		peer    func(c net.Conn, n int) bool
		cancel  bool // the caller cancels the GET 50 ms in
		want    string
	}{
		{"100ms, healthy", 100 * time.Millisecond, healthy, false, ""},
		{"100ms, no answer", 100 * time.Millisecond, silent, false, "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"},
		{"2ns", 2, healthy, false, "context deadline exceeded"},
		{"canceled", 4 * time.Second, silent, true, ": context canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := rawPeer(t, tc.peer)
			u := "http://" + addr + "/healthz"
			g := newHealthzGet(u, tc.timeout)
			defer g.close()
			get := func(g *healthzGet) string {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if tc.cancel {
					time.AfterFunc(50*time.Millisecond, cancel)
				}
				return errString(g.get(ctx))
			}
			got := get(g)
			want := get(&healthzGet{url: u, client: g.client})
			if got != want || !strings.Contains(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("the GET says\n\t%q\nnet/http said\n\t%q\nwant both with %q", got, want, tc.want)
			}
		})
	}
	t.Run("answered before the request was read", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				c.Close()
			}
		}()
		u := "http://" + l.Addr().String() + "/healthz"
		g := newHealthzGet(u, 4*time.Second)
		defer g.close()
		// net/http's client can fail here: its reader goroutine may find
		// the answer before the request went out ("readLoopPeekFailLocked:
		// %!w(<nil>)", seen once, 0 times in 200 GETs another run); the GET
		// of the probe's goroutine reads only after its write.
		for i := range 20 {
			if err := getWithin(t, g); err != nil {
				t.Fatalf("GET %d: %v; want healthy", i+1, err)
			}
		}
	})
}

// Eight callers at once on one GET (the runner runs a check's probes one at
// a time; the one-shot check and tests need not): each healthy, no race.
func TestHealthzGetByEightCallersAtOnce(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(kubeletHealthz))
	defer srv.Close()
	g := newHealthzGet(srv.URL+"/healthz", 4*time.Second)
	defer g.close()
	errs := make(chan error, 8*50)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				errs <- getWithin(t, g)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
