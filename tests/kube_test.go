//go:build integration

// Package tests holds the integration tiers: the daemon against the real
// /dev/kmsg, a real systemd (PID 1 in fresh namespaces), containerd and a
// real kube-apiserver. They need root and Debian's packages (README, "Tests")
// and build only with -tags integration (make test, make test-integration),
// so that go test ./... on a developer's machine runs the unit tests alone.
package tests

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/tests/harness"
)

var (
	apiOnce sync.Once
	api     *harness.APIServer
	apiErr  error
)

// apiServer starts the package's kube-apiserver + etcd once (building them
// on first use; a fresh machine pays ~4 minutes once).
func apiServer(t testing.TB) *harness.APIServer {
	t.Helper()
	apiOnce.Do(func() {
		dir, err := os.MkdirTemp("", "autopilot-health-apiserver-")
		if err != nil {
			apiErr = err
			return
		}
		start := time.Now()
		api, apiErr = harness.StartAPIServer(dir)
		if apiErr == nil {
			fmt.Fprintf(os.Stderr, "kube-apiserver + etcd ready in %s (%s)\n", time.Since(start).Round(time.Millisecond), dir)
		}
	})
	if apiErr != nil {
		t.Fatalf("real kube-apiserver: %v", apiErr)
	}
	return api
}

func TestMain(m *testing.M) {
	// The harness.Parallel tests wait far more than they compute: let
	// MaxNamespaces of them run at once, not GOMAXPROCS (2 on CI's
	// machine), unless -parallel says otherwise.
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(harness.MaxNamespaces))
	}
	code := m.Run()
	if api != nil {
		api.Stop()
		if code == 0 {
			os.RemoveAll(api.Dir)
		} else {
			fmt.Fprintf(os.Stderr, "kube-apiserver logs kept in %s\n", api.Dir)
		}
	}
	stopSystemds()
	harness.RemoveBuildCache()
	os.Exit(code)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// registerNode creates a Node as the kubelet would, with kubelet's Ready.
func registerNode(t testing.TB, s *harness.APIServer, name string) {
	t.Helper()
	ctx := context.Background()
	_, err := s.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		time.Now().UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339))
	if _, err := s.Admin.CoreV1().Nodes().PatchStatus(ctx, name, []byte(patch)); err != nil {
		t.Fatal(err)
	}
}

func nodeClient(t *testing.T, s *harness.APIServer, node string) (kube.Client, string) {
	t.Helper()
	kc, err := s.NodeKubeconfig(node, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := kube.NewClient(kc, "autopilot-health-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, kc
}

type running struct {
	r      *kube.Reporter
	m      *kube.Metrics
	store  *report.Store
	det    *report.Details
	cancel context.CancelFunc
	done   chan struct{}
}

func startReporter(t *testing.T, client kube.Client, node string, store *report.Store) *running {
	t.Helper()
	return startReporterDetails(t, client, node, store, report.NewDetails())
}

// startReporterDetails starts a reporter on details the caller filled in
// first (the reporter may write the annotations as soon as it starts).
func startReporterDetails(t *testing.T, client kube.Client, node string, store *report.Store, det *report.Details) *running {
	t.Helper()
	x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: x.det,
		Log: quiet(), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute, EventCountFlush: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go func() { x.r.Run(ctx); close(x.done) }()
	t.Cleanup(x.stop)
	return x
}

// reporterWritingOn starts a reporter for node with a client of the
// kubeconfig kc (its log into logs; nil: none) and waits, once it has
// adopted the Node, for a first write to land: DiskUsageHigh=False,
// "before", on s's Node (what: the wait's words). It returns the reporter
// (x.store the store).
func reporterWritingOn(t *testing.T, s *harness.APIServer, kc, node, what string, logs *testenv.SyncBuffer) *running {
	t.Helper()
	log := quiet()
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, nil))
	}
	client, _, err := kube.NewClient(kc, "autopilot-health-test", log)
	if err != nil {
		t.Fatal(err)
	}
	x := startReporter(t, client, node, report.NewStore("boot"))
	<-x.r.Adopted()
	x.store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "before"}, time.Now())
	waitNode(t, s, node, what, has("DiskUsageHigh", "False", "DiskUsageOK"))
	return x
}

func (x *running) stop() {
	x.cancel()
	<-x.done
}

// waitNode polls the Node (as admin) until ok, or fails after 30 s.
func waitNode(t *testing.T, s *harness.APIServer, name, what string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	return waitNodeFor(t, s, name, 30*time.Second, what, ok)
}

// waitNodeFor is waitNode failing after limit: a change of a condition's
// message alone reaches the Node with the next heartbeat.
func waitNodeFor(t *testing.T, s *harness.APIServer, name string, limit time.Duration, what string, ok func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		n, err := s.Admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s on node %s: %v; conditions %+v", what, name, err, conditionsOf(n))
		}
		time.Sleep(20 * time.Millisecond) // polling interval of an awaited condition
	}
}

func conditionsOf(n *corev1.Node) []string {
	if n == nil {
		return nil
	}
	var out []string
	for _, c := range n.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s/%s@%s", c.Type, c.Status, c.Reason, c.LastTransitionTime.UTC().Format(time.RFC3339)))
	}
	return out
}

