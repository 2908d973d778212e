package harness

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
)

// faultedProxy starts a proxy whose every request is answered 200 by a
// fault (no API server is called) and a client of it.
func faultedProxy(t *testing.T, user string) (*Proxy, *http.Client) {
	t.Helper()
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	s := &APIServer{URL: "https://127.0.0.1:1", CA: ca} // never called
	p, err := s.StartProxy(user, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.SetFault(func(*http.Request) *Fault { return &Fault{Code: http.StatusOK, Body: "ok"} })
	c, err := s.HTTPClient(user, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// getKept GETs url with c, reading the answer whole so that the
// connection is kept for the next request; an answer other than 200 is
// an error.
func getKept(c *http.Client, url string) error {
	r, err := c.Get(url)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", r.Status)
	}
	return nil
}

// refusedThenAccepted checks that after p's Refuse a request of c's fails
// (what kept connection it might go through is the caller's: how), and
// that after Accept one is answered.
func refusedThenAccepted(t *testing.T, p *Proxy, c *http.Client, how string) {
	t.Helper()
	if err := getKept(c, p.URL+"/version"); err == nil {
		t.Fatalf("a request after Refuse was answered (through %s)", how)
	} else {
		t.Logf("after Refuse: %v", err)
	}
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	if err := getKept(c, p.URL+"/version"); err != nil {
		t.Fatalf("after Accept: %v", err)
	}
}

// The proxy's Refuse, which the "API server unreachable" tests rely on:
// a connection answering a request when the port is refused is closed
// once the answer is sent, so the client's next request, which would
// otherwise go out on that kept connection and be answered, fails as on a
// stopped API server (a write that was to fail landing that way had
// TestKubeNodeNotUpdatedThroughAProxyAndNodeRestriction wait for a
// failure that never came: CI at stop 49).
func TestProxyRefuseClosesTheConnectionAnsweringThen(t *testing.T) {
	p, c := faultedProxy(t, "proxy-refuse")
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetFault(func(*http.Request) *Fault {
		once.Do(func() { close(started); <-release }) // the first request held in flight
		return &Fault{Code: http.StatusOK, Body: "ok"}
	})
	answered := make(chan error, 1)
	go func() { answered <- getKept(c, p.URL+"/version") }()
	<-started
	p.Refuse()
	close(release)
	if err := <-answered; err != nil {
		t.Fatalf("the request in flight at Refuse: %v (want it answered)", err)
	}
	refusedThenAccepted(t, p, c, "the connection kept from before")
}

// A connection the proxy's port accepted just before Refuse closed it,
// not yet known to the proxy's server then (held between its accept and
// the server taking it), is closed too: the client's request after
// Refuse fails, as on a stopped API server, instead of being answered
// through it.
func TestProxyRefuseClosesAConnectionAcceptedJustBefore(t *testing.T) {
	p, c := faultedProxy(t, "proxy-accept")
	accepted, release := make(chan struct{}), make(chan struct{})
	p.mu.Lock()
	p.accepted = func() { close(accepted); <-release } // the one connection below
	p.mu.Unlock()
	first := make(chan error, 1)
	go func() { first <- getKept(c, p.URL+"/version") }()
	<-accepted
	p.Refuse()
	p.mu.Lock()
	p.accepted = nil
	p.mu.Unlock()
	close(release)
	t.Logf("the request whose connection was accepted before Refuse: %v", <-first)
	refusedThenAccepted(t, p, c, "the connection accepted before it")
}

// The proxy's port, refused and opened again by the tests (Refuse,
// Accept), is below the kernel's ephemeral range: while it is refused no
// bind to port 0 (another test's proxy, daemon or server, any process)
// can be given it, so Accept finds it free. Before it was the kernel's
// pick, in that range, and Accept could find it taken ("address already
// in use" after its 1 s of tries).
func TestProxyPortIsBelowTheEphemeralRange(t *testing.T) {
	p, _ := faultedProxy(t, "proxy-port")
	_, port, err := net.SplitHostPort(p.addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	if low := EphemeralStart(); n >= low {
		t.Errorf("the proxy listens on %s, in the ephemeral range (from %d)", p.addr, low)
	}
}
