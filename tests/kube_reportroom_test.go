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

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// The report on a bad day, against the real kube-apiserver (held; test):
// a key of another's under the daemon's prefix (autopilot.syself.com/foo)
// is left alone by every refresh; each document carries the node's role
// and updatedAt moves; when the report grows past the room the Node's other
// annotations leave (256 KiB together, kube-apiserver's 422), the refresh
// is refused, counted as a failed annotations call with the API server's
// words, and what fits of it is written (the documents that do not fit
// each a small one saying so: TestKubeReportDocumentsThatFitAreWrittenWhenOneDoesNot);
// the conditions are still written; once there is room the grown report
// lands at the next refresh.
func TestKubeReportRefreshWhenTheNodeHasNoRoom(t *testing.T) {
	s := apiServer(t)
	node := "node-report-no-room-" + harness.Token()
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
	fillNodeLeaving(t, s, node, 1024, patch)
	growDisks(det)
	// The whole refresh is refused (counted, with the API server's
	// words), then what fits is written: disks as a document saying so.
	waitNode(t, s, node, "the disks document left out", func(n *corev1.Node) bool {
		d, ok := parse(n, "disks")
		return ok && len(d.Disks) == 0 && strings.Contains(n.Annotations[report.AnnotationPrefix+"disks"], `"leftOut"`)
	})
	if x.m.Failures() == 0 {
		t.Errorf("the refused refresh is not counted")
	}
	if c := x.m.Reporting().Calls[kube.KindAnnotations]; !strings.Contains(c.LastError, "262144") {
		t.Errorf("the refused refresh's error %q does not carry the API server's words", c.LastError)
	}
	// The conditions are still written.
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
	n := waitNode(t, s, node, "the condition's change beside the report left out in part", func(n *corev1.Node) bool {
		c := cond(n, "DiskUsageHigh")
		return c != nil && c.Status == corev1.ConditionFalse
	})
	if d, ok := parse(n, "storage"); !ok || d.Role != string(report.RoleControlPlane) {
		t.Errorf("the storage document is gone: %q", n.Annotations[report.AnnotationPrefix+"storage"])
	}
	if n.Annotations[foreign] != `{"someone":"else"}` || n.Annotations[big] == "" {
		t.Errorf("another writer's annotations changed: %q, %d bytes", n.Annotations[foreign], len(n.Annotations[big]))
	}

	// Room again: the grown report lands at the next refresh.
	patch(map[string]any{big: nil})
	n = waitNode(t, s, node, "the grown report", func(n *corev1.Node) bool {
		d, ok := parse(n, "disks")
		return ok && len(d.Disks) == 20
	})
	if n.Annotations[foreign] != `{"someone":"else"}` {
		t.Errorf("%s is %q after the refreshes, want it left alone", foreign, n.Annotations[foreign])
	}
}