func cond(n *corev1.Node, ty string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == ty {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func has(ty string, st corev1.ConditionStatus, reason string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		c := cond(n, ty)
		return c != nil && c.Status == st && c.Reason == reason
	}
}

func readyIntact(t *testing.T, n *corev1.Node) {
	t.Helper()
	if c := cond(n, "Ready"); c == nil || c.Status != corev1.ConditionTrue || c.Reason != "KubeletReady" {
		t.Errorf("kubelet's Ready was touched: %+v", c)
	}
}

func TestKubeConditionsSetHeldChangedAndCarriedOver(t *testing.T) {
	s := apiServer(t)
	node := "node-conditions-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)

	store := report.NewStore("boot")
	x := startReporter(t, client, node, store)
	<-x.r.Adopted()
	set := time.Now()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, set)
	n := waitNode(t, s, node, "DiskUsageHigh=True", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	t.Logf("state change to visible on the Node: %s", time.Since(set).Round(time.Millisecond))
	readyIntact(t, n)
	ltt := cond(n, "DiskUsageHigh").LastTransitionTime

	store.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: "ClockSynchronized"}, time.Now())
	n = waitNode(t, s, node, "ClockNotSynchronized", has("ClockNotSynchronized", "False", "ClockSynchronized"))
	if c := cond(n, "DiskUsageHigh"); c == nil || c.Status != "True" || !c.LastTransitionTime.Equal(&ltt) {
		t.Errorf("DiskUsageHigh not held: %+v", c)
	}
	readyIntact(t, n)

	// Restart without local state: the Node's status and transition time carry over.
	x.stop()
	store2 := report.NewStore("boot")
	x2 := startReporter(t, client, node, store2)
	<-x2.r.Adopted()
	// Another reason, the same status (a message alone would wait for the
	// next heartbeat).
	store2.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemInodesHigh", Message: "/var 96% of inodes"}, time.Now())
	n = waitNode(t, s, node, "reason after restart", func(n *corev1.Node) bool {
		c := cond(n, "DiskUsageHigh")
		return c != nil && c.Reason == "FilesystemInodesHigh" && c.Message == "/var 96% of inodes"
	})
	if c := cond(n, "DiskUsageHigh"); !c.LastTransitionTime.Equal(&ltt) {
		t.Errorf("lastTransitionTime after restart %v, before %v", c.LastTransitionTime, ltt)
	}
	// Change: transition time moves. The Node keeps whole seconds: change
	// in a later second than the first transition, or the move is invisible.
	time.Sleep(time.Until(ltt.Add(time.Second))) // the API's one-second resolution, not a wait for a condition
	store2.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
	n = waitNode(t, s, node, "DiskUsageHigh=False", has("DiskUsageHigh", "False", "DiskUsageOK"))
	if c := cond(n, "DiskUsageHigh"); !c.LastTransitionTime.After(ltt.Time) {
		t.Errorf("transition time did not move: %v", c.LastTransitionTime)
	}
	readyIntact(t, n)
}

