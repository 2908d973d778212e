package checks

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// rawPeer serves each connection to l with serve (the request read
// already), counting connections; serve returns false to close it.
func rawPeer(t *testing.T, serve func(c net.Conn, n int) bool) (addr string, accepted *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					if !serve(c, n) {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), accepted
}

func getWithin(t *testing.T, g *healthzGet) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.get(ctx)
}

// The GET on the probe's goroutine says each failure in the words
// net/http's client said it (the messages are conditions' messages: a
// change of wording is a write of the Node's status), and reads as that
// client read: for each peer, its message is the fallback's (viaClient,
// the client the probe used before) word for word.
func TestHealthzGetSaysWhatNetHTTPSaid(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	for _, tc := range []struct {
		name string
		peer func(c net.Conn, n int) bool
		want string // in both messages
	}{
		{"healthy", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}, ""},
		{"503 and a body", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\n not ready \n")
			return true
		}, ": HTTP 503: not ready"},
		{"500 and a long body", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2000\r\n\r\n"+strings.Repeat("y", 2000))
			return true
		}, ": HTTP 500: " + strings.Repeat("y", 512)},
		{"closed before an answer", func(c net.Conn, _ int) bool { return false }, ": EOF"},
		{"reset before an answer", func(c net.Conn, _ int) bool {
			c.(*net.TCPConn).SetLinger(0)
			return false
		}, "connection reset by peer"},
		{"200 cut off", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no")
			return false
		}, "reading the answer: unexpected EOF"},
		{"no answer", func(c net.Conn, _ int) bool {
			<-release
			return false
		}, "Client.Timeout exceeded while awaiting headers"},
		{"200, then no body", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
			<-release
			return false
		}, "reading the answer: "},
		{"not HTTP", func(c net.Conn, _ int) bool {
			fmt.Fprint(c, "SSH-2.0-OpenSSH_9.6\r\n")
			return false
		}, "malformed HTTP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := rawPeer(t, tc.peer)
			u := "http://" + addr + "/healthz"
			g := newHealthzGet(u, 500*time.Millisecond)
			defer g.close()
			if g.addr == "" {
				t.Fatal("the GET goes through net/http")
			}
			got := errString(getWithin(t, g))
			want := errString(g.viaClient(context.Background()))
			if got != want || !strings.Contains(got, tc.want) || (tc.want == "") != (got == "") {
				t.Errorf("the GET says\n\t%s\nnet/http said\n\t%s\nwant both with %q", got, want, tc.want)
			}
			if strings.Contains(got, "->") {
				t.Errorf("%s: names the local port", got)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// What kubelet sends between two GETs (an answer to no request of ours) is
// not taken for the next GET's answer: the connection is let go and the GET
// made on a new one. Without the check, the second GET read the stray 500.
func TestHealthzGetDropsWhatCameBetweenTwoGETs(t *testing.T) {
	addr, accepted := rawPeer(t, func(c net.Conn, n int) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		if n == 0 {
			fmt.Fprint(c, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nstray")
		}
		return true
	})
	g := newHealthzGet("http://"+addr+"/healthz", 4*time.Second)
	defer g.close()
	if err := getWithin(t, g); err != nil {
		t.Fatal(err)
	}
	// The stray answer is in the socket before the next GET.
	for i := 0; ; i++ {
		h := g.kept.peek()
		if h == nil {
			t.Fatal("no connection kept")
		}
		if h.br.Buffered() > 0 || rawsys.Pending(h.conn) {
			break
		}
		if i == 500 {
			t.Fatal("the stray answer did not come")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := getWithin(t, g); err != nil {
		t.Fatalf("after a stray answer: %v", err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2 (the one with the stray answer let go)", n)
	}
}

// An answer the GET does not read itself goes through net/http's client
// (the one the probe used before): a redirect, followed on this host only
// (onThisHost), an https URL; an answer read whole keeps the connection,
// one whose body is longer than the 512 bytes read does not.
func TestHealthzGetFallsBackToNetHTTP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/healthz", http.StatusFound)
		case "/away":
			http.Redirect(w, r, "http://example.invalid/healthz", http.StatusFound)
		case "/long":
			w.Write([]byte(strings.Repeat("o", 4096)))
		default:
			w.Write([]byte("ok"))
		}
	}))
	defer srv.Close()

	g := newHealthzGet(srv.URL+"/redirect", 4*time.Second)
	defer g.close()
	if err := getWithin(t, g); err != nil || g.fellBack != 1 {
		t.Errorf("a redirect on this host: %v, %d GETs through net/http; want nil, 1", err, g.fellBack)
	}
	g2 := newHealthzGet(srv.URL+"/away", 4*time.Second)
	defer g2.close()
	if err := getWithin(t, g2); err == nil || !strings.Contains(err.Error(), "off this host, is not followed") {
		t.Errorf("a redirect off this host: %v", err)
	}
	tls := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer tls.Close()
	g4 := newHealthzGet(tls.URL+"/healthz", 4*time.Second)
	defer g4.close()
	g4.client.Transport.(*http.Transport).TLSClientConfig = tls.Client().Transport.(*http.Transport).TLSClientConfig
	if err := getWithin(t, g4); g4.addr != "" || err != nil {
		t.Errorf("https: %q (want none: net/http's), %v", g4.addr, err)
	}

	long := newHealthzGet(srv.URL+"/long", 4*time.Second)
	defer long.close()
	for range 2 {
		if err := getWithin(t, long); err != nil {
			t.Fatal(err)
		}
		kept := long.kept.peek()
		if kept != nil {
			t.Errorf("a body longer than 512 bytes, not read whole: the connection kept")
		}
	}
	short := newHealthzGet(srv.URL+"/healthz", 4*time.Second)
	if err := getWithin(t, short); err != nil {
		t.Fatal(err)
	}
	kept := short.kept.peek()
	if kept == nil {
		t.Errorf("an answer read whole: the connection not kept")
	}
	short.close()
	kept = short.kept.peek()
	if kept != nil {
		t.Errorf("close kept the connection")
	}
}