// The report grows past the room the Node's other annotations leave (256
// KiB together, kube-apiserver's 422), against the real kube-apiserver: the
// documents that fit are written all the same (their updatedAt moves on),
// the one that does not is a small document of its own saying so, with its
// updatedAt, role and bootID; the journal says it once, not once a refresh;
// it is counted per domain; and once there is room the whole report lands
// at the next refresh, the journal saying so. Before, the whole refresh was
// refused, and every domain's updatedAt stood still until there was room.
func TestKubeReportDocumentsThatFitAreWrittenWhenOneDoesNot(t *testing.T) {
	s := apiServer(t)
	node := "node-report-part-fits-" + harness.Token()
	ctx := context.Background()
	registerNode(t, s, node)
	patch := func(annotations map[string]any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		if _, err := s.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot-1")
	det := report.NewDetails()
	det.SetBootID("boot-1")
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	logs := &testenv.SyncBuffer{}
	x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleControlPlane, Store: store, Details: det,
		Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: time.Second})
	rctx, cancel := context.WithCancel(ctx)
	x.cancel = cancel
	go func() { x.r.Run(rctx); close(x.done) }()
	defer x.stop()
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh, Message: "/ 95%"}, time.Now())

	type doc struct {
		UpdatedAt time.Time `json:"updatedAt"`
		Role      string    `json:"role"`
		BootID    string    `json:"bootID"`
		Disks     []any     `json:"disks"`
		LeftOut   string    `json:"leftOut"`
	}
	parse := func(n *corev1.Node, domain string) (d doc, ok bool) {
		v, there := n.Annotations[report.AnnotationPrefix+domain]
		return d, there && json.Unmarshal([]byte(v), &d) == nil
	}
	waitNode(t, s, node, "the report", func(n *corev1.Node) bool {
		_, ok := parse(n, "storage")
		return ok && cond(n, "DiskUsageHigh") != nil
	})

	// Fill the Node but for 2 KiB, then let the disks document grow past it.
	fillNodeLeaving(t, s, node, 2048, patch)
	growDisks(det)
	filled := time.Now()
	fitting := []string{"storage", "certs", "tamper", "services"}
	n := waitNodeFor(t, s, node, 15*time.Second, "the documents that fit refreshed after the Node filled up", func(n *corev1.Node) bool {
		for _, dm := range fitting {
			if d, ok := parse(n, dm); !ok || !d.UpdatedAt.After(filled) {
				return false
			}
		}
		return true
	})
	for _, dm := range fitting {
		if d, _ := parse(n, dm); d.Role != string(report.RoleControlPlane) || d.BootID != "boot-1" || d.LeftOut != "" {
			t.Errorf("%s document %q: want role, bootID and no leftOut", dm, n.Annotations[report.AnnotationPrefix+dm])
		}
	}
	d, ok := parse(n, "disks")
	if !ok || d.LeftOut == "" || d.Disks != nil || d.Role != string(report.RoleControlPlane) || d.BootID != "boot-1" || !d.UpdatedAt.After(filled) {
		t.Errorf("disks document %q: want a fresh one of its own saying it did not fit", n.Annotations[report.AnnotationPrefix+"disks"])
	}
	if n.Annotations[big] == "" {
		t.Errorf("another writer's annotation lost")
	}
	// Refreshes go on (paced by the report interval); the journal says it once.
	for x.m.LeftOut("disks") < 3 {
		time.Sleep(50 * time.Millisecond) // polling interval of an awaited count
	}
	if got := strings.Count(logs.String(), "report documents left out"); got != 1 {
		t.Errorf("%d journal lines about the documents left out after %v refreshes, want 1:\n%s", got, x.m.LeftOut("disks"), logs.String())
	}
	if !strings.Contains(logs.String(), "left_out=[disks]") {
		t.Errorf("the journal does not name the document left out:\n%s", logs.String())
	}
	for _, dm := range fitting {
		if v := x.m.LeftOut(dm); v != 0 {
			t.Errorf("%s counted %v times left out, want 0", dm, v)
		}
	}

	// Room again: the grown report lands at the next refresh.
	patch(map[string]any{big: nil})
	waitNode(t, s, node, "the grown report", func(n *corev1.Node) bool {
		d, ok := parse(n, "disks")
		return ok && len(d.Disks) == 20 && d.LeftOut == ""
	})
	// The line follows the write's answer, which the Node may show first.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "report documents fit on the Node again"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the journal does not say the report fits again within 5 s of the write:\n%s", logs.String())
			break
		}
	}
}

// big is the other writer's annotation that fills the Node.
const big = "tool.example.com/state"

// fillNodeLeaving adds another writer's annotation (with patch) that leaves
// free bytes of the Node's 256 KiB of annotations.
func fillNodeLeaving(t *testing.T, s *harness.APIServer, node string, free int, patch func(map[string]any)) {
	t.Helper()
	cur, err := s.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for k, v := range cur.Annotations {
		used += len(k) + len(v)
	}
	patch(map[string]any{big: strings.Repeat("x", 256*1024-used-len(big)-free)})
}

// growDisks gives the disks document 20 NVMe controllers with long models:
// about 4 KiB more.
func growDisks(det *report.Details) {
	var disks []map[string]any
	for i := range 20 {
		disks = append(disks, map[string]any{"controller": fmt.Sprintf("nvme%d", i), "model": strings.Repeat("M", 150)})
	}
	det.Set(report.Detail{Domain: "disks", Field: "disks", Value: disks})
}

