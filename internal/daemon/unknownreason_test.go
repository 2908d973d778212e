package daemon

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// A rollback past an added reason (or an upgrade past a renamed one): the
// state file and the Node hold DiskUsageHigh with a reason this build does
// not know. The first run finds the same status: the condition holds since
// the time the other build wrote, on the Node too, not since the start.
func TestRollbackPastAnUnknownReasonKeepsTheTransitionTime(t *testing.T) {
	cfg := testConfig(t)
	run := func(what string, node *corev1.Node, until func(corev1.NodeCondition) bool) corev1.NodeCondition {
		t.Helper()
		client := fake.NewClientset(node)
		d, err := New(cfg, slog.New(slog.NewTextHandler(&syncBuffer{}, nil)), Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		var got corev1.NodeCondition
		await(t, d, what+": DiskUsageHigh on the Node", func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range n.Status.Conditions {
				if c.Type == "DiskUsageHigh" && until(c) {
					got = c
					return true
				}
			}
			return false
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return got
	}
	first := run("the first start", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}},
		func(corev1.NodeCondition) bool { return true })

	// The other build's files: the same status, a reason this build does
	// not know, since an hour ago.
	since := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	path := filepath.Join(cfg.StateDir, report.StateFileName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sf map[string]any
	if err := json.Unmarshal(b, &sf); err != nil {
		t.Fatal(err)
	}
	for _, c := range sf["conditions"].([]any) {
		if m := c.(map[string]any); m["type"] == "DiskUsageHigh" {
			m["reason"], m["lastTransitionTime"] = "SomethingNew", since.Format(time.RFC3339)
		}
	}
	if b, err = json.Marshal(sf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: "DiskUsageHigh", Status: first.Status, Reason: "SomethingNew", Message: "written by another build",
		LastTransitionTime: metav1.NewTime(since), LastHeartbeatTime: metav1.NewTime(since)}}}}

	second := run("the start after the rollback", node, func(c corev1.NodeCondition) bool { return c.Reason != "SomethingNew" })
	if second.Status != first.Status || !second.LastTransitionTime.Time.Equal(since) {
		t.Errorf("DiskUsageHigh %s/%s since %v after the rollback, want %s since %v (the other build's time)",
			second.Status, second.Reason, second.LastTransitionTime.Time, first.Status, since)
	}
}
