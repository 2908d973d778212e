package harness

import (
	"bytes"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is what a Proxy does with one request instead of passing it on.
type Fault struct {
	// Code, when not 0, answers the request with it, Header and Body,
	// without passing it on.
	Code   int
	Header http.Header
	Body   string
	// LoseAnswer passes the request on to the API server and then drops
	// the client's connection without an answer: a write the API server
	// saved whose answer a reset connection lost.
	LoseAnswer bool
	// Reset drops the client's connection without passing the request on.
	Reset bool
	// Delay holds the request that long before passing it on (an API
	// server answering slowly); a client that gave up meanwhile has it
	// not passed on.
	Delay time.Duration
	// CutBody passes the request on and sends the API server's status,
	// headers and the first half of its body, then resets the connection:
	// an answer cut mid-body.
	CutBody bool
	// Truncate passes the request on and answers with the API server's
	// status and the first half of its body, as a whole answer (its
	// Content-Length the half's): a truncated JSON body.
	Truncate bool
}

// ProxyRequest is a request the Proxy saw.
type ProxyRequest struct {
	At           time.Time
	Method, Path string
	Body         string
	Fault        bool // answered by a fault, not by the API server
}

// Proxy stands between a client and the real kube-apiserver, as a load
// balancer does: it terminates TLS with a certificate of the cluster's CA
// and calls the API server with a client certificate of its own user (the
// node's: the API server sees the node's identity). Faults injects answers
// the API server would give on its bad day; Refuse closes the port.
type Proxy struct {
	URL   string
	addr  string
	srv   *http.Server
	cfg   *tls.Config
	rp    *httputil.ReverseProxy
	mu    sync.Mutex
	ln    net.Listener
	fault func(*http.Request) *Fault
	seen  []ProxyRequest
	conns map[net.Conn]http.ConnState // the clients' open connections
	// closing: connections answering a request when the port was
	// refused, closed once the answer is sent (as a stopping server does).
	closing map[net.Conn]bool
	// accepted, when set, is called with each connection the port
	// accepted, before the proxy knows it (the tests' hold there).
	accepted func()
}

// StartProxy starts a proxy to s that calls it as user (in groups).
func (s *APIServer) StartProxy(user string, groups []string) (*Proxy, error) {
	up, err := url.Parse(s.URL)
	if err != nil {
		return nil, err
	}
	c, err := s.HTTPClient(user, groups)
	if err != nil {
		return nil, err
	}
	cert, key, err := s.CA.Issue("proxy", nil, true, time.Now().Add(24*time.Hour))
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: []string{"http/1.1"}},
		conns: map[net.Conn]http.ConnState{}, closing: map[net.Conn]bool{}}
	p.rp = httputil.NewSingleHostReverseProxy(up)
	p.rp.Transport = c.Transport
	quiet := log.New(io.Discard, "", 0) // the faults' handshakes and cut requests: expected
	p.rp.ErrorLog = quiet
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ErrorLog: quiet, ConnState: p.connState}
	// Refused and opened again on this port (Refuse, Accept): below the
	// ephemeral range, where no bind to port 0 of another test (their
	// proxies, daemons, servers) takes it while it is refused.
	port, err := FreeLoopbackPort()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	p.addr = ln.Addr().String()
	p.URL = "https://" + p.addr
	p.serveOn(ln)
	return p, nil
}

func (p *Proxy) serveOn(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.srv.Serve(&proxyListener{Listener: tls.NewListener(ln, p.cfg), p: p, port: ln})
}

// proxyListener is the proxy's port as its server accepts from it: each
// connection accepted is among p.conns before the server has it, or, if
// the port was refused meanwhile, closed. (Known only from the server's
// StateNew, a connection accepted just before Refuse closed the port and
// not yet known to it stayed open: the client's next request, sent after
// Refuse, went through it.)
type proxyListener struct {
	net.Listener
	p    *Proxy
	port net.Listener // the plain listener, p.ln while the port is open
}

func (l *proxyListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.p.mu.Lock()
		hold := l.p.accepted
		l.p.mu.Unlock()
		if hold != nil {
			hold()
		}
		l.p.mu.Lock()
		open := l.p.ln == l.port
		if open {
			l.p.conns[c] = http.StateNew
		}
		l.p.mu.Unlock()
		if open {
			return c, nil
		}
		c.Close() // refused: the next Accept fails on the closed port
	}
}

