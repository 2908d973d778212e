package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The status socket's server holds no connection for ever, as the metrics
// server does not (TestMetricsServerClosesIdleConnections): a keep-alive
// connection left idle after an answer is closed (IdleTimeout), one that
// never sends a whole request too (ReadHeaderTimeout, ReadTimeout), and one
// whose client does not read the answer (WriteTimeout). Before, only
// ReadHeaderTimeout was set: a `curl --unix-socket` left open after its
// request, or a client that stopped reading, held a goroutine and a file
// descriptor of the daemon until it stopped. The daemon's own server, on
// the bubble's clock.
func TestStatusServerClosesIdleConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newPipeListener()
		answer := strings.Repeat("x", 4096)
		srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, answer) }))
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()

		// A status request, then the connection left open.
		c := ln.dial()
		defer c.Close()
		fmt.Fprint(c, "GET "+StatusPath+" HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Close {
			t.Fatalf("status: %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
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
		fmt.Fprint(c2, "GET "+StatusPath+" HTTP/1.1\r\nHost: x\r\n")
		c2.SetReadDeadline(start.Add(10 * time.Minute))
		b, err := io.ReadAll(c2)
		if errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > serverReadTimeout {
			t.Errorf("a request without the end of its headers: %v, %q after %v; want closed within %v", err, b, time.Since(start), serverReadTimeout)
		}

		// A whole request whose client does not read the answer: the
		// server's write gives up, and the connection is closed.
		c3 := ln.dial()
		defer c3.Close()
		fmt.Fprint(c3, "GET "+StatusPath+" HTTP/1.1\r\nHost: x\r\n\r\n")
		time.Sleep(serverWriteTimeout + time.Second) // the client reads nothing meanwhile
		synctest.Wait()
		c3.SetReadDeadline(time.Now().Add(10 * time.Minute))
		b, err = io.ReadAll(c3)
		if err != nil || len(b) != 0 {
			t.Errorf("a client that read nothing for %v: then read %d bytes, %v; want the connection closed without the answer (EOF) after %v", serverWriteTimeout+time.Second, len(b), err, serverWriteTimeout)
		}

		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
}
