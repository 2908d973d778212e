package checks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// healthzGet is KubeletUnhealthy's GET of /healthz, made on the probe's
// goroutine (as the CRI call is, cri.go): the request written whole on a
// kept rawsys connection, the answer read on the probe's goroutine with
// http.ReadResponse. net/http's Transport costs a reader and a writer
// goroutine a connection and a hand-over between them each request; on this
// VM about 0.05-0.11 ms a probe more (BenchmarkProbeGetProto,
// BenchmarkProbeCost; README, Cost).
// What it does not handle (an https URL, a URL net/http would rewrite, an
// answer other than a final one or a redirect) goes through the check's
// net/http client (keptClient), as before: its redirects stay on this host
// (onThisHost). Neither asks a proxy.
type healthzGet struct {
	url     string
	addr    string        // host:port dialled; "" for a URL net/http asks
	req     []byte        // the request, written whole
	timeout time.Duration // the probe's bound (the client's Timeout)
	client  *http.Client  // the fallback

	dial rawsys.DialFunc // dialLocal (tests: another)

	kept keptSlot[*keptHTTP]
	mu   sync.Mutex // retried, fellBack
	// retried counts the GETs made again on a new connection (tests).
	retried int
	// fellBack counts the GETs made again through client (tests).
	fellBack int
}

// keptHTTP is the kept connection of healthzGet and its reader.
type keptHTTP struct {
	conn net.Conn
	lr   *headerLimit // what br reads from conn
	br   *bufio.Reader
}

// Close closes h's connection (keptSlot).
func (h *keptHTTP) Close() error { return h.conn.Close() }

// maxAnswerHeader bounds what an answer's status line and header may take,
// net/http's Transport's default MaxResponseHeaderBytes: a peer that sends
// a header without end (another process on kubelet's port) is an error at
// that bound, in net/http's words, not read into memory until the timeout.
const maxAnswerHeader = 10 << 20

// headerLimit reads from r at most left bytes (net/http's persistConn's
// readLimit): set to maxAnswerHeader while an answer's header is read.
type headerLimit struct {
	r    io.Reader
	left int64
}

var errHeaderLimit = fmt.Errorf("net/http: server response headers exceeded %d bytes; aborted", maxAnswerHeader)

func (l *headerLimit) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errHeaderLimit
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

// newHealthzGet is the GET of rawURL bounded by the probe's share of the
// check's timeout.
func newHealthzGet(rawURL string, checkTimeout time.Duration) *healthzGet {
	g := &healthzGet{url: rawURL, timeout: probeTimeout(checkTimeout), client: keptClient(checkTimeout), dial: dialLocal}
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Opaque != "" || u.User != nil || u.Host == "" || !plainASCII(u.Host) ||
		!plainASCII(u.RequestURI()) || u.Host[len(u.Host)-1] == ':' {
		return g
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	g.addr = net.JoinHostPort(u.Hostname(), port)
	g.req = []byte("GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: Go-http-client/1.1\r\n\r\n")
	return g
}

// plainASCII: s holds only printable ASCII (no byte a request line or
// header would have to escape).
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// close closes the kept connection (and the fallback's); a GET running
// keeps its own.
func (g *healthzGet) close() {
	g.kept.close()
	g.client.CloseIdleConnections()
}

// take takes the kept connection: nil where there is none, or where it
// cannot serve the next GET (unused for keptConnIdle, or the peer sent
// something between two GETs: no answer of ours), which it closes.
func (g *healthzGet) take() *keptHTTP {
	h := g.kept.take()
	if h != nil && (h.br.Buffered() > 0 || rawsys.Pending(h.conn)) {
		h.conn.Close()
		h = nil
	}
	return h
}

// get GETs the URL: nil for a 200 with its body (at most 512 bytes read).
// On the kept connection: when it fails before an answer (kubelet
// restarted since the last probe), the GET is made once more on a new one,
// so a restart is never taken for an outage.
func (g *healthzGet) get(ctx context.Context) error {
	if g.addr == "" {
		return g.viaClient(ctx)
	}
	parent := ctx
	if g.timeout > 0 { // none where the check has none, as net/http's client
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.timeout)
		defer cancel()
	}
	h := g.take()
	reused := h != nil
	answered, unusual, err := g.exchange(ctx, parent, h)
	if reused && !answered && ctx.Err() == nil {
		g.mu.Lock()
		g.retried++
		g.mu.Unlock()
		_, unusual, err = g.exchange(ctx, parent, nil)
	}
	if unusual {
		g.mu.Lock()
		g.fellBack++
		g.mu.Unlock()
		return g.viaClient(parent)
	}
	return err
}