// SetFault sets what the proxy does with each request from now on (nil, or
// a func answering nil: pass it on).
func (p *Proxy) SetFault(f func(*http.Request) *Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// Refuse closes the proxy's port: connections are refused, those open
// and idle are closed, and one answering a request is closed once its
// answer is sent (the tests refuse while the writers wait, none relies on
// a cut request), so no request after Refuse reaches the API server
// through a connection kept from before.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	var idle []net.Conn
	for c, st := range p.conns {
		if st == http.StateActive {
			p.closing[c] = true
		} else {
			idle = append(idle, c)
		}
	}
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, c := range idle {
		c.Close()
	}
}

// connState keeps the clients' open connections for Refuse, and closes
// one that was answering when the port was refused once it is idle.
func (p *Proxy) connState(c net.Conn, st http.ConnState) {
	p.mu.Lock()
	closeIt := false
	switch st {
	case http.StateNew, http.StateActive:
		p.conns[c] = st
	case http.StateIdle:
		p.conns[c] = st
		closeIt = p.closing[c]
	case http.StateHijacked, http.StateClosed:
		delete(p.conns, c)
		delete(p.closing, c)
	}
	p.mu.Unlock()
	if closeIt {
		c.Close()
	}
}

// Accept opens the proxy's port again (after Refuse).
func (p *Proxy) Accept() error {
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serveOn(ln)
			return nil
		}
		time.Sleep(20 * time.Millisecond) // the port just closed: rebinding it
	}
	return err
}

// Requests returns the requests the proxy saw whose path contains sub.
func (p *Proxy) Requests(sub string) []ProxyRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ProxyRequest
	for _, r := range p.seen {
		if strings.Contains(r.Path, sub) {
			out = append(out, r)
		}
	}
	return out
}

// Close stops the proxy.
func (p *Proxy) Close() { p.Refuse(); p.srv.Close() }

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	p.mu.Lock()
	f := p.fault
	p.mu.Unlock()
	var fault *Fault
	if f != nil {
		fault = f(r)
	}
	p.mu.Lock()
	p.seen = append(p.seen, ProxyRequest{At: time.Now(), Method: r.Method, Path: r.URL.Path, Body: string(body),
		Fault: fault != nil && !fault.LoseAnswer && fault.Delay == 0 && !fault.CutBody && !fault.Truncate})
	p.mu.Unlock()
	if fault != nil && fault.Delay > 0 {
		select {
		case <-time.After(fault.Delay):
		case <-r.Context().Done():
			return // the client gave up: not passed on
		}
		fault = nil
	}
	switch {
	case fault == nil:
		p.rp.ServeHTTP(w, r)
	case fault.Code != 0:
		for k, v := range fault.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(fault.Code)
		io.WriteString(w, fault.Body)
	case fault.LoseAnswer:
		rec := &discard{h: http.Header{}}
		p.rp.ServeHTTP(rec, r)
		hangUp(w)
	case fault.Reset:
		hangUp(w)
	case fault.CutBody, fault.Truncate:
		rec := &record{h: http.Header{}, code: http.StatusOK}
		p.rp.ServeHTTP(rec, r)
		body := rec.b.Bytes()
		for k, v := range rec.h {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Encoding")
		half := body[:len(body)/2]
		if fault.Truncate {
			w.Header().Set("Content-Length", strconv.Itoa(len(half)))
		} else {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		w.WriteHeader(rec.code)
		w.Write(half)
		if fault.CutBody {
			http.NewResponseController(w).Flush()
			hangUp(w)
		}
	}
}

// record is a ResponseWriter that keeps the answer.
type record struct {
	h    http.Header
	code int
	b    bytes.Buffer
}

func (d *record) Header() http.Header         { return d.h }
func (d *record) Write(b []byte) (int, error) { return d.b.Write(b) }
func (d *record) WriteHeader(c int)           { d.code = c }

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*tls.Conn); ok {
		if nc, ok := tc.NetConn().(*net.TCPConn); ok {
			nc.SetLinger(0) // a reset, not an orderly close
		}
	}
	conn.Close()
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}