// The kept connection is closed once unused for keptConnIdle (90 s), as
// net/http's pool closed it, and not before while probes use it: a probe
// every 10 s keeps it past 90 s from its dial.
func TestHealthzGetClosesAnIdleConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pl := newPipeListener()
		defer pl.Close()
		closed := make(chan struct{}, 8)
		go func() {
			for {
				c, err := pl.Accept()
				if err != nil {
					return
				}
				go func() {
					defer func() { closed <- struct{}{} }()
					defer c.Close()
					br := bufio.NewReader(c)
					for {
						if _, err := http.ReadRequest(br); err != nil {
							return
						}
						fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					}
				}()
			}
		}()
		g := newHealthzGet("http://127.0.0.1:10248/healthz", 4*time.Second)
		g.dial = pl.dial
		defer g.close()
		for range 12 {
			if err := g.get(context.Background()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Second)
		}
		synctest.Wait()
		if n := pl.accepted.Load(); n != 1 || len(closed) != 0 {
			t.Fatalf("probes every 10 s for 120 s: %d connections, %d closed; want 1, 0", n, len(closed))
		}
		time.Sleep(keptConnIdle - 10*time.Second - time.Millisecond)
		synctest.Wait()
		if len(closed) != 0 {
			t.Fatalf("closed before it was unused for %s", keptConnIdle)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if len(closed) != 1 {
			t.Fatalf("not closed when unused for %s", keptConnIdle)
		}
		if err := g.get(context.Background()); err != nil || pl.accepted.Load() != 2 {
			t.Fatalf("after the idle close: %v, %d connections; want nil, 2", err, pl.accepted.Load())
		}
	})
}

// A GET without a timeout of its own (a check timeout of 0, which the
// configuration refuses but a caller may give) is bounded by its caller's
// context alone, as net/http's client with no Timeout was; it is not a GET
// whose time is up before it starts.
func TestHealthzGetWithoutATimeout(t *testing.T) {
	addr, _ := rawPeer(t, func(c net.Conn, _ int) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	g := newHealthzGet("http://"+addr+"/healthz", 0)
	defer g.close()
	if err := getWithin(t, g); err != nil {
		t.Fatal(err)
	}
}
