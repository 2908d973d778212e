//go:build integration

package tests

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/syself/autopilot-health/tests/harness"
)

// The proxy's Refuse, which the "API server unreachable" tests rely on:
// a connection answering a request when the port is refused is closed
// once the answer is sent, so the client's next request, which would
// otherwise go out on that kept connection and land, fails as on a
// stopped API server (a write that was to fail landing that way had
// TestKubeNodeNotUpdatedThroughAProxyAndNodeRestriction wait for a
// failure that never came).
func TestProxyRefuseClosesTheConnectionAnsweringThen(t *testing.T) {
	s := apiServer(t)
	p, err := s.StartProxy("proxy-refuse", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := s.HTTPClient("proxy-refuse", nil)
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetFault(func(*http.Request) *harness.Fault {
		once.Do(func() { close(started); <-release }) // the first request held in flight
		return nil
	})
	answered := make(chan error, 1)
	go func() {
		r, err := c.Get(p.URL + "/version")
		if err == nil {
			io.Copy(io.Discard, r.Body) // read whole: the connection is kept
			r.Body.Close()
			if r.StatusCode != http.StatusOK {
				err = fmt.Errorf("answered %s", r.Status)
			}
		}
		answered <- err
	}()
	<-started
	p.Refuse()
	close(release)
	if err := <-answered; err != nil {
		t.Fatalf("the request in flight at Refuse: %v (want it answered)", err)
	}
	if r, err := c.Get(p.URL + "/version"); err == nil {
		r.Body.Close()
		t.Fatalf("a request after Refuse was answered %s (through the connection kept from before)", r.Status)
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
