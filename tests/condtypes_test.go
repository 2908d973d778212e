//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// The daemon's condition types on the Node as another writer leaves them:
// one removed, one it does not evaluate here added back, one duplicated.

// reportingEvery3sLogged is reportingEvery3s with the reporter's log in
// logs and, where evaluated is not nil, the condition types it evaluates.
func reportingEvery3sLogged(t *testing.T, s *harness.APIServer, node string, logs *testenv.SyncBuffer, evaluated func(string) bool) *running {
	t.Helper()
	return reporting(t, s, node, 3*time.Second, slog.New(slog.NewTextHandler(logs, nil)), evaluated)
}

// reporting registers node and runs a reporter for it with the node's
// credentials, its storage report holding the root filesystem and a report
// refresh every interval (the daemon's comes every 2 minutes), logging to
// log; evaluated as kube.Options has it. It returns once the Node was read
// (x.store takes the conditions).
func reporting(t *testing.T, s *harness.APIServer, node string, every time.Duration, log *slog.Logger, evaluated func(string) bool) *running {
	t.Helper()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	x := &running{store: store, det: report.NewDetails(), m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: x.det,
		Log: log, Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: every,
		EventCountFlush: time.Second, Evaluated: evaluated})
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go func() { x.r.Run(ctx); close(x.done) }()
	t.Cleanup(x.stop)
	<-x.r.Adopted()
	return x
}

// storageReported: the report carries the storage domain (not an other
// writer's "{}").
func storageReported(n *corev1.Node) bool {
	return strings.Contains(n.Annotations[report.AnnotationPrefix+"storage"], `"mountPoint":"/"`)
}

