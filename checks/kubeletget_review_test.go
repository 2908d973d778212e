package checks

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
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