func TestKubeEventsLandAndAggregate(t *testing.T) {
	s := apiServer(t)
	node := "node-events-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	startReporter(t, client, node, store)
	msg := "Buffer I/O error on dev sdz1, logical block 42, async page read"
	for range 500 {
		store.Emit(report.Event{Reason: "IOError", Message: msg, Time: time.Now()})
	}
	store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := s.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		if err != nil {
			t.Fatal(err)
		}
		byReason := map[string]corev1.Event{}
		for _, e := range evs.Items {
			byReason[e.Reason] = e
		}
		io, th := byReason["IOError"], byReason["TaskHung"]
		if len(evs.Items) == 2 && io.Count == 500 && th.Count == 1 {
			if io.Type != "Warning" || io.InvolvedObject.Kind != "Node" || io.Source.Component != "autopilot-health" || io.Message != msg {
				t.Errorf("event %+v", io)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: %d, IOError count %d, TaskHung count %d", len(evs.Items), io.Count, th.Count)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestKubeAnnotations(t *testing.T) {
	s := apiServer(t)
	node := "node-annotations-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	det := report.NewDetails()
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	// A check whose last run failed after one that collected its fields:
	// its document names it stale.
	det.Replace("CertRenewalFailing", []report.Detail{{Domain: "certs", Field: "certs", Value: []map[string]any{{"path": "/x.pem", "daysLeft": 40}}}})
	det.Failed("CertRenewalFailing", nil, "check did not finish within its timeout of 30s")
	startReporterDetails(t, client, node, report.NewStore("boot"), det)
	n := waitNode(t, s, node, "report annotations", func(n *corev1.Node) bool {
		return len(n.Annotations) >= len(report.Domains) && n.Annotations[report.AnnotationPrefix+"storage"] != ""
	})
	for _, d := range report.Domains {
		v := n.Annotations[report.AnnotationPrefix+d.Name]
		var doc map[string]any
		if err := json.Unmarshal([]byte(v), &doc); err != nil {
			t.Fatalf("%s: %v: %s", d.Name, err, v)
		}
		if _, err := time.Parse(time.RFC3339, fmt.Sprint(doc["updatedAt"])); err != nil || doc["role"] != "worker" {
			t.Errorf("%s: %s", d.Name, v)
		}
	}
	if v := n.Annotations[report.AnnotationPrefix+"storage"]; !strings.Contains(v, `"filesystems":[{"mountPoint":"/","usedPercent":12}]`) || strings.Contains(v, "stale") {
		t.Errorf("storage: %s", v)
	}
	var certs struct {
		Certs []map[string]any `json:"certs"`
		Stale []report.Stale   `json:"stale"`
	}
	v := n.Annotations[report.AnnotationPrefix+"certs"]
	if err := json.Unmarshal([]byte(v), &certs); err != nil || len(certs.Certs) != 1 || len(certs.Stale) != 1 ||
		certs.Stale[0].Check != "CertRenewalFailing" || certs.Stale[0].Error != "check did not finish within its timeout of 30s" {
		t.Errorf("certs: %v: %s", err, v)
	}
}

// A restart before the first report of a boot, against the real API
// server: the first write of the conditions in a boot carries this boot's
// report (nodes/status takes the annotations in the same patch), so a
// daemon back before its first pass, without its state file and without
// the kernel line, still takes the True it set in this boot for this
// boot's; before, the report of the boot before stood beside it until the
// first pass, and the True was lowered.
func TestKubeRestartBeforeTheFirstReportKeepsTheKernelCondition(t *testing.T) {
	s := apiServer(t)
	node := "node-restart-before-report-" + harness.Token()
	ctx := context.Background()
	registerNode(t, s, node)
	// The boot before: its report.
	prev := `{"metadata":{"annotations":{"autopilot.syself.com/storage":"{\"schemaVersion\":1,\"bootID\":\"boot-a\"}"}}}`
	if _, err := s.Admin.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(prev), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	client, _ := nodeClient(t, s, node)
	bootStart := time.Now().Add(-time.Minute)
	never := make(chan struct{}) // the checks' first pass, not done before the restart
	run := func() *running {
		store := report.NewStore("boot-b")
		store.SetBootStart(bootStart)
		store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusUnknown, Reason: report.ReasonNoData,
			Message: "the kernel log has not been read yet"}, time.Now())
		det := report.NewDetails()
		det.SetBootID("boot-b")
		x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
		x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: det,
			Log: quiet(), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute, FirstPass: never})
		rctx, cancel := context.WithCancel(ctx)
		x.cancel = cancel
		go func() { x.r.Run(rctx); close(x.done) }()
		<-x.r.Adopted()
		return x
	}
	x := run()
	line := time.Now().Add(-2 * time.Second).Truncate(time.Second)
	x.store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusTrue, Reason: report.ReasonFilesystemIsReadOnly,
		Message: "EXT4-fs (sda2): Remounting filesystem read-only"}, line)
	n := waitNode(t, s, node, "ReadonlyFilesystem True", func(n *corev1.Node) bool {
		c := cond(n, "ReadonlyFilesystem")
		return c != nil && c.Status == corev1.ConditionTrue
	})
	if got := report.ReportBootID(n.Annotations); got != "boot-b" {
		t.Errorf("the report's boot beside this boot's conditions: %q; want boot-b", got)
	}
	x.stop() // before the first pass: no report written by the annotation loop
	restart := time.Now()

	x = run()
	defer x.stop()
	// The reader has read the ring buffer to its end: the line is gone.
	x.store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusFalse, Reason: "FilesystemIsNotReadOnly",
		Message: "no matching kernel message in the records read"}, time.Now())
	n = waitNode(t, s, node, "the first write after the restart", func(n *corev1.Node) bool {
		c := cond(n, "ReadonlyFilesystem")
		return c != nil && !c.LastHeartbeatTime.Time.Before(restart.Truncate(time.Second))
	})
	if c := cond(n, "ReadonlyFilesystem"); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(line) {
		t.Errorf("ReadonlyFilesystem after the restart: %s/%s since %v; want True since %v", c.Status, c.Reason, c.LastTransitionTime.Time, line)
	}
}

// foldRecorder is the node's client, recording each status write that
// carries the report annotations (a report refresh with the heartbeat):
// the Node as admin read it just before, and the API server's answer.
type foldRecorder struct {
	kube.Client
	s    *harness.APIServer
	node string
	mu   sync.Mutex
	got  []foldWrite
}

type foldWrite struct {
	before *corev1.Node
	answer *kubeapi.Node
	err    error
}

func (c *foldRecorder) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	if !bytes.Contains(patch, []byte(`"annotations"`)) {
		return c.Client.PatchNodeStatus(ctx, name, patch)
	}
	before, err := c.s.Admin.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	n, err := c.Client.PatchNodeStatus(ctx, name, patch)
	c.mu.Lock()
	c.got = append(c.got, foldWrite{before: before, answer: n, err: err})
	c.mu.Unlock()
	return n, err
}

func (c *foldRecorder) writes() []foldWrite {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]foldWrite(nil), c.got...)
}