// refreshedAfter overwrites the storage report with "{}" and waits until it
// is back: a report refresh answered after whatever was done before.
func refreshedAfter(t *testing.T, s *harness.APIServer, node string) *corev1.Node {
	t.Helper()
	if _, err := s.Admin.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"{}"}}}`, report.AnnotationPrefix+"storage"), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitNode(t, s, node, "the report back", storageReported)
}

// appendKernelDeadlock appends a second KernelDeadlock entry (False, Stale)
// to node's status.conditions with a JSON patch, which is not merged by
// type, and returns the Node holding both.
func appendKernelDeadlock(t *testing.T, s *harness.APIServer, node string) *corev1.Node {
	t.Helper()
	dup := fmt.Sprintf(`[{"op":"add","path":"/status/conditions/-","value":{"type":"KernelDeadlock","status":"False","reason":"Stale","message":"appended","lastHeartbeatTime":%[1]q,"lastTransitionTime":%[1]q}}]`,
		time.Now().UTC().Format(time.RFC3339))
	m, err := s.Admin.CoreV1().Nodes().Patch(context.Background(), node, types.JSONPatchType, []byte(dup), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatalf("the JSON patch appending a second KernelDeadlock: %v", err)
	}
	t.Logf("the API server kept: %v", conditionsOf(m))
	if k := countOf(m, "KernelDeadlock"); k != 2 {
		t.Fatalf("the API server kept %d KernelDeadlock entries: %v", k, conditionsOf(m))
	}
	return m
}

func countOf(n *corev1.Node, ty string) int {
	k := 0
	for _, c := range n.Status.Conditions {
		if string(c.Type) == ty {
			k++
		}
	}
	return k
}

// Another writer deletes one of the daemon's conditions from the Node (the
// Node's UID unchanged): the next refresh puts it back, counts it in
// autopilot_health_condition_overwrites_total, and the journal says another
// writer removed it. Before, it said "node registered anew" and counted
// nothing.
func TestKubeAnotherWriterRemovedAConditionIsSaidSo(t *testing.T) {
	s := apiServer(t)
	node := "node-condition-removed-" + harness.Token()
	var logs testenv.SyncBuffer
	x := reportingEvery3sLogged(t, s, node, &logs, nil)
	x.store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	n := waitNode(t, s, node, "condition and report", func(n *corev1.Node) bool { return cond(n, "DiskUsageHigh") != nil && storageReported(n) })
	since := cond(n, "DiskUsageHigh").LastTransitionTime
	if _, err := s.Admin.CoreV1().Nodes().PatchStatus(context.Background(), node,
		[]byte(`{"status":{"conditions":[{"type":"DiskUsageHigh","$patch":"delete"}]}}`)); err != nil {
		t.Fatal(err)
	}
	refreshedAfter(t, s, node)
	n = waitNodeFor(t, s, node, 5*time.Second, "DiskUsageHigh put back", func(n *corev1.Node) bool { return cond(n, "DiskUsageHigh") != nil })
	if c := cond(n, "DiskUsageHigh"); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&since) {
		t.Errorf("put back as %+v, want True since %v", c, since)
	}
	readyIntact(t, n)
	out := logs.String()
	if strings.Contains(out, "registered anew") {
		t.Errorf("the journal says the node was registered anew (its UID did not change):\n%s", out)
	}
	if !strings.Contains(out, "another writer removed a condition of the daemon's from the Node") {
		t.Errorf("the journal does not say another writer removed the condition:\n%s", out)
	}
	if o := x.m.Overwrites(); o != 1 {
		t.Errorf("%v overwrites counted, want 1", o)
	}
}

// A GPU condition on a node without a GPU (not evaluated here) that another
// writer adds to the Node (by hand, an old build's leftover controller) is
// removed again at the next refresh, counted and logged, as the first
// write removes one an earlier boot left. Before, it stood for good.
func TestKubeConditionNotEvaluatedAddedBackIsRemovedAgain(t *testing.T) {
	s := apiServer(t)
	node := "node-not-evaluated-added-back-" + harness.Token()
	var logs testenv.SyncBuffer
	x := reportingEvery3sLogged(t, s, node, &logs, func(ty string) bool { return ty != "GpuFallenOffBus" })
	x.store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusFalse, Reason: report.ReasonKernelHasNoDeadlock}, time.Now())
	waitNode(t, s, node, "condition and report", func(n *corev1.Node) bool { return cond(n, "KernelDeadlock") != nil && storageReported(n) })
	gpu := fmt.Sprintf(`{"status":{"conditions":[{"type":"GpuFallenOffBus","status":"True","reason":"GPUFellOffTheBus","message":"by hand","lastTransitionTime":%q}]}}`,
		time.Now().UTC().Format(time.RFC3339))
	for round := range 2 {
		if m, err := s.Admin.CoreV1().Nodes().PatchStatus(context.Background(), node, []byte(gpu)); err != nil {
			t.Fatal(err)
		} else if cond(m, "GpuFallenOffBus") == nil {
			t.Fatalf("the other writer's patch did not land: %v", conditionsOf(m))
		}
		at := time.Now()
		refreshedAfter(t, s, node)
		n := waitNodeFor(t, s, node, 5*time.Second, "GpuFallenOffBus removed again", func(n *corev1.Node) bool { return cond(n, "GpuFallenOffBus") == nil })
		t.Logf("round %d: removed %s after the other writer added it", round+1, time.Since(at).Round(time.Millisecond))
		readyIntact(t, n)
		if c := cond(n, "KernelDeadlock"); c == nil || c.Status != corev1.ConditionFalse {
			t.Errorf("KernelDeadlock: %+v", c)
		}
		// A refresh that finds the removal standing: the same addition
		// again is another writer's new change, warned again.
		refreshedAfter(t, s, node)
	}
	// Refreshes that find it gone count nothing more.
	refreshedAfter(t, s, node)
	if o := x.m.Overwrites(); o != 2 {
		t.Errorf("%v overwrites counted, want 2", o)
	}
	if k := strings.Count(logs.String(), "another writer added a condition of the daemon's that it does not evaluate on this node"); k != 2 {
		t.Errorf("%d warnings, want 2:\n%s", k, logs.String())
	}
}

// Another writer appends a second entry of one of the daemon's types to
// status.conditions with a JSON patch (which is not merged by type). The
// API server keeps both; a strategic merge patch of the type merges into
// the first only. The daemon's next write takes every entry of the type
// off and writes its own once: one entry left, the daemon's, no write at
// every refresh after.
func TestKubeDuplicateConditionEntryIsWrittenOnce(t *testing.T) {
	harness.Parallel(t, 0)
	s := apiServer(t)
	node := "node-duplicate-condition-" + harness.Token()
	var logs testenv.SyncBuffer
	x := reportingEvery3sLogged(t, s, node, &logs, nil)
	x.store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHung", Message: "task kubelet blocked"}, time.Now())
	n := waitNode(t, s, node, "condition and report", func(n *corev1.Node) bool { return cond(n, "KernelDeadlock") != nil && storageReported(n) })
	want := *cond(n, "KernelDeadlock")
	appendKernelDeadlock(t, s, node)
	for range 4 {
		n = refreshedAfter(t, s, node)
	}
	t.Logf("after 4 refreshes: %d KernelDeadlock entries, %v overwrites counted", countOf(n, "KernelDeadlock"), x.m.Overwrites())
	n = waitNodeFor(t, s, node, 5*time.Second, "one KernelDeadlock", func(n *corev1.Node) bool { return countOf(n, "KernelDeadlock") == 1 })
	if c := cond(n, "KernelDeadlock"); c.Status != want.Status || c.Reason != want.Reason || !c.LastTransitionTime.Equal(&want.LastTransitionTime) {
		t.Errorf("the one KernelDeadlock left: %+v, want the daemon's %+v", c, want)
	}
	readyIntact(t, n)
	o := x.m.Overwrites()
	for range 3 {
		refreshedAfter(t, s, node)
	}
	if o2 := x.m.Overwrites(); o2 != o || o < 1 || o > 2 {
		t.Errorf("overwrites counted: %v once the duplicate was gone, %v three refreshes later; want 1 or 2 and no more", o, o2)
	}
	// The warnings about the other writer's entry: not every WARN line, as
	// a call that timed out on a loaded machine (this test runs beside the
	// other Parallel tests) warns too.
	if k := strings.Count(logs.String(), `level=WARN msg="another writer `); k < 1 || k > 2 {
		t.Errorf("%d warnings about another writer, want 1 or 2:\n%s", k, logs.String())
	}
}

