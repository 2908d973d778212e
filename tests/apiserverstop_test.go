//go:build integration

package tests

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/tests/harness"
)

// A test that ends during its outage of the shared kube-apiserver (a
// t.Fatal before its StartKubeAPIServer, here a subtest that returns)
// leaves it running for the tests after it: StopKubeAPIServerFor starts
// it again at the test's end. Before, one such failure (e.g. "the
// reporter never noticed the API server was down" in TestKubeOutageConverges)
// failed every later test of the package that uses it.
func TestKubeAPIServerStoppedByATestIsStartedAgainAtItsEnd(t *testing.T) {
	s := apiServer(t)
	t.Run("ends while it is stopped", func(t *testing.T) {
		s.StopKubeAPIServerFor(t)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Fatalf("kube-apiserver after a test that stopped it ended: %v", err)
	}
}

// kube-apiserver's port, which it is started again on after a stop, is
// below the kernel's ephemeral range: while it is stopped no bind to port 0
// (a test's proxy, daemon or server, any process) can be given it, and
// the restart finds it free.
func TestKubeAPIServerPortIsBelowTheEphemeralRange(t *testing.T) {
	s := apiServer(t)
	low := harness.EphemeralStart()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if port, _ := strconv.Atoi(u.Port()); port >= low {
		t.Errorf("kube-apiserver listens on %s, in the ephemeral range (from %d)", u.Host, low)
	}
}