// The heartbeat rides on the report refresh before it falls due, against
// the real API server with NodeRestriction, as the node's own credentials:
// the one nodes/status patch that carries the conditions and the report
// annotations is accepted, and moves both the documents' updatedAt and
// every condition's lastHeartbeatTime. (A heartbeat period of 3 s and a
// report interval of 2 s: the refresh 2 s after the first write carries the
// heartbeat due at 3 to 3.3 s.)
func TestKubeHeartbeatRidesOnTheReportRefresh(t *testing.T) {
	s := apiServer(t)
	node := "node-heartbeat-with-report-" + harness.Token()
	registerNode(t, s, node)
	nc, _ := nodeClient(t, s, node)
	client := &foldRecorder{Client: nc, s: s, node: node}
	store := report.NewStore("boot")
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
	store.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: report.ReasonClockSynchronized}, time.Now())
	det := report.NewDetails()
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: det,
		Log: quiet(), Metrics: x.m, HeartbeatPeriod: 3 * time.Second, ReportInterval: 2 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go func() { x.r.Run(ctx); close(x.done) }()
	defer x.stop()
	deadline := time.Now().Add(30 * time.Second)
	for len(client.writes()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no report refresh carried the heartbeat in 30 s (writes: %v)", x.m.Reporting().Calls)
		}
		time.Sleep(50 * time.Millisecond)
	}
	w := client.writes()[0]
	if w.err != nil {
		t.Fatalf("the status patch with the report, as the node: %v", w.err)
	}
	updatedAt := func(annotations map[string]string) time.Time {
		var doc struct {
			UpdatedAt time.Time `json:"updatedAt"`
		}
		json.Unmarshal([]byte(annotations[report.AnnotationPrefix+"storage"]), &doc)
		return doc.UpdatedAt
	}
	before, after := updatedAt(w.before.Annotations), updatedAt(w.answer.Metadata.Annotations)
	if before.IsZero() || !after.After(before) {
		t.Errorf("the report's updatedAt: %v before the write, %v after; want it moved on (the report written before: %q)", before, after, w.before.Annotations[report.AnnotationPrefix+"storage"])
	}
	if !strings.Contains(w.answer.Metadata.Annotations[report.AnnotationPrefix+"storage"], `"filesystems":[{"mountPoint":"/","usedPercent":12}]`) {
		t.Errorf("the report written with the heartbeat: %s", w.answer.Metadata.Annotations[report.AnnotationPrefix+"storage"])
	}
	for _, ty := range []string{"DiskUsageHigh", "ClockNotSynchronized"} {
		b := cond(w.before, ty)
		var a *kubeapi.NodeCondition
		for i, c := range w.answer.Status.Conditions {
			if c.Type == ty {
				a = &w.answer.Status.Conditions[i]
			}
		}
		if b == nil || a == nil || !a.LastHeartbeatTime.Time.After(b.LastHeartbeatTime.Time) || !a.LastTransitionTime.Time.Equal(b.LastTransitionTime.Time) {
			t.Errorf("%s before the write %+v, after %+v; want its heartbeat moved on, its transition time kept", ty, b, a)
		}
	}
	readyIntact(t, waitNode(t, s, node, "the Node after the write", func(*corev1.Node) bool { return true }))
}

// crowdNode writes, as admin, the Node's annotations of a reboot where
// this boot's report may not fit: another writer's others bytes
// ("tool.example.com/state"), the earlier boot's (boot-a) storage
// document, and extra.
func crowdNode(t *testing.T, s *harness.APIServer, node string, others int, extra map[string]string) {
	t.Helper()
	a := map[string]string{
		"tool.example.com/state":            strings.Repeat("x", others),
		report.AnnotationPrefix + "storage": `{"schemaVersion":1,"bootID":"boot-a"}`,
	}
	maps.Copy(a, extra)
	big, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": a}})
	if _, err := s.Admin.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, big, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startBeforeFirstPass starts a reporter with the node's credentials on
// this boot's (boot-b) store, DiskUsageHigh True, and details whose
// storage holds 30 pods' volumes (a few KiB: what the checks collected
// before the first write), with what fill adds; the checks' first pass
// never ends, so only the conditions' writes carry the report.
func startBeforeFirstPass(t *testing.T, s *harness.APIServer, node string, fill func(*report.Details)) *running {
	t.Helper()
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot-b")
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh,
		Message: "/var at 97 %"}, time.Now())
	det := report.NewDetails()
	det.SetBootID("boot-b")
	if fill != nil {
		fill(det)
	}
	var fss []map[string]string
	for i := range 30 {
		fss = append(fss, map[string]string{"mountPoint": fmt.Sprintf("/var/lib/kubelet/pods/%032d/volumes", i), "device": "/dev/sda1"})
	}
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: fss})
	x := &running{store: store, det: det, m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: det,
		Log: quiet(), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute, FirstPass: make(chan struct{})})
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go func() { x.r.Run(ctx); close(x.done) }()
	t.Cleanup(x.stop)
	return x
}

// A Node whose other writers' annotations leave no room for this boot's
// report, against the real API server: the status write that carries the
// report is refused (422, metadata.annotations too long), and the
// conditions must land all the same, with the earlier boot's report taken
// off the Node rather than left beside them.
func TestKubeConditionsLandWhenTheEarlyReportDoesNotFit(t *testing.T) {
	s := apiServer(t)
	node := "node-report-does-not-fit-" + harness.Token()
	registerNode(t, s, node)
	crowdNode(t, s, node, 255*1024, nil)
	startBeforeFirstPass(t, s, node, nil)
	n := waitNode(t, s, node, "DiskUsageHigh True", func(n *corev1.Node) bool {
		c := cond(n, "DiskUsageHigh")
		return c != nil && c.Status == corev1.ConditionTrue
	})
	if b := report.ReportBootID(n.Annotations); b == "boot-a" {
		t.Errorf("the earlier boot's report beside this boot's conditions")
	}
	if n.Annotations["tool.example.com/state"] == "" {
		t.Errorf("another writer's annotation lost")
	}
}