// ended is the cause of a GET its context ended (ctx: the GET's, bounded
// by the probe's timeout; parent: the caller's), worded as net/http's
// client words it.
func ended(ctx, parent context.Context, answered bool) error {
	cause := ctx.Err().Error()
	if parent.Err() == nil {
		if answered {
			cause += " (Client.Timeout or context cancellation while reading body)"
		} else {
			cause += " (Client.Timeout exceeded while awaiting headers)"
		}
	}
	return errors.New(cause)
}

// exchange makes the GET on h (nil: a new connection) and keeps the
// connection after a whole answer. answered: bytes of an answer came;
// unusual: an answer this GET leaves to net/http's client (a redirect,
// a 1xx), which it did not read. The call's context ends it: its end closes
// the connection, which a read or write waiting on it then returns from.
func (g *healthzGet) exchange(ctx, parent context.Context, h *keptHTTP) (answered, unusual bool, err error) {
	reused := h != nil
	if h == nil {
		conn, err := g.dial(ctx, "tcp", g.addr)
		if err != nil {
			return false, false, g.transportError(ctx, parent, err)
		}
		lr := &headerLimit{r: conn}
		h = &keptHTTP{conn: conn, lr: lr, br: bufio.NewReaderSize(lr, 4096)}
	}
	h.lr.left = maxAnswerHeader
	if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.GotConn != nil {
		tr.GotConn(httptrace.GotConnInfo{Conn: h.conn, Reused: reused})
	}
	conn := h.conn
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	keep := false
	defer func() {
		if !stop() || !keep {
			conn.Close()
		} else {
			g.kept.put(h)
		}
	}()
	if _, err := conn.Write(g.req); err != nil {
		return false, false, g.transportError(ctx, parent, err)
	}
	if _, err := h.br.Peek(1); err != nil {
		return false, false, g.transportError(ctx, parent, err)
	}
	// Bytes came: the GET is not made again (net/http's rule too).
	resp, err := http.ReadResponse(h.br, nil)
	h.lr.left = 1<<63 - 1 // the body's bound is the 512 bytes read
	if err != nil {
		if errors.Is(err, errHeaderLimit) {
			err = errHeaderLimit
		}
		if ctx.Err() == nil {
			err = fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", err)
		}
		return true, false, g.transportError(ctx, parent, err)
	}
	if resp.StatusCode < 200 || (resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.Header.Get("Location") != "") {
		return true, true, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return true, false, fmt.Errorf("GET %s: HTTP %d: %s", g.url, resp.StatusCode, trimSpace(body))
	}
	if err != nil {
		// A 200 is an answer only once its body came: a kubelet that hung
		// or died mid-answer is not healthy.
		if ctx.Err() != nil {
			err = ended(ctx, parent, true)
		}
		return true, false, fmt.Errorf("GET %s: HTTP 200, reading the answer: %w", g.url, withoutLocalAddr(err))
	}
	// Kept only when the answer was read whole and the peer keeps it too:
	// a body shorter than the 512 bytes read was read to its end, one of
	// 512 is whole where its length said so. Whether a longer body ended
	// is not asked: a read past the 512 bytes waits on a peer that sent
	// them and stops there, and a 200 is healthy at once (as net/http's
	// client, which closes such a body unread).
	keep = !resp.Close && (len(body) < 512 || resp.ContentLength == int64(len(body)))
	return true, false, nil
}

// transportError is err as net/http's client says a failed GET:
// "Get \"<url>\": <cause>", without the local port; the context's end
// where it ended the GET.
func (g *healthzGet) transportError(ctx, parent context.Context, err error) error {
	if ctx.Err() != nil {
		err = ended(ctx, parent, false)
	}
	return &url.Error{Op: "Get", URL: g.url, Err: withoutLocalAddr(err)}
}

// viaClient is the GET through net/http's client.
func (g *healthzGet) viaClient(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url, nil)
	if err != nil {
		return err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		// "Get \"<url>\": <cause>", without the local port, another at
		// each new connection (the message would change at every probe).
		return withoutLocalAddr(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d: %s", g.url, resp.StatusCode, trimSpace(body))
	}
	if err != nil {
		return fmt.Errorf("GET %s: HTTP 200, reading the answer: %w", g.url, withoutLocalAddr(err))
	}
	return nil
}

func trimSpace(b []byte) string { return strings.TrimSpace(string(b)) }
