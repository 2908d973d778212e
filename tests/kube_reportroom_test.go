//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
)

// The report on a bad day, against the real kube-apiserver (held; test):
// a key of another's under the daemon's prefix (autopilot.syself.com/foo)
// is left alone by every refresh; each document carries the node's role
// and updatedAt moves; when the report grows past the room the Node's other
// annotations leave (256 KiB together, kube-apiserver's 422), the refresh
// is refused, counted as a failing annotations call with the API server's
// words, the report of the last refresh stays, and the conditions are still
// written; once there is room the grown report lands at the next retry.
func TestKubeReportRefreshWhenTheNodeHasNoRoom(t *testing.T) {
	s := apiServer(t)
	const node = "node-report-no-room"
	ctx := context.Background()
	registerNode(t, s, node)
	const foreign = report.AnnotationPrefix + "foo"
	patch := func(annotations map[string]any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		if _, err := s.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(map[string]any{foreign: `{"someone":"else"}`})
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot-1")
	det := report.NewDetails()
	det.SetBootID("boot-1")
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleControlPlane, Store: store, Details: det,
		Log: quiet(), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: time.Second})
	rctx, cancel := context.WithCancel(ctx)
	x.cancel = cancel
	go func() { x.r.Run(rctx); close(x.done) }()
	defer x.stop()
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh, Message: "/ 95%"}, time.Now())

	type doc struct {
		UpdatedAt time.Time `json:"updatedAt"`
		Role      string    `json:"role"`
		Disks     []any     `json:"disks"`
	}
	parse := func(n *corev1.Node, domain string) (d doc, ok bool) {
		v, there := n.Annotations[report.AnnotationPrefix+domain]
		return d, there && json.Unmarshal([]byte(v), &d) == nil
	}
	first := waitNode(t, s, node, "the report", func(n *corev1.Node) bool {
		_, ok := parse(n, "storage")
		return ok && cond(n, "DiskUsageHigh") != nil
	})
	for _, dm := range report.Domains {
		if d, ok := parse(first, dm.Name); !ok || d.Role != string(report.RoleControlPlane) || d.UpdatedAt.IsZero() {
			t.Errorf("%s document %q: want role controlplane and an updatedAt", dm.Name, first.Annotations[report.AnnotationPrefix+dm.Name])
		}
	}
	d0, _ := parse(first, "storage")
	waitNode(t, s, node, "updatedAt moving on", func(n *corev1.Node) bool {
		d, ok := parse(n, "storage")
		return ok && d.UpdatedAt.After(d0.UpdatedAt)
	})

	// Fill the Node but for 1 KiB, then let the report grow by 4 KiB.
	cur, err := s.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for k, v := range cur.Annotations {
		used += len(k) + len(v)
	}
	const big = "tool.example.com/state"
	patch(map[string]any{big: strings.Repeat("x", 256*1024-used-len(big)-1024)})
	var disks []map[string]any
	for i := range 20 {
		disks = append(disks, map[string]any{"controller": fmt.Sprintf("nvme%d", i), "model": strings.Repeat("M", 150)})
	}
	det.Set(report.Detail{Domain: "disks", Field: "disks", Value: disks})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := x.m.Reporting().Calls[kube.KindAnnotations]
		if c.Failing && strings.Contains(c.LastError, "262144") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refused refresh in 30 s: %+v", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if x.m.Failures() == 0 {
		t.Errorf("the refused refresh is not counted")
	}
	// The conditions are still written.
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
	n := waitNode(t, s, node, "the condition's change beside the refused report", func(n *corev1.Node) bool {
		c := cond(n, "DiskUsageHigh")
		return c != nil && c.Status == corev1.ConditionFalse
	})
	if d, ok := parse(n, "storage"); !ok || d.Role != string(report.RoleControlPlane) {
		t.Errorf("the last refresh's report is gone: %q", n.Annotations[report.AnnotationPrefix+"storage"])
	}
	if n.Annotations[foreign] != `{"someone":"else"}` || n.Annotations[big] == "" {
		t.Errorf("another writer's annotations changed: %q, %d bytes", n.Annotations[foreign], len(n.Annotations[big]))
	}

	// Room again: the grown report lands at a retry.
	patch(map[string]any{big: nil})
	n = waitNode(t, s, node, "the grown report", func(n *corev1.Node) bool {
		d, ok := parse(n, "disks")
		return ok && len(d.Disks) == 20
	})
	if n.Annotations[foreign] != `{"someone":"else"}` {
		t.Errorf("%s is %q after the refreshes, want it left alone", foreign, n.Annotations[foreign])
	}
}
