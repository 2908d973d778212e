//go:build integration

package tests

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// A reload that disables a check while kube-apiserver is down (README:
// "Reloading the configuration": its condition leaves the daemon and the
// Node): the removal waits out the outage and reaches the Node when the API
// returns, with the condition that stays (changed during the outage) as it
// was last set; the removed one is not written back.
func TestKubeConditionRemovedDuringAnOutageLeavesTheNode(t *testing.T) {
	s := apiServer(t)
	node := "node-outage-remove-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	x := startReporter(t, client, node, store)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	store.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: "ClockSynchronized"}, time.Now())
	waitNode(t, s, node, "both conditions", func(n *corev1.Node) bool {
		return has("DiskUsageHigh", "True", "FilesystemSpaceHigh")(n) && has("ClockNotSynchronized", "False", "ClockSynchronized")(n)
	})

	s.StopKubeAPIServerFor(t)
	if !store.Remove("DiskUsageHigh") {
		t.Fatal("DiskUsageHigh was not in the store")
	}
	store.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusTrue, Reason: "ClockUnsynchronized"}, time.Now())
	for deadline := time.Now().Add(20 * time.Second); failures(x.m) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the reporter never noticed the API server was down")
		}
		time.Sleep(50 * time.Millisecond) // polling an awaited counter
	}
	if err := s.StartKubeAPIServer(); err != nil {
		t.Fatal(err)
	}
	n := waitNode(t, s, node, "DiskUsageHigh gone, ClockNotSynchronized True", func(n *corev1.Node) bool {
		return cond(n, "DiskUsageHigh") == nil && has("ClockNotSynchronized", "True", "ClockUnsynchronized")(n)
	})
	readyIntact(t, n)
}