// After a reboot, this boot's first report does not fit beside the Node's
// other annotations (about 2 KiB free): the first write of the conditions,
// as the node (NodeRestriction), carries what fits of it, tamper first, so
// the operator's clear the earlier boot's tamper document published stays
// on the Node, in this boot's document; the earlier boot's report leaves.
// Before, the five annotations were removed with the conditions' write, and
// the clear with them until the first refresh.
func TestKubeEarlyReportThatDoesNotFitKeepsTheClear(t *testing.T) {
	s := apiServer(t)
	node := "node-early-fit-clear-" + harness.Token()
	registerNode(t, s, node)
	cleared := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	tk := report.AnnotationPrefix + "tamper"
	crowdNode(t, s, node, 256*1024-2500, map[string]string{
		tk: fmt.Sprintf(`{"schemaVersion":1,"bootID":"boot-a","tamper":{"cleared":{"at":%q,"by":"operator"}}}`, cleared.Format(time.RFC3339)),
	})
	startBeforeFirstPass(t, s, node, func(det *report.Details) {
		det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{"cleared": map[string]any{"at": cleared, "by": "operator"}}})
	})
	n := waitNode(t, s, node, "DiskUsageHigh True", func(n *corev1.Node) bool {
		c := cond(n, "DiskUsageHigh")
		return c != nil && c.Status == corev1.ConditionTrue
	})
	if b := report.ReportBootID(n.Annotations); b != "boot-b" {
		t.Errorf("the report's boot beside this boot's conditions is %q, want boot-b: %q", b, n.Annotations[tk])
	}
	if strings.Contains(n.Annotations[report.AnnotationPrefix+"storage"], "/var/lib/kubelet/pods") {
		t.Fatalf("storage written whole: the test needs a report that does not fit")
	}
	if at := report.ReportedClear(n.Annotations); !at.Equal(cleared) {
		t.Errorf("the clear on the Node after the first write of the conditions is %v, want %v: tamper %q", at, cleared, n.Annotations[tk])
	}
	if n.Annotations["tool.example.com/state"] == "" {
		t.Errorf("another writer's annotation lost")
	}
}

// The Node deleted and registered anew (as the kubelet does) while the
// daemon reports: the report annotations never stand on the new Node
// without this boot's conditions. The report write carries the UID of the
// Node it knows, which kube-apiserver refuses on another Node; the
// conditions go first. A watch on the Node sees every version it takes.
func TestKubeReportNeverLandsOnANodeRegisteredAnew(t *testing.T) {
	s := apiServer(t)
	node := "node-anew-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	x := &running{store: store, det: report.NewDetails(), m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/", "usedPercent": 12}}})
	// A report every second: the first write after the registration comes
	// at once, where the daemon's would come within its 2 minutes.
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: x.det,
		Log: quiet(), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: time.Second, EventCountFlush: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go func() { x.r.Run(ctx); close(x.done) }()
	t.Cleanup(x.stop)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	reported := func(n *corev1.Node) bool { return n.Annotations[report.AnnotationPrefix+"storage"] != "" }
	first := waitNode(t, s, node, "conditions and report", func(n *corev1.Node) bool {
		return reported(n) && cond(n, "DiskUsageHigh") != nil
	})

	w, err := s.Admin.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector: "metadata.name=" + node, ResourceVersion: first.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := s.Admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	registerNode(t, s, node)
	deadline := time.After(30 * time.Second)
	versions := 0
	for {
		select {
		case <-deadline:
			t.Fatalf("the report and the conditions not both back on the Node registered anew within 30 s (%d versions of it seen)", versions)
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			n, isNode := ev.Object.(*corev1.Node)
			if !isNode || n.UID == first.UID || ev.Type == "DELETED" {
				continue
			}
			versions++
			switch r, c := reported(n), cond(n, "DiskUsageHigh") != nil; {
			case r && !c:
				t.Fatalf("version %s of the Node registered anew has the report and not the conditions: %v", n.ResourceVersion, conditionsOf(n))
			case r && c:
				t.Logf("back after %d versions of the new Node, the conditions first", versions)
				return
			}
		}
	}
}

// kube-apiserver stops for a while (etcd stays): the daemon's state keeps
// changing; when the API returns the Node converges on the last state, with
// the transition time of the last change.
func TestKubeOutageConverges(t *testing.T) {
	s := apiServer(t)
	node := "node-outage-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	x := startReporter(t, client, node, store)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
	waitNode(t, s, node, "DiskUsageHigh=False", has("DiskUsageHigh", "False", "DiskUsageOK"))

	s.StopKubeAPIServerFor(t)
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "1"}, time.Now())
	store.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusTrue, Reason: "ClockUnsynchronized"}, time.Now())
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "2"}, time.Now())
	last := time.Now()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemInodesHigh", Message: "3"}, last)
	// Wait until the reporter has failed at least twice (so it is in backoff).
	for deadline := time.Now().Add(20 * time.Second); failures(x.m) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the reporter never noticed the API server was down")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.StartKubeAPIServer(); err != nil {
		t.Fatal(err)
	}
	n := waitNode(t, s, node, "converged state", func(n *corev1.Node) bool {
		return has("DiskUsageHigh", "True", "FilesystemInodesHigh")(n) && has("ClockNotSynchronized", "True", "ClockUnsynchronized")(n)
	})
	c := cond(n, "DiskUsageHigh")
	if c.Message != "3" || c.LastTransitionTime.Unix() != last.Unix() {
		t.Errorf("after the outage: %+v, want message 3 since %v", c, last)
	}
	readyIntact(t, n)
}

func failures(m *kube.Metrics) float64 { return m.Failures() }

