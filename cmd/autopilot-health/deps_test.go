package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The daemon does not link what it had no use for and what cost most of its
// resident memory (README, Cost): client-go's clientset (every API group),
// k8s.io/api's generated types, grpc-go and the CRI API's generated code.
// Tests may use them; the binary may not.
func TestBinaryDoesNotLinkHeavyPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed %d packages: %s", len(deps), out)
	}
	for _, p := range deps {
		for _, heavy := range []string{"k8s.io/client-go/kubernetes", "k8s.io/api/", "google.golang.org/grpc", "k8s.io/cri-api/"} {
			if p == heavy || strings.HasPrefix(p, heavy+"/") || (strings.HasSuffix(heavy, "/") && strings.HasPrefix(p, heavy)) {
				t.Errorf("the daemon links %s", p)
			}
		}
	}
	t.Logf("%d packages linked", len(deps))
}