// kubelet's status patch from its copy of the Node taken while another
// writer's second KernelDeadlock entry was there (before the daemon's
// write took it off): a two-way strategic merge patch of its own
// conditions, whose $setElementOrder/conditions names KernelDeadlock twice.
// The entry the daemon deleted is not in the patch and does not come back;
// the daemon's stands, and nothing more is counted.
func TestKubeKubeletsPatchFromACopyWithADuplicateDoesNotBringItBack(t *testing.T) {
	s := apiServer(t)
	node := "node-duplicate-kubelet-patch-" + harness.Token()
	var logs testenv.SyncBuffer
	x := reportingEvery3sLogged(t, s, node, &logs, nil)
	x.store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHung", Message: "task kubelet blocked"}, time.Now())
	n := waitNode(t, s, node, "condition and report", func(n *corev1.Node) bool { return cond(n, "KernelDeadlock") != nil && storageReported(n) })
	want := *cond(n, "KernelDeadlock")
	stale := appendKernelDeadlock(t, s, node)
	if k := countOf(stale, "KernelDeadlock"); k != 2 {
		t.Fatalf("%d KernelDeadlock entries after the JSON patch", k)
	}
	refreshedAfter(t, s, node)
	waitNodeFor(t, s, node, 5*time.Second, "one KernelDeadlock", func(n *corev1.Node) bool { return countOf(n, "KernelDeadlock") == 1 })
	o := x.m.Overwrites()

	mod := stale.DeepCopy()
	for i := range mod.Status.Conditions {
		if mod.Status.Conditions[i].Type == corev1.NodeReady {
			mod.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Second))
		}
	}
	oldJSON, err := json.Marshal(stale)
	if err != nil {
		t.Fatal(err)
	}
	newJSON, err := json.Marshal(mod)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet's patch: %s", patch)
	m, err := s.Admin.CoreV1().Nodes().PatchStatus(context.Background(), node, patch)
	if err != nil {
		t.Fatalf("kubelet's patch: %v", err)
	}
	t.Logf("after kubelet's patch: %v", conditionsOf(m))
	if k := countOf(m, "KernelDeadlock"); k != 1 {
		t.Errorf("%d KernelDeadlock entries after kubelet's patch, want 1: %v", k, conditionsOf(m))
	}
	for range 2 {
		n = refreshedAfter(t, s, node)
	}
	if c := cond(n, "KernelDeadlock"); countOf(n, "KernelDeadlock") != 1 || c.Status != want.Status || c.Reason != want.Reason || !c.LastTransitionTime.Equal(&want.LastTransitionTime) {
		t.Errorf("KernelDeadlock after kubelet's patch: %v, want the daemon's %+v alone", conditionsOf(n), want)
	}
	readyIntact(t, n)
	if o2 := x.m.Overwrites(); o2 != o {
		t.Errorf("%v overwrites counted after kubelet's patch, %v before", o2, o)
	}
}
