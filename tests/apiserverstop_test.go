//go:build integration

package tests

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
