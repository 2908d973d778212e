//go:build integration

package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// awaitNodeNote waits (up to 30 s) for m's wake, each time checking
// whether the Node is said not updated as want says.
func awaitNodeNote(t *testing.T, m *kube.Metrics, wakes <-chan struct{}, what string, want func(kube.NodeNotUpdated, bool) bool) kube.NodeNotUpdated {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if n, ok := m.NodeNotUpdated(); want(n, ok) {
			return n
		}
		select {
		case <-wakes:
		case <-deadline:
			n, ok := m.NodeNotUpdated()
			t.Fatalf("waiting for %s: %+v, %v", what, n, ok)
		}
	}
}

// Against the real kube-apiserver: the port closed behind a proxy has the
// Node said not updated, since the last write that landed, "unreachable
// (connection refused)", once the writes have failed for NodeStaleAfter
// (2 s here), and the first write that lands once the port takes
// connections again clears it; a node writing another node's status has
// NodeRestriction refuse it, said "refused by the API server (403
// Forbidden)".
func TestKubeNodeNotUpdatedThroughAProxyAndNodeRestriction(t *testing.T) {
	defer func(d time.Duration) { kube.NodeStaleAfter = d }(kube.NodeStaleAfter)
	kube.NodeStaleAfter = 2 * time.Second
	s := apiServer(t)
	node := "node-not-updated-" + harness.Token()
	p, client := proxied(t, s, node)
	store := report.NewStore("boot")
	var dials countDials
	x := startProxied(t, p, client, node, store, &dials)
	wakes := make(chan struct{}, 1)
	x.m.SetWake(func() {
		select {
		case wakes <- struct{}{}:
		default:
		}
	})
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
	waitNode(t, s, node, "DiskUsageHigh=False", has("DiskUsageHigh", "False", "DiskUsageOK"))
	landed := time.Now()

	p.Refuse()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
	n := awaitNodeNote(t, x.m, wakes, "the Node said not updated", func(_ kube.NodeNotUpdated, ok bool) bool { return ok })
	if n.Reason != "API server unreachable (connection refused)" || n.Since.After(landed) || landed.Sub(n.Since) > 5*time.Second ||
		n.FailingSince.Sub(n.Since) < 0 || n.Failures < 1 {
		t.Errorf("with the port closed: %+v (the last write landed by %v)", n, landed)
	}
	t.Logf("note: %s (%d calls failed; %s)", n.Note(), n.Failures, n.Error)
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	awaitNodeNote(t, x.m, wakes, "the note cleared", func(_ kube.NodeNotUpdated, ok bool) bool { return !ok })
	waitNode(t, s, node, "DiskUsageHigh=True", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))

	// NodeRestriction: this node's credentials, another node's name.
	other := "node-not-updated-other-" + harness.Token()
	registerNode(t, s, other)
	self, _ := nodeClient(t, s, node)
	m := kube.NewMetrics(nil)
	m.SetWake(func() {
		select {
		case wakes <- struct{}{}:
		default:
		}
	})
	ostore := report.NewStore("boot")
	ostore.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
	r := kube.New(kube.Options{Client: self, NodeName: other, Role: report.RoleWorker, Store: ostore, Details: report.NewDetails(),
		Log: quiet(), Metrics: m, HeartbeatPeriod: time.Minute, ReportInterval: time.Minute, EventCountFlush: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	n = awaitNodeNote(t, m, wakes, "another node's status refused", func(_ kube.NodeNotUpdated, ok bool) bool { return ok })
	if n.Reason != "refused by the API server (403 Forbidden)" || !strings.Contains(n.Error, "forbidden") {
		t.Errorf("writing another node: %+v", n)
	}
	t.Logf("note: %s (%s)", n.Note(), n.Error)
}