// Where the Node's other annotations leave the report under about 400
// bytes, not even the tamper stub fits: against the real kube-apiserver,
// the Node's tamper annotation (a restart's in the same boot, with an
// operator's clear) is left as it is, neither written nor removed, so the
// clear reads back from it at the next start (report.ReportedClear); the
// other documents are not written (no stub fits either); the journal says
// so once, tamper is counted left out; the conditions are still written.
// Once there is room, the whole report lands, the journal saying so once.
func TestKubeReportTamperLeftAsItIsWhereNotEvenItsStubFits(t *testing.T) {
	s := apiServer(t)
	node := "node-report-tamper-as-is-" + harness.Token()
	ctx := context.Background()
	registerNode(t, s, node)
	patch := func(annotations map[string]any) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		if _, err := s.Admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cleared := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	tk := report.AnnotationPrefix + "tamper"
	// The Node as a run of this boot left it: its tamper annotation alone
	// (the other stubs removed for room), then another writer grew into the
	// room, leaving 50 bytes.
	before := fmt.Sprintf(`{"bootID":"boot-1","role":"controlplane","tamper":{"cleared":{"at":%q,"by":"operator"}}}`, cleared.Format(time.RFC3339))
	patch(map[string]any{tk: before})
	fillNodeLeaving(t, s, node, 50, patch)

	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot-1")
	det := report.NewDetails()
	det.SetBootID("boot-1")
	det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{"cleared": map[string]any{"at": cleared, "by": "operator"}}})
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	logs := &testenv.SyncBuffer{}
	var readBack time.Time
	x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleControlPlane, Store: store, Details: det,
		Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: time.Second,
		ReportedClear: func(at time.Time) { readBack = at }})
	rctx, cancel := context.WithCancel(ctx)
	x.cancel = cancel
	go func() { x.r.Run(rctx); close(x.done) }()
	defer x.stop()
	<-x.r.Adopted()
	if !readBack.Equal(cleared) {
		t.Errorf("the clear read back at start is %v, want %v", readBack, cleared)
	}
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh, Message: "/ 95%"}, time.Now())
	waitNode(t, s, node, "the condition", func(n *corev1.Node) bool { return cond(n, "DiskUsageHigh") != nil })
	for x.m.LeftOut("tamper") < 3 {
		time.Sleep(50 * time.Millisecond) // polling interval of an awaited count
	}
	n, err := s.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Annotations[tk] != before {
		t.Errorf("the tamper annotation is %q, want it left as it was, %q\n%s", n.Annotations[tk], before, logs.String())
	}
	if at := report.ReportedClear(n.Annotations); !at.Equal(cleared) {
		t.Errorf("the clear read back from the Node is %v, want %v", at, cleared)
	}
	for _, dm := range []string{"storage", "disks", "certs", "services"} {
		if v, ok := n.Annotations[report.AnnotationPrefix+dm]; ok {
			t.Errorf("%s on the Node (%q), where not even its stub fits", dm, v)
		}
	}
	if c := strings.Count(logs.String(), "tamper_left_as_is=true"); c != 1 {
		t.Errorf("%d journal lines saying the tamper annotation is left as it is after %v refreshes; want 1:\n%s", c, x.m.LeftOut("tamper"), logs.String())
	}

	// Room again: the whole report, the tamper document written with it.
	patch(map[string]any{big: nil})
	waitNode(t, s, node, "the whole report", func(n *corev1.Node) bool {
		var d struct {
			LeftOut string `json:"leftOut"`
			Updated string `json:"updatedAt"`
		}
		for _, dm := range []string{"storage", "disks", "certs", "tamper", "services"} {
			if json.Unmarshal([]byte(n.Annotations[report.AnnotationPrefix+dm]), &d) != nil || d.LeftOut != "" || d.Updated == "" {
				return false
			}
		}
		return report.ReportedClear(n.Annotations).Equal(cleared)
	})
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), "report documents fit on the Node again") && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // polling interval of an awaited line (written after the patch's answer)
	}
	if strings.Count(logs.String(), "report documents fit on the Node again") != 1 {
		t.Errorf("the journal does not say once that the report fits again:\n%s", logs.String())
	}
}
