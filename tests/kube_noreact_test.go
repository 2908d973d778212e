//go:build integration

package tests

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// The daemon reports and does not react (spec, "The two layers"): on its
// worst day, every condition it owns True on the real API server with the
// node's own credentials, the Node's spec is as it was registered: not
// cordoned (unschedulable), no taint added. Draining and replacing are Cluster API's, through
// the shipped MachineHealthChecks.
func TestKubeWorstDayNeitherCordonsNorTaints(t *testing.T) {
	s := apiServer(t)
	node := "node-noreact-" + harness.Token()
	registerNode(t, s, node)
	// The Node as registered (the API server's admission adds the
	// not-ready taint a new Node has until its kubelet posts Ready).
	before, err := s.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	now := time.Now()
	for _, c := range report.Conditions {
		if len(c.ProblemReasons) == 0 {
			t.Fatalf("%s has no problem reason", c.Type)
		}
		store.Set(report.Condition{Type: c.Type, Status: report.StatusTrue, Reason: c.ProblemReasons[0], Message: "worst day"}, now)
	}
	startReporter(t, client, node, store)
	n := waitNode(t, s, node, "every condition of the catalog True", func(n *corev1.Node) bool {
		true_ := 0
		for _, c := range n.Status.Conditions {
			if c.Status == corev1.ConditionTrue {
				if _, ok := report.Lookup(string(c.Type)); ok {
					true_++
				}
			}
		}
		return true_ == len(report.Conditions)
	})
	if !reflect.DeepEqual(n.Spec, before.Spec) {
		t.Errorf("the daemon changed the Node's spec (a cordon, a taint):\nbefore %+v\nafter  %+v", before.Spec, n.Spec)
	}
	if n.Spec.Unschedulable {
		t.Errorf("the Node is cordoned")
	}
}