// A node identity cannot write another node: the API refuses, the daemon
// counts it and says so, the other node is untouched; and what the other
// node holds (nodes may read other nodes), a tamper finding held forever
// among it, is not taken over as this node's.
func TestKubeCannotTouchAnotherNode(t *testing.T) {
	s := apiServer(t)
	tok := harness.Token()
	self, other := "node-self-"+tok, "node-victim-"+tok
	registerNode(t, s, self)
	registerNode(t, s, other)
	victim, err := s.Admin.CoreV1().Nodes().Get(context.Background(), other, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	victim.Status.Conditions = append(victim.Status.Conditions, corev1.NodeCondition{Type: "NodeTampered", Status: corev1.ConditionTrue,
		Reason: "ProtectedFileChanged", Message: "the victim's own finding", LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()})
	if _, err := s.Admin.CoreV1().Nodes().UpdateStatus(context.Background(), victim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	client, kc := nodeClient(t, s, self)
	if id := kube.CredentialsUser(kc); id != "system:node:"+self {
		t.Fatalf("the node kubeconfig's user: %q", id)
	}
	store := report.NewStore("boot")
	var logs testenv.SyncBuffer
	reg := prometheus.NewRegistry()
	m := kube.NewMetrics(reg)
	// Every kind's forbidden series is there at 0 before the first call,
	// so the refusals below are a rise from 0 Prometheus sees.
	forbidden0 := apiWrites(t, reg, "forbidden")
	if len(forbidden0) != 5 {
		t.Errorf("api_writes_total{result=\"forbidden\"} before any call: %v, want every kind's at 0", forbidden0)
	}
	for kind, v := range forbidden0 {
		if v != 0 {
			t.Errorf("api_writes_total{kind=%q,result=\"forbidden\"} = %v before any call", kind, v)
		}
	}
	r := kube.New(kube.Options{Client: client, NodeName: other, Identity: kube.CredentialsUser(kc), Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
		Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: m, HeartbeatPeriod: time.Minute, ReportInterval: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
	for deadline := time.Now().Add(20 * time.Second); m.Forbidden() == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("no forbidden API call counted; log:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The real API server's refusal (NodeRestriction) counts under
	// forbidden, on those series.
	total := 0.0
	for _, v := range apiWrites(t, reg, "forbidden") {
		total += v
	}
	if total == 0 || total != m.Forbidden() {
		t.Errorf("api_writes_total{result=\"forbidden\"} sum to %v, %v refused calls counted", total, m.Forbidden())
	}
	if !strings.Contains(logs.String(), "refused by the API server: the credentials do not allow it") {
		t.Errorf("the daemon did not say clearly that it was refused:\n%s", logs.String())
	}
	n, _ := s.Admin.CoreV1().Nodes().Get(context.Background(), other, metav1.GetOptions{})
	if cond(n, "DiskUsageHigh") != nil {
		t.Error("wrote a condition on another node")
	}
	if c, ok := store.Get("NodeTampered"); ok {
		t.Errorf("the other node's tamper finding was taken over: %+v", c)
	}
	if !strings.Contains(logs.String(), "node_name names another node than the credentials do") {
		t.Errorf("the daemon did not say node_name names another node:\n%s", logs.String())
	}
}

// The real API server resumes the node's TLS session on a new connection
// (the annotation writes each open one: the API server closes a connection
// idle for 90 s), and a resumed connection still writes as the node, only
// to its own Node (NodeRestriction), over HTTP/1.1.
func TestKubeNewConnectionsResumeTheTLSSession(t *testing.T) {
	s := apiServer(t)
	tok := harness.Token()
	node, other := "node-resume-"+tok, "node-resume-other-"+tok
	registerNode(t, s, node)
	registerNode(t, s, other)
	client, _ := nodeClient(t, s, node)
	closer, ok := client.(interface{ CloseIdle() })
	if !ok {
		t.Fatalf("the daemon's client (%T) cannot close its idle connections", client)
	}
	ctx := context.Background()
	full0, resumed0 := kube.TLSHandshakes()
	for i := range 3 {
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test.autopilot.syself.com/resume":"%d"}}}`, i)
		if _, err := client.PatchNode(ctx, node, patch); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if _, err := client.PatchNode(ctx, other, patch); !apierrors.IsForbidden(err) {
			t.Errorf("write %d to another node: %v, want forbidden", i, err)
		}
		closer.CloseIdle()
	}
	full, resumed := kube.TLSHandshakes()
	if full-full0 != 1 || resumed-resumed0 != 2 {
		t.Errorf("three connections: %d full and %d resumed TLS handshakes, want 1 and 2", full-full0, resumed-resumed0)
	}
	// The API server offers HTTP/2; the daemon asks for HTTP/1.1 only
	// (README: "HTTP/1.1 to the API server").
	if p := kube.APIProtocol(); p != "http/1.1" {
		t.Errorf("the API server's connection speaks %q, want http/1.1", p)
	}
	n, err := s.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Annotations["test.autopilot.syself.com/resume"]; got != "2" {
		t.Errorf("the node's annotation after three writes: %q", got)
	}
}

// A rotated client certificate is the identity the real API server sees
// from the next call on, though the session of the certificate before
// could be resumed (the API server takes a resumed session's identity
// from the handshake that made it, and resumes the session of a
// certificate still valid): the client made for the new certificate has a
// session cache of its own, so its first connection makes a full
// handshake that presents the new certificate, and the ones after it
// resume that new session. Here the certificate is rotated to another
// node's, so the identity shows in what NodeRestriction allows.
func TestKubeRotatedCertificateIsNotResumedFromTheOldSession(t *testing.T) {
	s := apiServer(t)
	tok := harness.Token()
	first, second := "node-resume-rot-a-"+tok, "node-resume-rot-b-"+tok
	registerNode(t, s, first)
	registerNode(t, s, second)
	client, kc := nodeClient(t, s, first)
	closer := client.(interface{ CloseIdle() })
	ctx := context.Background()
	write := func(node string) error {
		defer closer.CloseIdle()
		_, err := client.PatchNode(ctx, node, []byte(`{"metadata":{"annotations":{"test.autopilot.syself.com/rotated":"x"}}}`))
		return err
	}
	full0, resumed0 := kube.TLSHandshakes()
	for i := range 2 {
		if err := write(first); err != nil {
			t.Fatalf("write %d with the first node's certificate: %v", i, err)
		}
	}
	if full, resumed := kube.TLSHandshakes(); full-full0 != 1 || resumed-resumed0 != 1 {
		t.Fatalf("two connections before the rotation: %d full and %d resumed TLS handshakes, want 1 and 1", full-full0, resumed-resumed0)
	}
	// The kubelet's rotation: the file replaced (another certificate, the
	// old one still valid for an hour).
	if err := s.WriteClientCert(filepath.Join(filepath.Dir(kc), "client.pem"), "system:node:"+second, []string{"system:nodes"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	full1, resumed1 := kube.TLSHandshakes()
	if err := write(first); !apierrors.IsForbidden(err) {
		t.Errorf("a write to the first node after the rotation to the second's certificate: %v, want forbidden (the API server saw the old identity)", err)
	}
	if full, resumed := kube.TLSHandshakes(); full-full1 != 1 || resumed-resumed1 != 0 {
		t.Errorf("the first connection after the rotation: %d full and %d resumed TLS handshakes, want 1 and 0", full-full1, resumed-resumed1)
	}
	for i := range 2 {
		if err := write(second); err != nil {
			t.Fatalf("write %d to the second node with its certificate: %v", i, err)
		}
	}
	if full, resumed := kube.TLSHandshakes(); full-full1 != 1 || resumed-resumed1 != 2 {
		t.Errorf("three connections after the rotation: %d full and %d resumed TLS handshakes, want 1 and 2", full-full1, resumed-resumed1)
	}
}

// The kubelet rotates its client certificate by moving the file: the daemon
// keeps writing after the old certificate expired, without a restart, and
// without client-go's certificate reloader (whose work queue woke the daemon
// every 10 s).
func TestKubeClientCertRotation(t *testing.T) {
	s := apiServer(t)
	node := "node-rotation-" + harness.Token()
	registerNode(t, s, node)
	// The harness's own clients run client-go's reloader; the daemon's
	// must not add one.
	reloaders := func() int {
		var stacks bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&stacks, 2)
		return strings.Count(stacks.String(), "client-go/transport.(*dynamicClientCert)")
	}
	reloaders0 := reloaders()
	expires := time.Now().Add(4 * time.Second)
	kc, err := s.NodeKubeconfig(node, expires)
	if err != nil {
		t.Fatal(err)
	}
	client, _, err := kube.NewClient(kc, "autopilot-health-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	// (The harness's reloaders may end meanwhile: client-go stops one when
	// its transport is collected.)
	if n := reloaders() - reloaders0; n > 0 {
		t.Errorf("the client started %d goroutines of client-go's certificate reloader", n)
	}
	store := report.NewStore("boot")
	x := startReporter(t, client, node, store)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "before"}, time.Now())
	waitNode(t, s, node, "write with the first certificate", has("DiskUsageHigh", "False", "DiskUsageOK"))

	// Rotate: a new certificate in the same file, then let the old one expire.
	if err := s.WriteClientCert(filepath.Join(filepath.Dir(kc), "client.pem"), "system:node:"+node, []string{"system:nodes"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(expires) + time.Second) // the old certificate is now expired
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "after"}, time.Now())
	waitNode(t, s, node, "write after rotation", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	// The call after the rotation noticed the new file and connected
	// anew with it: not one call was refused.
	if f := x.m.Failures(); f != 0 {
		t.Errorf("%v API calls failed around the rotation", f)
	}
}

// kubeadm init writes kubelet.conf with the client certificate embedded
// (valid a year); its kubelet-finalize phase rewrites it to name
// kubelet-client-current.pem by path. The daemon that read the first one
// keeps writing after the embedded certificate expired, without a restart:
// each call notices the rewritten kubeconfig and connects anew with it.
func TestKubeconfigRewrittenAfterKubeadmInit(t *testing.T) {
	s := apiServer(t)
	node := "node-kubeadm-" + harness.Token()
	registerNode(t, s, node)
	expires := time.Now().Add(4 * time.Second)
	kc, err := s.NodeKubeconfig(node, expires)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(kc)
	pair, err := os.ReadFile(filepath.Join(dir, "client.pem"))
	if err != nil {
		t.Fatal(err)
	}
	byPath, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	// As kubeadm init writes it: the certificate and key embedded (the
	// kubeconfig's CA by path, as the harness has it).
	embedded := regexp.MustCompile(`client-certificate: .*\n\s*client-key: .*`).ReplaceAllString(string(byPath),
		fmt.Sprintf("client-certificate-data: %[1]s\n    client-key-data: %[1]s", base64.StdEncoding.EncodeToString(pair)))
	if embedded == string(byPath) {
		t.Fatalf("no client certificate by path in\n%s", byPath)
	}
	if err := os.WriteFile(kc, []byte(embedded), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "client.pem"))
	var logs testenv.SyncBuffer
	x := reporterWritingOn(t, s, kc, node, "write with the embedded certificate", &logs)
	store := x.store

	// kubelet-finalize: the kubelet's rotated certificate, and kubelet.conf
	// naming it by path; then the embedded one expires.
	if err := s.WriteClientCert(filepath.Join(dir, "client.pem"), "system:node:"+node, []string{"system:nodes"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kc+".tmp", byPath, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(kc+".tmp", kc); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(expires) + time.Second)
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "after"}, time.Now())
	waitNode(t, s, node, "write after the embedded certificate expired", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	if f := x.m.Failures(); f != 0 {
		t.Errorf("%v API calls failed around the rewrite:\n%s", f, logs.String())
	}
	if n := strings.Count(logs.String(), "kubeconfig reloaded"); n != 1 {
		t.Errorf("the rewrite was logged %d times, want once:\n%s", n, logs.String())
	}
}

// The whole daemon with the node's kubeconfig: its real checks land on the
// Node with the five report annotations, and a daemon restart keeps every
// transition time.
func TestDaemonReportsToRealAPIServer(t *testing.T) {
	s := apiServer(t)
	node := "node-daemon-" + harness.Token()
	registerNode(t, s, node)
	_, kc := nodeClient(t, s, node)
	cfg := config.Default()
	cfg.NodeName, cfg.Role, cfg.GPU = node, "worker", "false"
	cfg.StateDir = t.TempDir()
	cfg.Kubernetes.Kubeconfig = kc
	cfg.Runner.FirstRunSpread = config.Duration{}
	noHostSystemd(cfg)
	run := func() *corev1.Node {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		d, err := daemon.New(cfg, quiet(), daemon.Options{Version: "test", Listener: ln})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		start := time.Now()
		n := waitNode(t, s, node, "the daemon's conditions and report", func(n *corev1.Node) bool {
			for _, ty := range []string{"DiskUsageHigh", "ClockNotSynchronized"} {
				c := cond(n, ty)
				if c == nil || c.LastHeartbeatTime.Time.Before(start.Truncate(time.Second)) {
					return false
				}
			}
			// The report written once every check has run carries
			// DiskUsageHigh's list; a write of the conditions before
			// that carried the report as far as collected then
			// (README, "Report annotations"), without it: waited out,
			// not taken for the report (CI at 71e0f7e read it).
			return strings.Contains(n.Annotations[report.AnnotationPrefix+"storage"], `"filesystems":[{`)
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return n
	}
	first := run()
	readyIntact(t, first)
	second := run()
	for _, ty := range []string{"DiskUsageHigh", "ClockNotSynchronized"} {
		a, b := cond(first, ty), cond(second, ty)
		if a.Status != b.Status || !a.LastTransitionTime.Equal(&b.LastTransitionTime) {
			t.Errorf("%s across a daemon restart: %s since %v, then %s since %v", ty, a.Status, a.LastTransitionTime, b.Status, b.LastTransitionTime)
		}
	}
	readyIntact(t, second)
}

// noHostSystemd turns off the checks that talk to this machine's systemd
// (and would restart its kubelet): tests reach a systemd of their own.
func noHostSystemd(cfg *config.Config) {
	cfg.Checks.KubeletUnhealthy.Enabled = false
	cfg.Checks.ContainerRuntimeUnhealthy.Enabled = false
	cfg.Checks.ServiceNotRecovering.Enabled = false
	cfg.Checks.NodeServiceDown.Enabled = false
}

// A node that has not joined yet has no kubeconfig: the daemon runs
// standalone, keeps the events it emits meanwhile, and once the kubelet
// writes the kubeconfig it reports: the queued event and its conditions
// reach the real API server.
func TestDaemonPicksUpKubeconfigLater(t *testing.T) {
	s := apiServer(t)
	node := "node-joins-later-" + harness.Token()
	registerNode(t, s, node)
	_, kc := nodeClient(t, s, node)
	cfg := config.Default()
	cfg.NodeName, cfg.Role, cfg.GPU = node, "worker", "false"
	cfg.StateDir = t.TempDir()
	cfg.Kubernetes.Kubeconfig = filepath.Join(t.TempDir(), "kubelet.conf") // not there yet
	cfg.Runner.FirstRunSpread = config.Duration{}
	cfg.Kmsg.Enabled = false
	noHostSystemd(cfg)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := daemon.New(cfg, quiet(), daemon.Options{Version: "test", Listener: ln, KubeconfigPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	d.Store().Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:7 blocked for more than 120 seconds. (before the join)", Time: time.Now()})
	waitFor(t, d.Store(), nil, 10*time.Second, "the first pass", func() bool {
		_, ok := d.Store().Get("DiskUsageHigh")
		return ok
	})
	if m := scrape(t, d); !strings.Contains(m, "autopilot_health_kubernetes_reporting 0") {
		t.Error("not standalone while the kubeconfig is missing")
	}
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Kubernetes.Kubeconfig, b, 0o600); err != nil { // the kubelet joins
		t.Fatal(err)
	}
	waitNode(t, s, node, "the daemon's conditions", func(n *corev1.Node) bool { return cond(n, "DiskUsageHigh") != nil })
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := s.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err == nil {
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == node && strings.HasSuffix(e.Message, "(before the join)") {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event emitted before the kubeconfig appeared never reached the API server (%v)", err)
		}
		time.Sleep(50 * time.Millisecond) // polling the API server for an awaited event
	}
}

// apiWrites returns autopilot_health_api_writes_total's series of result
// on reg, by kind.
func apiWrites(t *testing.T, reg *prometheus.Registry, result string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_api_writes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["result"] == result {
				out[l["kind"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
