//go:build integration

package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// Every event reason of the catalog, emitted twice with the node's own
// credentials (NodeRestriction on), lands on the real API server as one
// Event about the Node with a count of 2: its reason, in namespace default,
// the involvedObject the Node (kubelet's convention: UID = node name), source
// autopilot-health, and type Warning for a problem (the spec's temp rules)
// and Normal for an operator's action (TamperCleared), which is no problem
// and must not show among the node's warnings.
func TestKubeEveryCatalogEventLandsAsOneAggregatedNodeEvent(t *testing.T) {
	s := apiServer(t)
	node := "node-catalog-events-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	startReporter(t, client, node, store)
	msg := func(e report.EventDesc) string { return fmt.Sprintf("%s on %s", e.Reason, node) }
	for range 2 {
		for _, e := range report.Events {
			store.Emit(report.Event{Reason: e.Reason, Message: msg(e), Time: time.Now()})
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := s.Admin.CoreV1().Events(kube.EventNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		if err != nil {
			t.Fatal(err)
		}
		byReason := map[string]corev1.Event{}
		counted := 0
		for _, e := range evs.Items {
			byReason[e.Reason] = e
			if e.Count == 2 {
				counted++
			}
		}
		if len(evs.Items) == len(report.Events) && counted == len(report.Events) {
			for _, d := range report.Events {
				e, ok := byReason[d.Reason]
				if !ok {
					t.Errorf("%s: no Event", d.Reason)
					continue
				}
				want := corev1.EventTypeWarning
				if d.Operator {
					want = corev1.EventTypeNormal
				}
				if e.Type != want {
					t.Errorf("%s: type %s, want %s", d.Reason, e.Type, want)
				}
				o := e.InvolvedObject
				if o.Kind != "Node" || o.Name != node || string(o.UID) != node || o.APIVersion != "v1" || o.Namespace != "" {
					t.Errorf("%s: involvedObject %+v", d.Reason, o)
				}
				if e.Namespace != "default" || e.Source.Component != "autopilot-health" || e.Source.Host != node || e.Message != msg(d) {
					t.Errorf("%s: %+v", d.Reason, e)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Events (want %d), %d with count 2: %+v", len(evs.Items), len(report.Events), counted, byReason)
		}
		time.Sleep(100 * time.Millisecond) // polling interval of an awaited condition
	}
}
