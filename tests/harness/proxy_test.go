package harness

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
)

// A connection the proxy's port accepted just before Refuse closed it,
// not yet known to the proxy's server then (held between its accept and
// the server taking it), is closed too: the client's request after
// Refuse fails, as on a stopped API server, instead of being answered
// through it. No API server is needed: every request is answered by a
// fault.
func TestProxyRefuseClosesAConnectionAcceptedJustBefore(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	s := &APIServer{URL: "https://127.0.0.1:1", CA: ca} // never called
	p, err := s.StartProxy("proxy-accept", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.SetFault(func(*http.Request) *Fault { return &Fault{Code: http.StatusOK, Body: "ok"} })
	c, err := s.HTTPClient("proxy-accept", nil)
	if err != nil {
		t.Fatal(err)
	}
	accepted, release := make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.accepted = func() { close(accepted); <-release } // the one connection below
	p.mu.Unlock()
	first := make(chan error, 1)
	go func() {
		r, err := c.Get(p.URL + "/version")
		if err == nil {
			io.Copy(io.Discard, r.Body) // read whole: the connection is kept
			r.Body.Close()
		}
		first <- err
	}()
	<-accepted
	p.Refuse()
	p.mu.Lock()
	p.accepted = nil
	p.mu.Unlock()
	close(release)
	t.Logf("the request whose connection was accepted before Refuse: %v", <-first)
	if r, err := c.Get(p.URL + "/version"); err == nil {
		r.Body.Close()
		t.Fatalf("a request after Refuse was answered %s (through the connection accepted before it)", r.Status)
	} else {
		t.Logf("after: %v", err)
	}
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	r, err := c.Get(p.URL + "/version")
	if err != nil {
		t.Fatalf("after Accept: %v", err)
	}
	r.Body.Close()
}

// ephemeralLow is the lowest port of the kernel's ephemeral range, the
// ports a bind to port 0 and an outgoing connection are given.
func ephemeralLow(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		t.Fatalf("ip_local_port_range %q: %v", b, err)
	}
	return low
}

// The proxy's port, refused and opened again by the tests (Refuse,
// Accept), is below the kernel's ephemeral range: while it is refused no
// bind to port 0 (another test's proxy, daemon or server, any process)
// can be given it, so Accept finds it free. Before it was the kernel's
// pick, in that range, and Accept could find it taken ("address already
// in use" after its 1 s of tries).
func TestProxyPortIsBelowTheEphemeralRange(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	s := &APIServer{URL: "https://127.0.0.1:1", CA: ca} // never called
	p, err := s.StartProxy("proxy-port", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, port, err := net.SplitHostPort(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	if low := ephemeralLow(t); n >= low {
		t.Errorf("the proxy listens on %s, in the ephemeral range (from %d)", p.addr, low)
	}
}
