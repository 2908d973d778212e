package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
)

const node = "test-node"

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func kubeletNode(extra ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{"other/annotation": "keep"}},
		Status: corev1.NodeStatus{Conditions: append([]corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.NewTime(t0)},
			{Type: "SomeoneElses", Status: corev1.ConditionFalse, Reason: "Fine"},
		}, extra...)},
	}
}

type harness struct {
	client *fake.Clientset
	store  *report.Store
	det    *report.Details
	r      *Reporter
	m      *Metrics
	cancel context.CancelFunc
	done   chan struct{}
}

func start(t *testing.T, client *fake.Clientset, store *report.Store) *harness {
	t.Helper()
	return startWith(t, client, store, report.NewDetails())
}

func startWith(t *testing.T, client *fake.Clientset, store *report.Store, det *report.Details) *harness {
	t.Helper()
	return startLogged(t, client, store, det, io.Discard)
}

// startLogged is startWith, logging to logs.
func startLogged(t *testing.T, client *fake.Clientset, store *report.Store, det *report.Details, logs io.Writer) *harness {
	t.Helper()
	return startOpts(t, client, store, det, logs, nil)
}

// startOpts is startLogged with the reporter's options changed by opts (if
// not nil) before it starts.
func startOpts(t *testing.T, client *fake.Clientset, store *report.Store, det *report.Details, logs io.Writer, opts func(*Options)) *harness {
	t.Helper()
	h := &harness{client: client, store: store, det: det, m: NewMetrics(nil), done: make(chan struct{})}
	o := Options{Client: kubefake.New(client), NodeName: node, Role: report.RoleWorker, Store: store, Details: h.det,
		Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: h.m,
		HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute}
	if opts != nil {
		opts(&o)
	}
	h.r = New(o)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.r.Run(ctx); close(h.done) }()
	return h
}

func (h *harness) stop() { h.cancel(); <-h.done }

func (h *harness) node(t *testing.T) *corev1.Node {
	t.Helper()
	n, err := h.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", node)
	if err != nil {
		t.Fatal(err)
	}
	return n.(*corev1.Node)
}

func findCond(n *corev1.Node, ty string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == ty {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// countActions counts API calls by verb and subresource.
func countActions(c *fake.Clientset) map[string]int {
	out := map[string]int{}
	for _, a := range c.Actions() {
		k := a.GetVerb() + " " + a.GetResource().Resource
		if a.GetSubresource() != "" {
			k += "/" + a.GetSubresource()
		}
		out[k]++
	}
	return out
}

func TestConditionsMergeByTypeAndKeepOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
		store.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: "ClockSynchronized"}, time.Now())
		time.Sleep(time.Second) // within 1 s of the change
		synctest.Wait()
		n := h.node(t)
		if c := findCond(n, "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue || c.Message != "/var 95%" {
			t.Errorf("DiskUsageHigh = %+v", c)
		}
		if c := findCond(n, string(corev1.NodeReady)); c == nil || c.Status != corev1.ConditionTrue || c.Reason != "KubeletReady" {
			t.Errorf("kubelet's Ready was touched: %+v", c)
		}
		if findCond(n, "SomeoneElses") == nil || len(n.Status.Conditions) != 4 {
			t.Errorf("conditions: %+v", n.Status.Conditions)
		}
		for _, a := range client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && p.GetPatchType() != "application/strategic-merge-patch+json" {
				t.Errorf("status written with %s", p.GetPatchType())
			}
			if a.GetVerb() == "list" || a.GetVerb() == "watch" {
				t.Errorf("the reporter lists or watches: %v", a)
			}
		}
		h.stop()
	})
}

func TestAdoptsNodeConditionsAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		onNode := corev1.NodeCondition{Type: "DiskUsageHigh", Status: corev1.ConditionTrue, Reason: "FilesystemSpaceHigh",
			Message: "/var 95%", LastTransitionTime: metav1.NewTime(t0)}
		client := fake.NewClientset(kubeletNode(onNode))
		store := report.NewStore("b")
		h := start(t, client, store)
		<-h.r.Adopted()
		// The first run after the restart finds the same status.
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 96%"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		c := findCond(h.node(t), "DiskUsageHigh")
		if c == nil || !c.LastTransitionTime.Time.Equal(t0) {
			t.Errorf("after restart: %+v; want lastTransitionTime %v kept", c, t0)
		}
		// Its new message alone goes with the next heartbeat.
		time.Sleep(6 * time.Minute)
		synctest.Wait()
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || !c.LastTransitionTime.Time.Equal(t0) || c.Message != "/var 96%" {
			t.Errorf("after the next heartbeat: %+v; want the new message, lastTransitionTime %v kept", c, t0)
		}
		h.stop()
	})
}

// The API server fails for a while: nothing blocks, the latest state is
// written when it returns, each change once.
func TestOutageConvergesWithoutLosingTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down := false
		failed := 0
		client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				failed++
				return true, nil, apierrors.NewServiceUnavailable("etcd is down")
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		<-h.r.Adopted()
		mu.Lock()
		down = true
		mu.Unlock()
		start := time.Now()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"}, time.Now())
		time.Sleep(time.Minute)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "b"}, time.Now())
		time.Sleep(time.Minute)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemInodesHigh", Message: "c"}, time.Now())
		lastChange := time.Now()
		time.Sleep(3 * time.Minute)
		mu.Lock()
		down = false
		f := failed
		mu.Unlock()
		if f == 0 || f > 30 {
			t.Errorf("%d failed calls in 5 min of outage: want retries of the status and annotation writers with backoff (capped at 1 min)", f)
		}
		time.Sleep(2 * time.Minute) // at most one backoff (≤ 1 min) later
		synctest.Wait()
		c := findCond(h.node(t), "DiskUsageHigh")
		if c == nil || c.Status != corev1.ConditionTrue || c.Reason != "FilesystemInodesHigh" || !c.LastTransitionTime.Time.Equal(lastChange) {
			t.Errorf("after the outage: %+v, want True/FilesystemInodesHigh since %v", c, lastChange)
		}
		_ = start
		if v := testutil.ToFloat64(h.m.writes.WithLabelValues(KindStatus, "error")); v == 0 {
			t.Error("failed writes not counted")
		}
		h.stop()
	})
}

// A refused write (403) is counted, retried, and logged as an error that
// says the credentials do not allow it, once, not at every retry.
func TestForbiddenIsCountedAndKeepsRetrying(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, node, errors.New(`node "x" is not allowed to modify node "test-node"`))
		})
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		h := startLogged(t, client, store, report.NewDetails(), &logs)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if v := testutil.ToFloat64(h.m.writes.WithLabelValues(KindStatus, "forbidden")); v < 2 {
			t.Errorf("forbidden status writes counted: %v", v)
		}
		h.stop()
		var refused int
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "level=ERROR") && strings.Contains(l, "refused by the API server: the credentials do not allow it") && strings.Contains(l, "conditions") {
				refused++
			}
		}
		if refused != 1 {
			t.Errorf("%d error lines saying the status write was refused, want 1:\n%s", refused, logs.String())
		}
	})
}

func TestEventFloodBecomesOneEventWithACount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		// The first line is created at once; the 999 after it, within the
		// next seconds, are one patch of its count.
		store.Emit(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sda1, logical block 0", Time: time.Now()})
		time.Sleep(time.Second)
		synctest.Wait()
		for range 999 {
			store.Emit(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sda1, logical block 0", Time: time.Now()})
			time.Sleep(5 * time.Millisecond)
		}
		store.Emit(report.Event{Reason: "TaskHung", Message: "task kubelet:123 blocked for more than 120 seconds", Time: time.Now()})
		time.Sleep(30 * time.Second)
		synctest.Wait()
		evs, err := client.CoreV1().Events(EventNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var total, hung int32
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != node || e.Type != corev1.EventTypeWarning || e.Source.Component != Component {
				t.Errorf("event %+v", e)
			}
			switch e.Reason {
			case "IOError":
				total += e.Count
			case "TaskHung":
				hung += e.Count
			}
		}
		// Every occurrence counted, none dropped: the queue holds 1,024
		// (eventQueue) and the table 512 aggregates, the flood is 1,001
		// events of 2 kinds, and the fake API server refuses none, so no
		// drop may stand in for a counted occurrence.
		if dropped := h.m.droppedTotal(); len(evs.Items) != 2 || total != 1000 || hung != 1 || dropped != 0 {
			t.Errorf("%d events, IOError count %d, TaskHung count %d, dropped %v; want 2 events, counts 1000 and 1, none dropped", len(evs.Items), total, hung, dropped)
		}
		acts := countActions(client)
		if acts["create events"] != 2 || acts["patch events"] != 1 { // README: 1 create and 1 patch for the flood (and 1 create for the other)
			t.Errorf("API calls for 1001 events: %v", acts)
		}
		h.stop()
	})
}

func TestAnnotationsCarryFiveDocuments(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		// The detail is there before the reporter starts: set after, it
		// raced with the first annotation write (an empty store is written
		// at once).
		det := report.NewDetails()
		det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/var", "usedPercent": 42}}})
		h := startWith(t, client, store, det)
		<-h.r.Adopted()
		synctest.Wait()
		check := func() time.Time {
			n := h.node(t)
			if n.Annotations["other/annotation"] != "keep" {
				t.Error("another writer's annotation was lost")
			}
			var updated time.Time
			for _, d := range report.Domains {
				v, ok := n.Annotations[report.AnnotationPrefix+d.Name]
				if !ok {
					t.Fatalf("annotation %s missing", d.Name)
				}
				var doc map[string]any
				if err := json.Unmarshal([]byte(v), &doc); err != nil {
					t.Fatalf("%s: %v", d.Name, err)
				}
				if doc["role"] != "worker" || doc["schemaVersion"] != float64(1) {
					t.Errorf("%s: %s", d.Name, v)
				}
				updated, _ = time.Parse(time.RFC3339, doc["updatedAt"].(string))
				if d.Name == "storage" && !strings.Contains(v, `"filesystems":[{"mountPoint":"/var","usedPercent":42}]`) {
					t.Errorf("storage: %s", v)
				}
			}
			return updated
		}
		first := check()
		time.Sleep(2*time.Minute + time.Second)
		synctest.Wait()
		if second := check(); !second.After(first) {
			t.Errorf("annotations not refreshed: %v then %v", first, second)
		}
		h.stop()
	})
}

// Steady state (nothing changes): API writes per node per hour. Run with
// -v to see the figure; README quotes it.
func TestSteadyStateWritesPerHour(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		hb := watchHeartbeats(client)
		store := report.NewStore("b")
		for _, c := range []report.Condition{
			{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"},
			{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: "ClockSynchronized"},
		} {
			store.Set(c, time.Now())
		}
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(10 * time.Minute) // settle
		synctest.Wait()
		client.ClearActions()
		hb.reset()
		time.Sleep(time.Hour)
		synctest.Wait()
		acts := countActions(client)
		status, ann := acts["patch nodes/status"], acts["patch nodes"]
		folded := statusWritesWithReport(client)
		worst := hb.oldest()
		t.Logf("steady state: %d API writes per node per hour (%d condition writes, %d of them a report refresh too; %d report refreshes in all), %d other calls; the oldest heartbeat on the Node %s",
			status+ann, status, folded, ann+folded, len(client.Actions())-status-ann, worst)
		// The heartbeat rides on the report refresh before it falls due:
		// the 30 report refreshes are all the writes, and no condition's
		// heartbeat on the Node is ever older than the period and its
		// jitter (a second more: lastHeartbeatTime is to the second). A
		// refresh carries it only when it would fall due before the next
		// one: every other refresh (at 4 min, the next 5 to 5.5 after).
		if status+ann != 30 || ann+folded != 30 || folded != status || folded != 15 || len(client.Actions()) != status+ann {
			t.Errorf("writes per hour: %v, %d status writes carrying the report; want 30 writes, all report refreshes, 15 of them with the heartbeat", acts, folded)
		}
		if limit := 5*time.Minute + 30*time.Second + time.Second; worst > limit || worst == 0 {
			t.Errorf("the oldest heartbeat on the Node: %s; want within %s", worst, limit)
		}
		h.stop()
	})
}

// heartbeatAges follows how old the daemon's conditions' lastHeartbeatTime
// on the Node get: it looks just before each write to the Node (a
// heartbeat's age only grows until a write) and when asked.
type heartbeatAges struct {
	client *fake.Clientset
	mu     sync.Mutex
	worst  time.Duration
}

func watchHeartbeats(client *fake.Clientset) *heartbeatAges {
	w := &heartbeatAges{client: client}
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		w.look()
		return false, nil, nil
	})
	return w
}

func (w *heartbeatAges) look() {
	o, err := w.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", node)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range o.(*corev1.Node).Status.Conditions {
		if _, ours := report.Lookup(string(c.Type)); ours && !c.LastHeartbeatTime.IsZero() {
			w.worst = max(w.worst, time.Since(c.LastHeartbeatTime.Time))
		}
	}
}

// reset forgets what was seen so far.
func (w *heartbeatAges) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.worst = 0
}

// oldest is the oldest heartbeat seen, now included.
func (w *heartbeatAges) oldest() time.Duration {
	w.look()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.worst
}

// statusWritesWithReport counts the status writes that carry the report
// annotations.
func statusWritesWithReport(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && strings.Contains(string(p.GetPatch()), `"annotations"`) {
			n++
		}
	}
	return n
}

// A report interval longer than the heartbeat period: the heartbeats are
// written on their own, each within its period, as the report refresh
// after it would come too late.
func TestHeartbeatsAloneWhenTheReportIntervalIsLonger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		hb := watchHeartbeats(client)
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) { o.ReportInterval = 10 * time.Minute })
		<-h.r.Adopted()
		time.Sleep(30 * time.Minute)
		synctest.Wait()
		client.ClearActions()
		hb.reset()
		time.Sleep(time.Hour)
		synctest.Wait()
		acts := countActions(client)
		if folded := statusWritesWithReport(client); folded != 0 || acts["patch nodes"] != 6 || acts["patch nodes/status"] < 10 || acts["patch nodes/status"] > 12 {
			t.Errorf("writes in an hour: %v, %d status writes carrying the report; want 6 report refreshes alone and 10 to 12 heartbeats", acts, folded)
		}
		if limit := 5*time.Minute + 30*time.Second + time.Second; hb.oldest() > limit {
			t.Errorf("the oldest heartbeat on the Node: %s; want within %s", hb.oldest(), limit)
		}
		h.stop()
	})
}

// A report refresh that cannot carry the heartbeat (not even the report's
// stubs fit beside the Node's other annotations: every write with it is
// refused) does not hold the heartbeat back: it is written on its own, on
// time, and the conditions' writes are not refused for the report.
func TestHeartbeatOnTimeWhenTheReportRefreshFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		annotationLimit(client)
		hb := watchHeartbeats(client)
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if statusWritesWithReport(client) == 0 {
			h.stop()
			t.Fatalf("no report refresh carried the heartbeat before another tool filled the annotations: %v", countActions(client))
		}
		// Another tool's annotations leave no room for the report, nor
		// for its stubs: every write with it is refused, even one that
		// takes the documents off (fitReport).
		n := h.node(t)
		n.Annotations["tool.example.com/state"] = strings.Repeat("x", 256*1024+100)
		if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
			t.Fatal(err)
		}
		client.ClearActions()
		hb.reset()
		time.Sleep(time.Hour)
		synctest.Wait()
		conds := 0
		for _, a := range client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && !strings.Contains(string(p.GetPatch()), `"annotations"`) {
				conds++
			}
		}
		if conds < 10 || conds > 12 {
			t.Errorf("%d heartbeats alone in the hour the report was refused; want 10 to 12 (%v)", conds, countActions(client))
		}
		if limit := 5*time.Minute + 30*time.Second + time.Second; hb.oldest() > limit {
			t.Errorf("the oldest heartbeat on the Node: %s; want within %s", hb.oldest(), limit)
		}
		h.stop()
	})
}

// A condition whose message alone changes (a check's run finds another
// estimated clock error, another count) is written with the next heartbeat,
// not at each change: the Node is not rewritten at every run of such a
// check. A change of status is written at once, with the messages waiting;
// a stop writes what waits.
func TestMessageOnlyChangesWaitForTheHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		clock := func(st report.Status, reason, msg string) {
			store.Set(report.Condition{Type: "ClockNotSynchronized", Status: st, Reason: report.Reason(reason), Message: msg}, time.Now())
		}
		disk := func(reason string) {
			store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.Reason(reason), Message: "/var 95%"}, time.Now())
		}
		clock(report.StatusFalse, "ClockSynchronized", "clock synchronized, estimated error 1ms")
		disk("FilesystemSpaceHigh")
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(time.Second)
		synctest.Wait()
		client.ClearActions()
		for i := range 3 { // a run a minute, each finding another error
			time.Sleep(time.Minute)
			clock(report.StatusFalse, "ClockSynchronized", fmt.Sprintf("clock synchronized, estimated error %dms", i+2))
			synctest.Wait()
		}
		if n := countActions(client)["patch nodes/status"]; n != 0 {
			t.Errorf("%d status writes for 3 changes of a message alone in 3 minutes, want 0 before the heartbeat", n)
		}
		if !h.m.Reporting().StatusPending {
			t.Error("status says nothing is pending while a new message waits for the heartbeat")
		}
		// Past the heartbeat: it rides on the report refresh at 4 min, the
		// last before it falls due (5 to 5.5 min).
		time.Sleep(90 * time.Second)
		synctest.Wait()
		if h.m.Reporting().StatusPending {
			t.Error("status says a change is pending after the heartbeat wrote it")
		}
		if c := findCond(h.node(t), "ClockNotSynchronized"); countActions(client)["patch nodes/status"] != 1 || c == nil || c.Message != "clock synchronized, estimated error 4ms" {
			t.Errorf("after the heartbeat: %d writes, %+v; want 1 with the last message", countActions(client)["patch nodes/status"], c)
		}
		// A reason that flapped back within the coalescing: nothing
		// differs from the Node, nothing waits.
		client.ClearActions()
		disk("FilesystemInodesHigh")
		disk("FilesystemSpaceHigh")
		time.Sleep(time.Second)
		synctest.Wait()
		if h.m.Reporting().StatusPending || countActions(client)["patch nodes/status"] != 0 {
			t.Errorf("nothing differs: pending %v, %d writes", h.m.Reporting().StatusPending, countActions(client)["patch nodes/status"])
		}
		clock(report.StatusTrue, "ClockUnsynchronized", "the kernel reports the clock as not synchronized")
		time.Sleep(time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "ClockNotSynchronized"); countActions(client)["patch nodes/status"] != 1 || c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("a change of status: %d writes within 1 s, %+v; want 1", countActions(client)["patch nodes/status"], c)
		}
		clock(report.StatusTrue, "ClockUnsynchronized", "the kernel reports the clock as not synchronized (again)")
		time.Sleep(time.Second) // past the coalescing: the message waits
		synctest.Wait()
		if c := findCond(h.node(t), "ClockNotSynchronized"); c == nil || c.Message == "the kernel reports the clock as not synchronized (again)" {
			t.Errorf("a message alone written at once: %+v", c)
		}
		h.stop()
		if c := findCond(h.node(t), "ClockNotSynchronized"); c == nil || c.Message != "the kernel reports the clock as not synchronized (again)" {
			t.Errorf("after a stop: %+v; want the waiting message written", c)
		}
	})
}

// A condition held forever (a tamper finding) is written at once when its
// message alone changes: a new finding's evidence is not held back until
// the heartbeat.
func TestHeldForeverMessageIsWrittenAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		tampered := func(msg string) {
			store.Set(report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged, Message: msg}, time.Now())
		}
		tampered("1 finding: /etc/cni/net.d/00-evil.conflist added")
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(time.Second)
		synctest.Wait()
		tampered("2 findings: /usr/bin/kubelet changed; /etc/cni/net.d/00-evil.conflist added")
		time.Sleep(time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "NodeTampered"); c == nil || !strings.HasPrefix(c.Message, "2 findings") {
			t.Errorf("a new finding's message 1 s later: %+v; want it written at once", c)
		}
		h.stop()
	})
}

// The report annotations carry the boot they were written in, and only
// after that boot's conditions were written; a restarted daemon adopts a
// True kernel condition by that boot ID, whatever its transition time says.
func TestReportBootIDDecidesKernelAdoption(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodeBoot string
		want     report.Status
	}{
		{"report of this boot", "boot-b", report.StatusTrue},
		{"report of the previous boot", "boot-a", report.StatusFalse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// A day before this boot's start by the wall clock (a clock
				// stepped since); the report says which boot it is.
				onNode := corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "FilesystemIsReadOnly",
					Message: "EXT4-fs (vda1): Remounting filesystem read-only", LastTransitionTime: metav1.NewTime(time.Now().Add(-25 * time.Hour))}
				n := kubeletNode(onNode)
				n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"` + tc.nodeBoot + `"}`
				client := fake.NewClientset(n)
				store := report.NewStore("boot-b")
				store.SetBootStart(time.Now().Add(-time.Hour))
				store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusFalse, Reason: report.ReasonFilesystemIsNotReadOnly}, time.Now())
				// The boot ID set before the reporter starts, as the
				// daemon's assembly does: set after, a report written
				// before it carried none (a CI run on 2026-12-07).
				det := report.NewDetails()
				det.SetBootID("boot-b")
				h := startWith(t, client, store, det)
				<-h.r.Adopted()
				time.Sleep(time.Second)
				synctest.Wait()
				if c := findCond(h.node(t), "ReadonlyFilesystem"); c == nil || string(c.Status) != string(tc.want) {
					t.Errorf("ReadonlyFilesystem on the Node: %+v; want %s", c, tc.want)
				}
				if got := report.ReportBootID(h.node(t).Annotations); got != "boot-b" {
					t.Errorf("report boot ID after the first write: %q", got)
				}
				h.stop()
			})
		})
	}
}

// A condition of the daemon's on the Node that it does not evaluate here
// (the kernel monitor turned off, a GPU condition without a GPU) is not
// carried over, and the first write removes it: a True left by an earlier
// boot must not stand under this boot's report. A tamper finding removed
// so (its check disabled), which otherwise only an operator's clear
// lowers, is logged as a warning with its message.
func TestConditionsNotEvaluatedAreRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stale := corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Reason: "FilesystemIsReadOnly",
			LastTransitionTime: metav1.NewTime(t0)}
		finding := corev1.NodeCondition{Type: "NodeTampered", Status: corev1.ConditionTrue, Reason: "ProtectedFileChanged",
			Message: "/etc/kubernetes/manifests/evil.yaml added", LastTransitionTime: metav1.NewTime(t0)}
		n := kubeletNode(stale, finding)
		n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"b"}` // as if of this boot
		client := fake.NewClientset(n)
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		h := &harness{client: client, store: store, det: report.NewDetails(), m: NewMetrics(nil), done: make(chan struct{})}
		logs := &testenv.SyncBuffer{}
		h.r = New(Options{Client: kubefake.New(client), NodeName: node, Role: report.RoleWorker, Store: store, Details: h.det,
			Log: slog.New(slog.NewTextHandler(logs, nil)), Metrics: h.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute,
			Evaluated: func(ty string) bool { return ty != "ReadonlyFilesystem" && ty != "NodeTampered" }})
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		go func() { h.r.Run(ctx); close(h.done) }()
		<-h.r.Adopted()
		time.Sleep(time.Second)
		synctest.Wait()
		if _, ok := store.Get("ReadonlyFilesystem"); ok {
			t.Error("a condition not evaluated here was carried into the store")
		}
		got := h.node(t)
		for _, ty := range []string{"ReadonlyFilesystem", "NodeTampered"} {
			if c := findCond(got, ty); c != nil {
				t.Errorf("still on the Node: %+v", c)
			}
		}
		if l := logs.String(); strings.Count(l, report.TamperFindingRemovedLog) != 1 || !strings.Contains(l, "level=WARN") || !strings.Contains(l, "evil.yaml added") {
			t.Errorf("the removed tamper finding is not logged once as a warning with its message:\n%s", l)
		}
		if findCond(got, "DiskUsageHigh") == nil || findCond(got, "Ready") == nil {
			t.Errorf("conditions lost: %+v", got.Status.Conditions)
		}
		h.stop()
	})
}

// The first annotations wait for the checks' first pass (Options.FirstPass)
// after the conditions are written, so they carry what the checks collect:
// a check slower than the first status write (an LVM report) no longer
// leaves its domain empty until the next refresh.
func TestAnnotationsWaitForTheFirstPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		det := report.NewDetails()
		firstPass := make(chan struct{})
		r := New(Options{Client: kubefake.New(client), NodeName: node, Role: report.RoleWorker, Store: store, Details: det,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil),
			HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute, FirstPass: firstPass})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusUnknown, Reason: report.ReasonNoData, Message: "not yet"}, time.Now())
		time.Sleep(10 * time.Second)
		synctest.Wait()
		h := &harness{client: client}
		if n := h.node(t); findCond(n, "DiskUsageHigh") == nil {
			t.Fatal("the conditions were not written")
		} else if _, ok := n.Annotations[report.AnnotationPrefix+"storage"]; ok {
			t.Fatalf("annotations written before the first pass: %s", n.Annotations[report.AnnotationPrefix+"storage"])
		}
		det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]any{{"mountPoint": "/var"}}})
		close(firstPass)
		synctest.Wait()
		if v := h.node(t).Annotations[report.AnnotationPrefix+"storage"]; !strings.Contains(v, `"filesystems":[{"mountPoint":"/var"}]`) {
			t.Errorf("storage after the first pass: %q", v)
		}
		cancel()
		<-done
	})
}

// A condition the store no longer holds (a reload disabled its check) is
// removed from the Node by the next write; the others stay.
func TestConditionRemovedFromTheStoreLeavesTheNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		store.Set(report.Condition{Type: "NodeInfoStale", Status: report.StatusTrue, Reason: report.ReasonNodeInfoOutdated}, time.Now())
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(time.Second)
		synctest.Wait()
		if findCond(h.node(t), "NodeInfoStale") == nil {
			t.Fatal("NodeInfoStale never written")
		}
		if !store.Remove("NodeInfoStale") {
			t.Fatal("Remove: the store did not hold it")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got := h.node(t)
		if c := findCond(got, "NodeInfoStale"); c != nil {
			t.Errorf("still on the Node: %+v", c)
		}
		if findCond(got, "DiskUsageHigh") == nil || findCond(got, "Ready") == nil || findCond(got, "SomeoneElses") == nil {
			t.Errorf("conditions lost: %+v", got.Status.Conditions)
		}
		h.stop()
	})
}

// The same event every 10 s through a 25-minute outage, longer than the
// dedupe window: when the API server returns, every occurrence is counted
// on an Event, in one Event per window, not one per occurrence. Before,
// the aggregate of a window that ended before it could be written was
// replaced by the next one and its count lost (found writing the soak,
// tests/soak_test.go).
func TestEventCountsSurviveAnOutageLongerThanTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down := true
		client.PrependReactor("*", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return true, nil, apierrors.NewServiceUnavailable("kube-apiserver is down")
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		const fired = 150 // 25 minutes
		for range fired {
			store.Emit(report.Event{Reason: "Ext4Warning", Message: "EXT4-fs warning (device sdz1): same text", Time: time.Now()})
			time.Sleep(10 * time.Second)
		}
		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(2 * time.Minute) // at most one backoff (≤ 1 min) later
		synctest.Wait()
		evs, err := client.CoreV1().Events(EventNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var total int32
		for _, e := range evs.Items {
			total += e.Count
		}
		if total != fired || len(evs.Items) != 3 {
			t.Errorf("%d Events with a total count of %d; want %d occurrences on 3 Events (one per 10-minute window)", len(evs.Items), total, fired)
		}
		h.stop()
	})
}

// After a 10-minute outage the writers are in their longest backoff (up to
// a minute): the probe notices the API server's port accepting connections
// again, and the Node has the final state within 2 s of its return, with
// the transition time of the last change. Where the dial always succeeds (a
// load balancer in front), the probe changes nothing: the retries stay
// paced by the backoff. Before, the return was noticed up to a minute late
// (found by the soak, tests/soak_test.go: TestSoakAPIServerDown). A call
// the API server answers, if with a refusal (429 Too Many Requests from
// its priority and fairness, all outage long), has no dial at all: the
// server is reachable, and a dial a second from every node would only add
// to its load.
func TestProbeNoticesTheAPIServersReturn(t *testing.T) {
	for _, mode := range []struct {
		name       string
		lb, answer bool
		// thenRefused: behind the load balancer, the address refuses
		// connections for the outage's last minute.
		thenRefused bool
	}{{"refused", false, false, false}, {"load balancer", true, false, false}, {"answered 429", false, true, false},
		{"load balancer, then refused", true, false, true}} {
		lb := mode.lb || mode.answer
		t.Run(mode.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(kubeletNode())
				var mu sync.Mutex
				down, refused, failed, dials := false, false, 0, 0
				client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
					mu.Lock()
					defer mu.Unlock()
					if down {
						failed++
						if mode.answer {
							return true, nil, apierrors.NewTooManyRequests("the server has received too many requests", 1)
						}
						// What client-go returns when the port refuses.
						return true, nil, &url.Error{Op: "Patch", URL: "https://10.0.0.1:6443/api/v1/nodes/" + node + "/status",
							Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
					}
					return false, nil, nil
				})
				store := report.NewStore("b")
				h := &harness{client: client, store: store, det: report.NewDetails(), m: NewMetrics(nil), done: make(chan struct{})}
				h.r = New(Options{Client: kubefake.New(client), NodeName: node, Role: report.RoleWorker, Store: store, Details: h.det,
					Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: h.m,
					HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute,
					Dial: func(context.Context) error {
						mu.Lock()
						defer mu.Unlock()
						dials++
						if down && (!lb || refused) {
							return errors.New("connection refused")
						}
						return nil
					}})
				ctx, cancel := context.WithCancel(context.Background())
				h.cancel = cancel
				go func() { h.r.Run(ctx); close(h.done) }()
				<-h.r.Adopted()
				time.Sleep(time.Minute)
				mu.Lock()
				if dials != 0 {
					t.Errorf("%d dials in a minute with nothing failing: want the probe asleep", dials)
				}
				down = true
				mu.Unlock()
				var last time.Time
				for i := range 10 {
					last = time.Now()
					c := report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: fmt.Sprint(i)}
					if i%2 == 1 {
						c.Status, c.Reason = report.StatusFalse, "DiskUsageOK"
					}
					store.Set(c, last)
					time.Sleep(time.Minute)
				}
				if mode.thenRefused {
					// The dials had waited 30 s each: the first refused
					// one sets them back to one a second.
					mu.Lock()
					refused = true
					d0 := dials
					mu.Unlock()
					time.Sleep(time.Minute)
					mu.Lock()
					if n := dials - d0; n < 25 {
						t.Errorf("%d dials in the minute the address refused connections: want one a second from the first refused one (within 30 s)", n)
					}
					mu.Unlock()
				}
				mu.Lock()
				down = false
				f := failed
				mu.Unlock()
				// At most 4 a minute of outage, the writers' backoff (30
				// runs of each mode: 34-38 in the 10-minute outages, 37-40
				// where the address then refused for an 11th minute, 41 in
				// 2 of 30 runs under a bound of 40 before it counted that
				// minute).
				outage := 10
				if mode.thenRefused {
					outage = 11
				}
				if f > 4*outage {
					t.Errorf("%d failed calls in a %d-minute outage: want them paced by the backoff (at most %d)", f, outage, 4*outage)
				}
				time.Sleep(2 * time.Second)
				synctest.Wait()
				c := findCond(h.node(t), "DiskUsageHigh")
				if lb && !mode.thenRefused {
					// Only the backoff: within a minute.
					time.Sleep(time.Minute)
					synctest.Wait()
					c = findCond(h.node(t), "DiskUsageHigh")
				}
				if c == nil || c.Message != "9" || c.Status != corev1.ConditionFalse || !c.LastTransitionTime.Time.Equal(last) {
					t.Errorf("2 s after the API server's return: %+v; want False, message 9, since %v", c, last)
				}
				mu.Lock()
				d := dials
				mu.Unlock()
				switch {
				case mode.answer && d != 0:
					t.Errorf("%d dials while the API server answered every call with 429: want none", d)
				case mode.lb && !mode.thenRefused && (d < 20 || d > 30):
					// 1, 2, 4, 8, 16 s, then every 30 s: a dial that
					// succeeds tells nothing until one is refused.
					t.Errorf("%d dials during a 10-minute outage behind a load balancer that accepts: want the waits doubling to 30 s (about 24)", d)
				case !lb && (d < 500 || d > 700):
					t.Errorf("%d dials during a 10-minute outage: want one a second while the writes fail", d)
				}
				// Back: once the writes succeed, the probe sleeps again.
				time.Sleep(10 * time.Minute)
				synctest.Wait()
				mu.Lock()
				if more := dials - d; more != 0 {
					t.Errorf("%d more dials in the 10 minutes after the return: want the probe asleep", more)
				}
				mu.Unlock()
				h.stop()
			})
		})
	}
}

// Dialer connects to the server's host and port (443 when none is named)
// and fails when nothing listens there.
func TestDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dial, err := Dialer("https://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(context.Background()); err != nil {
		t.Errorf("listening: %v", err)
	}
	ln.Close()
	if err := dial(context.Background()); err == nil {
		t.Error("nothing listens, and the dial succeeded")
	}
	if _, err := Dialer("https:///no-host"); err == nil {
		t.Error("a server without a host was accepted")
	}
}

// The same kernel warning once a second through a 10-minute outage of the
// events API: the event writer backs off (failed calls paced by the
// backoff, not one a second), the failure is logged once and the recovery
// once. Before, a flush that found everything waiting for its retry made no
// call and counted as a recovery: the backoff never grew, and every second
// logged "failed; will retry" and "recovered" (found by the soak,
// tests/soak_test.go: TestSoakAPIServerDown with SOAK_APIDOWN=10m).
func TestEventWriterBacksOffThroughAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down, failed := true, 0
		client.PrependReactor("*", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				failed++
				return true, nil, apierrors.NewServiceUnavailable("kube-apiserver is down")
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		m := NewMetrics(nil)
		r := New(Options{Client: kubefake.New(client), NodeName: node, Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
			Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		for range 600 {
			store.Emit(report.Event{Reason: "Ext4Warning", Message: "EXT4-fs warning (device sdz1): same text", Time: time.Now()})
			time.Sleep(time.Second)
		}
		mu.Lock()
		f := failed
		down = false
		mu.Unlock()
		if f > 25 {
			t.Errorf("%d failed event writes in a 10-minute outage; want them paced by the backoff (1 s doubling to 1 min)", f)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		out := logs.String()
		if a, b := strings.Count(out, "writing events of node "+node+" failed"), strings.Count(out, "writing events of node "+node+" recovered"); a != 1 || b != 1 {
			t.Errorf("the outage logged %d failures and %d recoveries of the event writer; want one of each:\n%s", a, b, out)
		}
		evs, _ := client.CoreV1().Events(EventNamespace).List(context.Background(), metav1.ListOptions{})
		if len(evs.Items) != 1 || evs.Items[0].Count != 600 {
			t.Errorf("events after the outage: %+v", evs.Items)
		}
		cancel()
		<-done
	})
}

// The event writer sleeps until a write is due, a minute when none is: an
// idle daemon does not wake it every second.
func TestEventWriterWakesOnlyWhenAWriteIsDue(t *testing.T) {
	now := time.Now()
	const flush = 10 * time.Second
	for _, tc := range []struct {
		name string
		aggs []*aggregate
		want time.Duration
	}{
		{"nothing", nil, time.Minute},
		{"all sent", []*aggregate{{name: "e1", count: 3, sentCount: 3, lastPatch: now.Add(-time.Hour)}}, time.Minute},
		{"new, first try", []*aggregate{{count: 1}}, 0},
		{"new, retry in 4 s", []*aggregate{{count: 1, nextTry: now.Add(4 * time.Second)}}, 4 * time.Second},
		{"count patched 3 s ago", []*aggregate{{name: "e1", count: 5, sentCount: 2, lastPatch: now.Add(-3 * time.Second)}}, 7 * time.Second},
		{"count due, retry later", []*aggregate{{name: "e1", count: 5, sentCount: 2, lastPatch: now.Add(-time.Hour), nextTry: now.Add(20 * time.Second)}}, 20 * time.Second},
		{"the soonest of two", []*aggregate{
			{name: "e1", count: 5, sentCount: 2, lastPatch: now.Add(-3 * time.Second)},
			{count: 1, nextTry: now.Add(2 * time.Second)},
		}, 2 * time.Second},
	} {
		aggs := map[aggKey]*aggregate{}
		for i, a := range tc.aggs {
			aggs[aggKey{reason: strconv.Itoa(i)}] = a
		}
		if got := nextFlush(aggs, now, flush); got != tc.want {
			t.Errorf("%s: next write in %s, want %s", tc.name, got, tc.want)
		}
	}
}

// The report annotations are refreshed, and the idle event writer beats, on
// the daemon's grid (tick.Grid): at multiples of their periods from the
// daemon's start, though the reporter started off it.
func TestPeriodicWritesOnTheGrid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		grid := tick.New(time.Now())
		time.Sleep(7 * time.Second)
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		var patches []time.Duration
		beats := map[string][]time.Duration{}
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			// A report refresh alone, or with the heartbeat (status).
			if a.GetSubresource() == "" || strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"annotations"`) {
				mu.Lock()
				patches = append(patches, time.Since(grid.Anchor()))
				mu.Unlock()
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		// A condition to write: every other refresh carries its heartbeat.
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		r := New(Options{Client: kubefake.New(client), NodeName: node, Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil), Grid: grid,
			HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute,
			Progress: func(loop string, _ time.Duration) {
				mu.Lock()
				beats[loop] = append(beats[loop], time.Since(grid.Anchor()))
				mu.Unlock()
			}})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		time.Sleep(10 * time.Minute)
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		// The first write at the start, then every 2 minutes on the grid.
		if len(patches) != 6 || patches[0] != 7*time.Second {
			t.Fatalf("annotation writes at %v: want the first at 7s, then five on the 2m grid", patches)
		}
		for _, p := range patches[1:] {
			if p%(2*time.Minute) != 0 {
				t.Errorf("annotation writes at %v: off the 2m grid", patches)
				break
			}
		}
		ev := beats[eventsLoop]
		if len(ev) < 10 {
			t.Fatalf("the event writer beat at %v: want once a minute", ev)
		}
		for _, b := range ev[1:] {
			if b%time.Minute != 0 {
				t.Errorf("the event writer beat at %v: off the 1m grid", ev)
				break
			}
		}
	})
}

// A restart that lost the state file: the kernel log monitor holds its
// conditions Unknown (NoData) until it has read the log, and the Node's
// False must win over that placeholder, so that no write flaps the
// condition to Unknown and back or resets its lastTransitionTime.
func TestRestartWithoutStateKeepsKernelConditions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		onNode := corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionFalse, Reason: "KernelHasNoDeadlock",
			Message: "no matching kernel message", LastTransitionTime: metav1.NewTime(t0)}
		client := fake.NewClientset(kubeletNode(onNode))
		store := report.NewStore("b")
		// What kmsg.Monitor.Start sets before the reader opens the log.
		store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusUnknown, Reason: report.ReasonNoData,
			Message: "the kernel log has not been read yet"}, time.Now())
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(100 * time.Millisecond) // a write may go out before the reader catches up
		synctest.Wait()
		// The reader has read the log: nothing matched.
		store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusFalse, Reason: "KernelHasNoDeadlock",
			Message: "no matching kernel message"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		c := findCond(h.node(t), "KernelDeadlock")
		if c == nil || c.Status != corev1.ConditionFalse || !c.LastTransitionTime.Time.Equal(t0) {
			t.Errorf("after the restart: %+v; want False since %v", c, t0)
		}
		for _, a := range client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && strings.Contains(string(p.GetPatch()), `"status":"Unknown"`) {
				t.Errorf("a write flapped a condition to Unknown: %s", p.GetPatch())
			}
		}
		h.stop()
	})
}

// node_name set to another node's name: nodes may read other nodes, but
// that Node's conditions (a tamper finding held forever among them) are not
// taken over; the error names both.
func TestAnotherNodesConditionsAreNotTakenOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		onNode := corev1.NodeCondition{Type: "NodeTampered", Status: corev1.ConditionTrue, Reason: "ProtectedFileChanged",
			Message: "another node's finding", LastTransitionTime: metav1.NewTime(t0)}
		client := fake.NewClientset(kubeletNode(onNode))
		var logs testenv.SyncBuffer
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), &logs, func(o *Options) { o.Identity = "system:node:the-real-one" })
		<-h.r.Adopted()
		if c, ok := store.Get("NodeTampered"); ok {
			t.Errorf("another node's condition was taken over: %+v", c)
		}
		if l := logs.String(); !strings.Contains(l, "node_name names another node than the credentials do") || !strings.Contains(l, "system:node:the-real-one") {
			t.Errorf("log:\n%s", l)
		}
		h.stop()
		// Its own credentials: taken over.
		store2 := report.NewStore("b")
		h2 := startOpts(t, client, store2, report.NewDetails(), io.Discard, func(o *Options) { o.Identity = "system:node:" + node })
		<-h2.r.Adopted()
		if c, ok := store2.Get("NodeTampered"); !ok || c.Status != report.StatusTrue {
			t.Errorf("this node's own condition: %+v %v", c, ok)
		}
		h2.stop()
	})
}

// slowStatus is a client that records the status writes and whose first
// status write that when accepts (when nil: the first of all) hangs until
// its context ends (a slow API server). when is called with mu held.
type slowStatus struct {
	Client
	mu     sync.Mutex
	writes []string
	hung   chan struct{}
	when   func(patch string) bool
	done   bool
}

func (c *slowStatus) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c.mu.Lock()
	c.writes = append(c.writes, string(patch))
	hang := !c.done && (c.when == nil || c.when(string(patch)))
	if hang {
		c.done = true
	}
	c.mu.Unlock()
	if hang {
		close(c.hung)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return c.Client.PatchNodeStatus(ctx, name, patch)
}

// SIGTERM while a status write hangs: the write is cut short, and the last
// change still gets its one short attempt before the reporter returns.
func TestShutdownDuringAWriteStillWritesTheLastChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		slow := &slowStatus{Client: kubefake.New(client), hung: make(chan struct{})}
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = slow })
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
		<-slow.hung
		h.stop() // SIGTERM
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			slow.mu.Lock()
			t.Errorf("after a shutdown during the write: DiskUsageHigh %+v; status writes %d", c, len(slow.writes))
			slow.mu.Unlock()
		}
	})
}

// closingClient records the writes it makes and its CloseIdle calls, with
// their time since the grid's anchor.
type closingClient struct {
	kubefake.Client
	anchor time.Time
	mu     sync.Mutex
	calls  []string
	// failStatus: the first status write after this time (since the
	// anchor) fails, once.
	failStatus time.Duration
}

func (c *closingClient) note(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, fmt.Sprintf("%s@%s", what, time.Since(c.anchor)))
}

func (c *closingClient) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c.mu.Lock()
	fail := c.failStatus > 0 && time.Since(c.anchor) >= c.failStatus
	if fail {
		c.failStatus = 0
	}
	c.mu.Unlock()
	if fail {
		c.note("failed")
		return nil, errors.New("the API server is away")
	}
	if strings.Contains(string(patch), `"annotations"`) {
		c.note("folded") // a heartbeat and a report refresh in one write
	} else {
		c.note("status")
	}
	return c.Client.PatchNodeStatus(ctx, name, patch)
}

func (c *closingClient) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	c.note("event")
	return c.Client.CreateEvent(ctx, ev)
}

func (c *closingClient) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c.note("annotations")
	return c.Client.PatchNode(ctx, name, patch)
}

func (c *closingClient) CloseIdle() { c.note("close") }

// After a periodic write (the report annotations, a heartbeat) the client's
// idle connection is closed, within the same wake-up: the next such write is
// minutes away, and a connection kept would be pinged and closed later,
// off the grid. A write of a change or an event keeps it, and so does a
// periodic write within 90 s of one (the API server keeps such a connection
// open; closing it would make the next change dial anew). A heartbeat whose
// first write failed closes after its retry. The heartbeat falls on the
// daemon's 10 s grid, 5 to 5.5 minutes (and up to 10 s) after the last
// write.
func TestPeriodicWritesCloseTheIdleConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		grid := tick.New(time.Now())
		time.Sleep(3 * time.Second)
		cs := fake.NewClientset(kubeletNode())
		// The first heartbeat after 17 minutes fails once (the one due
		// about 5 minutes after the change at 16m40s).
		client := &closingClient{Client: kubefake.New(cs), anchor: grid.Anchor(), failStatus: 17 * time.Minute}
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		r := New(Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: NewMetrics(nil), Grid: grid,
			HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		time.Sleep(7*time.Minute + 500*time.Millisecond)
		// A change: written, the connection kept (and by the annotation
		// write at 8m, 56 s later).
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
		time.Sleep(6*time.Minute + 6500*time.Millisecond) // 13m10s
		// An event: kept by the annotation write at 14m, 50 s later.
		store.Emit(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sda1, logical block 0", Time: time.Now()})
		time.Sleep(3*time.Minute + 30*time.Second) // 16m40s
		// Another change: kept by the annotation write at 18m, 80 s later.
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		time.Sleep(8*time.Minute + 20*time.Second) // 25m
		cancel()
		<-done
		client.mu.Lock()
		calls := client.calls
		client.mu.Unlock()
		// The two loops may write at the same instant (a heartbeat on a
		// 2-minute point of the grid): at each instant, as many closes as
		// periodic writes, and none where a change was written.
		type instant struct {
			d                         time.Duration
			periodic, changes, closes int
		}
		at := map[string]*instant{}
		var beats, changes, anns, folds, closes, events, failed int
		// The writes of changes: at the start, then 200 ms after each.
		changeAt := []time.Duration{3 * time.Second, 7*time.Minute + 3700*time.Millisecond, 16*time.Minute + 40200*time.Millisecond}
		var eventAt []time.Duration
		retry := false // the next status write is a retry, off the grid
		for _, c := range calls {
			what, when, _ := strings.Cut(c, "@")
			d, err := time.ParseDuration(when)
			if err != nil {
				t.Fatal(err)
			}
			in := at[when]
			if in == nil {
				in = &instant{d: d}
				at[when] = in
			}
			switch {
			case what == "close":
				closes++
				in.closes++
			case what == "annotations":
				anns++
				in.periodic++
			case what == "folded":
				// One write, the heartbeat and the report refresh: on
				// the report's 2-minute grid.
				beats++
				anns++
				folds++
				in.periodic++
				if d%(2*time.Minute) != 0 {
					t.Errorf("a heartbeat with the report %s off the 2 min grid: %v", c, calls)
				}
				retry = false
			case what == "event":
				events++
				eventAt = append(eventAt, d)
			case what == "failed":
				failed++
				retry = true
			// The first write of the conditions (at the start) and the
			// changes' are no heartbeats.
			case what == "status" && slices.Contains(changeAt, d):
				changes++
				in.changes++
			case what == "status":
				beats++
				in.periodic++
				if !retry && d%(10*time.Second) != 0 {
					t.Errorf("heartbeat %s off the 10 s grid: %v", c, calls)
				}
				retry = false
			}
		}
		var kept int
		for when, in := range at {
			// Within clientIdleClose of a change's or an event's
			// write the connection stays.
			afterChange := false
			for _, c := range append(changeAt, eventAt...) {
				afterChange = afterChange || (in.d >= c && in.d-c < clientIdleClose)
			}
			want := in.periodic
			if afterChange {
				want, kept = 0, kept+in.periodic
			}
			if in.closes != want {
				t.Errorf("at %s: %d periodic writes, %d closes, want %d: %v", when, in.periodic, in.closes, want, calls)
			}
		}
		// Heartbeats over 25 minutes, one write failing once and written
		// again; annotations at the start and every 2 minutes, the
		// heartbeat riding on the refresh before it falls due (one write,
		// one close). Kept: the annotations at 3 s, 8, 14 and 18 min.
		if changes != 3 || events != 1 || failed != 1 || beats < 3 || beats > 5 || folds < 2 || anns != 13 || kept != 4 || closes != beats+anns-folds-kept {
			t.Errorf("%d change writes, %d heartbeats (%d with the report), %d annotation writes, %d closes: %v", changes, beats, folds, anns, closes, calls)
		}
	})
}

// The Node deleted and registered anew by the kubelet (a new UID, none of
// the daemon's conditions): the first report write that finds it puts the
// conditions back at once, not with the next heartbeat minutes later (the
// reports must not stand on a Node without this boot's conditions, see
// written). Before, the report came back at its next refresh (2 min) and
// the conditions only with the heartbeat (5 min).
func TestNodeRegisteredAnewGetsItsConditionsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.UID = "uid-1"
		client := fake.NewClientset(n)
		store := report.NewStore("b")
		h := start(t, client, store)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		if n := h.node(t); findCond(n, "DiskUsageHigh") == nil || n.Annotations["autopilot.syself.com/storage"] == "" {
			t.Fatal("conditions and report not written")
		}
		nodes := corev1.SchemeGroupVersion.WithResource("nodes")
		if err := client.Tracker().Delete(nodes, "", node); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		n = kubeletNode()
		n.UID = "uid-2"
		mark := len(client.Actions())
		if err := client.Tracker().Add(n); err != nil {
			t.Fatal(err)
		}
		// The conditions and the report were written within 1 s: the
		// next report write (every 2 minutes) finds the new Node and the
		// conditions come back with it, in the same second, where the
		// next heartbeat would bring them 5 minutes after their last write.
		registered := time.Now()
		back := time.Duration(-1)
		for time.Since(registered) < 10*time.Minute {
			time.Sleep(time.Second)
			synctest.Wait()
			n := h.node(t)
			reported, conds := n.Annotations["autopilot.syself.com/storage"] != "", findCond(n, "DiskUsageHigh") != nil
			if reported || conds {
				if !reported || !conds {
					t.Errorf("on the Node registered anew: report %v, conditions %v; want both back together", reported, conds)
				}
				back = time.Since(registered)
				break
			}
		}
		h.stop()
		if back < 0 {
			t.Fatal("neither the report nor the conditions came back on the Node registered anew within 10 minutes")
		}
		// Within that second, the conditions went first: the report write
		// carries the old Node's UID, which the new Node refuses (kubefake,
		// as kube-apiserver), so no report stands on it before them.
		var order []string
		for _, a := range client.Actions()[mark:] {
			if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "nodes" {
				order = append(order, "patch "+p.GetSubresource())
			}
		}
		if len(order) < 2 || order[0] != "patch status" {
			t.Errorf("writes to the Node registered anew, in order: %q; want the conditions (status) first", order)
		}
		t.Logf("report and conditions back %s after the Node was registered anew", back)
		// By the first report write after the registration: within the
		// report interval of it (and a few seconds), minutes before a
		// heartbeat (5 min after the conditions' write, 10 s before it).
		if limit := 2*time.Minute + 5*time.Second; back > limit {
			t.Errorf("back %s after the Node was registered anew, want within %s (the first report write), not with the heartbeat", back, limit)
		}
	})
}

// nodeAnswered asks for the conditions again for a Node whose UID changed
// or that lacks a condition the last status write put there, and only then;
// only the first, or the second where a UID is not known, is a Node
// registered anew (the same UID: another writer removed the condition).
func TestNodeAnsweredTellsANodeRegisteredAnew(t *testing.T) {
	answer := func(uid string, types ...string) *kubeapi.Node {
		n := &kubeapi.Node{}
		n.Metadata.UID = uid
		for _, ty := range types {
			n.Status.Conditions = append(n.Status.Conditions, kubeapi.NodeCondition{Type: ty})
		}
		return n
	}
	// before: the types of the last status write when the annotation
	// write was sent; after: when its answer came (nil: the same).
	for _, tc := range []struct {
		name          string
		before, after []string
		n             *kubeapi.Node
		want          bool
		// rewrite: the conditions are written again, the report waiting
		// for them (where want is false: a condition removed by another
		// writer).
		rewrite bool
	}{
		{"the same Node", []string{"DiskUsageHigh"}, nil, answer("uid-1", "Ready", "DiskUsageHigh"), false, false},
		{"no UID in the answer", []string{"DiskUsageHigh"}, nil, answer("", "DiskUsageHigh"), false, false},
		{"another UID", []string{"DiskUsageHigh"}, nil, answer("uid-2", "Ready", "DiskUsageHigh"), true, true},
		{"the condition missing, the same UID", []string{"DiskUsageHigh"}, nil, answer("uid-1", "Ready"), false, true},
		{"the condition missing, no UID in the answer", []string{"DiskUsageHigh"}, nil, answer("", "Ready"), true, true},
		// A status write added NodeTampered while the annotation write
		// was in flight: its answer predates it.
		{"a condition added since the write was sent", []string{"DiskUsageHigh"}, []string{"DiskUsageHigh", "NodeTampered"},
			answer("uid-1", "Ready", "DiskUsageHigh"), false, false},
		// A status write removed KubeletUnhealthy (a reload stopped its
		// check) while the annotation write was in flight.
		{"a condition removed since the write was sent", []string{"DiskUsageHigh", "KubeletUnhealthy"}, []string{"DiskUsageHigh"},
			answer("uid-1", "Ready", "DiskUsageHigh"), false, false},
	} {
		r := New(Options{Store: report.NewStore("b"), Log: testLog(t)})
		r.nodeUID, r.nodeTypes = "uid-1", tc.before
		tc.rewrite = tc.rewrite || tc.want
		sent := r.sentBefore()
		if tc.after != nil {
			r.nodeTypes = tc.after
		}
		r.wroteOnce()
		if got := r.nodeAnswered(tc.n, sent); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if pending := !isClosed(r.writtenCh()); pending != tc.rewrite || len(r.rewrite) == 1 != tc.rewrite {
			t.Errorf("%s: report waits %v, rewrite asked %v; want %v", tc.name, pending, len(r.rewrite) == 1, tc.rewrite)
		}
	}
}

// writeTimes is a client that records when each Node write was answered,
// and how.
type writeTimes struct {
	Client
	mu     sync.Mutex
	writes []timedWrite
}

type timedWrite struct {
	status bool // the conditions; else the report
	at     time.Time
	err    error
}

func (c *writeTimes) note(status bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, timedWrite{status, time.Now(), err})
}

func (c *writeTimes) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	n, err := c.Client.PatchNodeStatus(ctx, name, patch)
	c.note(true, err)
	return n, err
}

func (c *writeTimes) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	n, err := c.Client.PatchNode(ctx, name, patch)
	c.note(false, err)
	return n, err
}

// The Node deleted, and registered anew only minutes later (the kubelet
// restarted): meanwhile every write found no Node (404) and both writers
// backed off to about a minute. When the report write is the first to find
// the new Node, it is refused (the old UID) and the conditions are written
// at once, not at the end of the status writer's backoff (up to a minute
// later, the new Node without the conditions, and without the report, all
// that time).
func TestNodeRegisteredAnewAfterAnAbsenceGetsItsConditionsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.UID = "uid-0"
		client := fake.NewClientset(n)
		wt := &writeTimes{Client: kubefake.New(client)}
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = wt })
		defer h.stop()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		nodes := corev1.SchemeGroupVersion.WithResource("nodes")
		// The backoff is random: the report write finds the new Node
		// first in some rounds, the status write in others.
		refusals := 0
		for round := 1; round <= 12 && refusals < 3; round++ {
			if err := client.Tracker().Delete(nodes, "", node); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Minute) // both writers fail, backing off to a minute
			n := kubeletNode()
			n.UID = types.UID("uid-" + strconv.Itoa(round))
			wt.mu.Lock()
			mark := len(wt.writes)
			wt.mu.Unlock()
			if err := client.Tracker().Add(n); err != nil {
				t.Fatal(err)
			}
			registered := time.Now()
			for {
				time.Sleep(time.Second)
				synctest.Wait()
				n := h.node(t)
				if n.Annotations["autopilot.syself.com/storage"] != "" && findCond(n, "DiskUsageHigh") != nil {
					break
				}
				if time.Since(registered) > 5*time.Minute {
					t.Fatalf("round %d: the report and the conditions not back on the Node registered anew within 5 minutes", round)
				}
			}
			wt.mu.Lock()
			var refused, status time.Time
			for _, w := range wt.writes[mark:] {
				switch {
				case !w.status && w.err != nil && uidRefused(w.err) && refused.IsZero():
					refused = w.at
				case w.status && w.err == nil && status.IsZero():
					status = w.at
				}
			}
			wt.mu.Unlock()
			if refused.IsZero() || status.Before(refused) {
				continue // the conditions found the new Node first
			}
			refusals++
			if d := status.Sub(refused); d > time.Second {
				t.Errorf("round %d: the conditions written %s after the report write was refused (the Node registered anew), want at once", round, d)
			}
		}
		if refusals == 0 {
			t.Fatal("in no round did the report write find the Node registered anew first")
		}
	})
}

// A write the API server answered with a Retry-After (429, 5xx) is tried
// again no sooner than it asked, and no later than the backoff's longest
// wait (a minute): a Retry-After of an hour does not keep the conditions
// off the Node for an hour. The client does not wait itself
// (TestClientLeavesRetriesToTheReporter).
func TestRetryAfterIsAFloorOfTheBackoff(t *testing.T) {
	for _, tc := range []struct {
		retryAfter int
		min, max   time.Duration
	}{{3600, 30 * time.Second, time.Minute}, {40, 40 * time.Second, time.Minute}} {
		t.Run(fmt.Sprintf("Retry-After %d", tc.retryAfter), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(kubeletNode())
				var mu sync.Mutex
				var tries []time.Time
				client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() != "status" {
						return false, nil, nil
					}
					mu.Lock()
					defer mu.Unlock()
					tries = append(tries, time.Now())
					if len(tries) > 2 {
						return false, nil, nil
					}
					return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", tc.retryAfter)
				})
				store := report.NewStore("b")
				h := start(t, client, store)
				defer h.stop()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
				time.Sleep(3 * time.Minute)
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				if len(tries) < 3 {
					t.Fatalf("Retry-After %d: %d status writes in 3 minutes, want the third to go through", tc.retryAfter, len(tries))
				}
				for i := 1; i < 3; i++ {
					if gap := tries[i].Sub(tries[i-1]); gap < tc.min || gap > tc.max {
						t.Errorf("Retry-After %d: try %d came %s after the one before, want %s to %s", tc.retryAfter, i+1, gap, tc.min, tc.max)
					}
				}
				if c := findCond(h.node(t), "DiskUsageHigh"); c == nil {
					t.Errorf("Retry-After %d: the condition is not on the Node after the API server took the write", tc.retryAfter)
				}
			})
		})
	}
}

// An answer to the read of the Node at start that is not that Node (200,
// but a NodeList, or another Node: a proxy or an aggregated API answering
// for the API server) is a failed read, retried with the backoff, not a
// Node without conditions: taken as one, nothing was carried over, and a
// restart without the state file lowered a NodeTampered the Node held
// True. With the daemon's client, against a server whose first answer is
// a NodeList and whose next is the Node.
func TestWrongAnswerToTheReadIsRetried(t *testing.T) {
	var gets atomic.Int32
	c := apiServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodGet {
			fmt.Fprint(w, `{"metadata":{"name":"n1","uid":"u1"}}`)
			return
		}
		if gets.Add(1) == 1 {
			fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[]}`)
			return
		}
		fmt.Fprintf(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","uid":"u1"},"status":{"conditions":[`+
			`{"type":"NodeTampered","status":"True","reason":"ProtectedFileChanged","message":"/etc/kubernetes/kubelet.conf changed","lastTransitionTime":%q}]}}`,
			t0.Format(time.RFC3339))
	})
	store := report.NewStore("b")
	m := NewMetrics(nil)
	r := New(Options{Client: c, NodeName: "n1", Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-r.Adopted():
	case <-time.After(10 * time.Second):
		t.Fatal("the Node's conditions not read within 10 s")
	}
	if cond, ok := store.Get("NodeTampered"); !ok || cond.Status != report.StatusTrue || !cond.LastTransitionTime.Equal(t0) {
		t.Errorf("NodeTampered after the read: %+v %v; want True since %v, taken over from the Node", cond, ok, t0)
	}
	if n := gets.Load(); n != 2 {
		t.Errorf("%d reads, want 2 (the wrong answer, then the Node)", n)
	}
	if v := testutil.ToFloat64(m.writes.WithLabelValues(KindRead, "error")); v != 1 {
		t.Errorf("failed reads counted: %v, want 1", v)
	}
}

// A report write refused for the Node's UID again right after the
// conditions' write learnt that UID (an API server, or something in front
// of it, that refuses the UID for another reason than a Node registered
// anew: 422 on metadata.uid, 409 naming the UID precondition) backs off,
// counted and logged once, as any failing write does: the refusal had the
// conditions written again at once and the report follow at once, and
// the two writes went back and forth without a pause, as fast as the
// client's rate limiter let them.
func TestUIDRefusedForeverBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.UID = "uid-1"
		client := fake.NewClientset(n)
		var mu sync.Mutex
		refused := 0
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() == "status" {
				return false, nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			if refused >= 1000 { // ends a spin: the test fails, not hangs
				return false, nil, nil
			}
			refused++
			return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, node,
				field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), "uid-1", "field is immutable")})
		})
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		h := startLogged(t, client, store, report.NewDetails(), &logs)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"}, time.Now())
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		h.stop()
		mu.Lock()
		r := refused
		mu.Unlock()
		acts := countActions(client)
		// The backoff: 1 s doubling to a minute, each wait jittered down
		// to half, is fewer than 30 tries in 10 minutes; each refusal has the
		// conditions written once more.
		if r >= 30 || acts["patch nodes/status"] > r+3 {
			t.Errorf("in 10 minutes: %d report writes refused for the UID, %d status writes; want them paced by the backoff (fewer than 30)", r, acts["patch nodes/status"])
		}
		if v := testutil.ToFloat64(h.m.writes.WithLabelValues(KindAnnotations, "error")); v < 2 {
			t.Errorf("refused report writes counted: %v", v)
		}
		out := logs.String()
		if a, b := strings.Count(out, "node registered anew"), strings.Count(out, "writing the report annotations of node "+node+" failed"); a != 1 || b != 1 {
			t.Errorf("logged %d times that the node was registered anew and %d that the report failed; want once each:\n%s", a, b, out)
		}
	})
}

// The report write that finds the Node without this boot's conditions
// (registered anew, or a condition gone) holds the next report until the
// conditions are back; while their writes fail (the API server refusing
// status writes), the report writer waits beating, within its period
// (the report interval) plus the daemon's 30 s of slack, as README's
// "Under systemd" promises. Before, it beat, slept up to a report
// interval until the next report, then waited up to another for the
// conditions: silent for about twice the report interval, stuck to the
// daemon's liveness, and systemd's watchdog restarted a daemon that only
// waited on the API server.
func TestReportWaitingForTheConditionsBeatsWithinItsPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const slack = 30 * time.Second // the daemon's loopSlack
		n := kubeletNode()
		n.UID = "uid-1"
		client := fake.NewClientset(n)
		var mu sync.Mutex
		statusDown := false
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if statusDown && a.GetSubresource() == "status" {
				return true, nil, apierrors.NewServiceUnavailable("etcd is slow")
			}
			return false, nil, nil
		})
		type beat struct {
			at      time.Time
			allowed time.Duration
		}
		last := map[string]beat{}
		var gaps []string
		checkGap := func(loop string, now time.Time) {
			if b, ok := last[loop]; ok && now.Sub(b.at) > b.allowed+slack {
				gaps = append(gaps, fmt.Sprintf("%s silent %s, allowed %s + %s", loop, now.Sub(b.at), b.allowed, slack))
			}
		}
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) {
			o.Progress = func(loop string, allowed time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				checkGap(loop, time.Now())
				last[loop] = beat{time.Now(), allowed}
			}
		})
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		if findCond(h.node(t), "DiskUsageHigh") == nil {
			t.Fatal("conditions not written")
		}
		// The condition leaves the Node (as on a Node registered anew),
		// and the status writes fail from now on.
		mu.Lock()
		statusDown = true
		mu.Unlock()
		cur := h.node(t)
		cur.Status.Conditions = slices.DeleteFunc(cur.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == "DiskUsageHigh" })
		if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), cur, ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Minute)
		synctest.Wait()
		mu.Lock()
		for _, loop := range []string{"kube/annotations", "kube/status", eventsLoop} {
			checkGap(loop, time.Now())
		}
		mu.Unlock()
		h.stop()
		mu.Lock()
		defer mu.Unlock()
		if len(gaps) > 0 {
			t.Errorf("stuck while waiting on the API server: %s", strings.Join(gaps, "; "))
		}
	})
}

// A restart before the first report of a boot: the report annotations wait
// for the checks' first pass, so for that long after a reboot the Node
// holds this boot's conditions under the previous boot's report. The line
// that set a kernel condition True in this boot is gone when the daemon is
// back (a flood of I/O errors pushed it out of the ring buffer), and so is
// the state file (a read-only /var, the very condition): the Node is the
// only record of the True, and it must be taken over as this boot's, or the
// condition flaps True, False, and a MachineHealthCheck's "True for 120 s"
// starts again.
func TestRestartBeforeTheFirstReportKeepsThisBootsKernelCondition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The previous boot's False and its report.
		before := corev1.NodeCondition{Type: "ReadonlyFilesystem", Status: corev1.ConditionFalse, Reason: "FilesystemIsNotReadOnly",
			LastTransitionTime: metav1.NewTime(t0)}
		n := kubeletNode(before)
		n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"boot-a"}`
		client := fake.NewClientset(n)
		bootStart := time.Now().Add(-time.Minute)
		never := make(chan struct{}) // the checks' first pass: not done before the restart
		run := func() (*harness, *report.Store) {
			store := report.NewStore("boot-b")
			store.SetBootStart(bootStart)
			// kmsg.Monitor.Start's placeholder: no state file for this boot.
			store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusUnknown, Reason: report.ReasonNoData,
				Message: "the kernel log has not been read yet"}, time.Now())
			det := report.NewDetails()
			det.SetBootID("boot-b")
			h := startOpts(t, client, store, det, io.Discard, func(o *Options) { o.FirstPass = never })
			<-h.r.Adopted()
			return h, store
		}

		h, store := run()
		line := time.Now().Truncate(time.Second)
		store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusTrue, Reason: report.ReasonFilesystemIsReadOnly,
			Message: "EXT4-fs (sda2): Remounting filesystem read-only"}, line)
		time.Sleep(time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "ReadonlyFilesystem"); c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("ReadonlyFilesystem on the Node before the restart: %+v; want True", c)
		}
		h.stop() // the restart, before the first pass (and its report)

		time.Sleep(5 * time.Second) // RestartSec
		writes := len(client.Actions())
		h, store = run()
		// The reader has read the ring buffer to its end: the line is gone.
		store.Set(report.Condition{Type: "ReadonlyFilesystem", Status: report.StatusFalse, Reason: "FilesystemIsNotReadOnly",
			Message: "no matching kernel message in the records read"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		c := findCond(h.node(t), "ReadonlyFilesystem")
		if c == nil || c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(line) {
			t.Errorf("ReadonlyFilesystem after the restart: %+v; want True since %v, as before it", c, line)
		}
		for _, a := range client.Actions()[writes:] {
			if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" &&
				strings.Contains(string(p.GetPatch()), `"type":"ReadonlyFilesystem"`) && !strings.Contains(string(p.GetPatch()), `"status":"True"`) {
				t.Errorf("a write after the restart lowered this boot's True: %s", p.GetPatch())
			}
		}
		h.stop()
	})
}

// The report that goes with the first write of a boot's conditions stands
// beside those conditions only: the earlier boot's True kernel condition is
// replaced in that same patch (by this boot's placeholder), so a restart
// before the first pass does not take the earlier boot's True for this
// boot's under this boot's report.
func TestEarlyReportDoesNotCarryTheEarlierBootsKernelCondition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		earlier := corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionTrue, Reason: "CriticalTaskHung",
			Message: "INFO: task kubelet:128 blocked for more than 120 seconds.", LastTransitionTime: metav1.NewTime(t0)}
		n := kubeletNode(earlier)
		n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"boot-a"}`
		client := fake.NewClientset(n)
		never := make(chan struct{})
		run := func() *harness {
			store := report.NewStore("boot-b")
			store.SetBootStart(time.Now().Add(-time.Minute))
			store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusUnknown, Reason: report.ReasonNoData,
				Message: "the kernel log has not been read yet"}, time.Now())
			det := report.NewDetails()
			det.SetBootID("boot-b")
			h := startOpts(t, client, store, det, io.Discard, func(o *Options) { o.FirstPass = never })
			<-h.r.Adopted()
			time.Sleep(time.Second)
			synctest.Wait()
			return h
		}
		h := run()
		got := h.node(t)
		if b := report.ReportBootID(got.Annotations); b != "boot-b" {
			t.Errorf("the report after the first write of this boot's conditions: %q; want boot-b", b)
		}
		if c := findCond(got, "KernelDeadlock"); c == nil || c.Status == corev1.ConditionTrue {
			t.Errorf("KernelDeadlock under this boot's report: %+v; want this boot's placeholder", c)
		}
		if got.Annotations["other/annotation"] != "keep" {
			t.Errorf("another writer's annotation: %q", got.Annotations["other/annotation"])
		}
		h.stop()
		h = run()
		if c, _ := h.store.Get("KernelDeadlock"); c.Status == report.StatusTrue {
			t.Errorf("the earlier boot's KernelDeadlock taken over after the restart: %+v", c)
		}
		if c := findCond(h.node(t), "KernelDeadlock"); c == nil || c.Status == corev1.ConditionTrue {
			t.Errorf("KernelDeadlock on the Node after the restart: %+v", c)
		}
		h.stop()
	})
}

// Once the Node's report is this boot's, the status writes are the
// conditions alone: the report goes with them only until then.
func TestStatusWritesCarryTheReportOnlyUntilItIsThisBoots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"boot-a"}`
		client := fake.NewClientset(n)
		store := report.NewStore("boot-b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		det := report.NewDetails()
		det.SetBootID("boot-b")
		h := startOpts(t, client, store, det, io.Discard, func(o *Options) { o.FirstPass = make(chan struct{}) })
		<-h.r.Adopted()
		time.Sleep(time.Second)
		synctest.Wait()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		var with []bool
		for _, a := range client.Actions() {
			if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" {
				with = append(with, strings.Contains(string(p.GetPatch()), `"annotations"`))
			}
		}
		if !slices.Equal(with, []bool{true, false}) {
			t.Errorf("status writes carrying the report: %v; want the first only", with)
		}
		h.stop()
	})
}

// crowdedNode is kubeletNode with others bytes of another writer's
// annotation (a cluster tool's state) and the earlier boot's (boot-a)
// storage document: a Node where this boot's report may not fit.
func crowdedNode(others int) *corev1.Node {
	n := kubeletNode()
	n.Annotations["tool.example.com/state"] = strings.Repeat("x", others)
	n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"boot-a"}`
	return n
}

// diskUsageHighBootB is this boot's (boot-b) store with DiskUsageHigh True
// and its details, whose storage domain holds the filesystems of pods
// pods' volumes (a few KiB for 30 or 40: what the checks collected before
// the first write), none for 0.
func diskUsageHighBootB(pods int) (*report.Store, *report.Details) {
	store := report.NewStore("boot-b")
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh}, time.Now())
	det := report.NewDetails()
	det.SetBootID("boot-b")
	if pods > 0 {
		var fss []map[string]string
		for i := range pods {
			fss = append(fss, map[string]string{"mountPoint": fmt.Sprintf("/var/lib/kubelet/pods/%032d/volumes", i), "device": "/dev/sda1"})
		}
		det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: fss})
	}
	return store, det
}

// startBeforeFirstPass starts the reporter with a first pass of the checks
// that never ends (no refresh of the report), and returns once it adopted
// the Node.
func startBeforeFirstPass(t *testing.T, client *fake.Clientset, store *report.Store, det *report.Details, logs io.Writer) *harness {
	never := make(chan struct{})
	h := startOpts(t, client, store, det, logs, func(o *Options) { o.FirstPass = never })
	<-h.r.Adopted()
	return h
}

// annotationLimit makes the fake API server refuse, as kube-apiserver's
// validation does (422, metadata.annotations: Too long), a node patch
// whose result holds more than 256 KiB of annotations, counted as the API
// server counts them (keys and values).
func annotationLimit(client *fake.Clientset) {
	const limit = 256 * 1024
	client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var p struct {
			Metadata struct {
				Annotations map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &p); err != nil || len(p.Metadata.Annotations) == 0 {
			return false, nil, nil
		}
		o, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", node)
		if err != nil {
			return false, nil, nil
		}
		merged := map[string]string{}
		for k, v := range o.(*corev1.Node).Annotations {
			merged[k] = v
		}
		for k, v := range p.Metadata.Annotations {
			if v == nil {
				delete(merged, k)
			} else {
				merged[k] = *v
			}
		}
		total := 0
		for k, v := range merged {
			total += len(k) + len(v)
		}
		if total <= limit {
			return false, nil, nil
		}
		return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, node, field.ErrorList{
			field.TooLong(field.NewPath("metadata", "annotations"), "", limit)})
	})
}

// A Node whose other writers' annotations leave no room for this boot's
// report (a cluster tool's 255 KiB of annotations): the report cannot be
// written, and the conditions must be all the same. The early report in
// the status patch must not take the conditions down with it: the status
// write that carries it is refused (422, the annotations too long) as
// the report write is, and the conditions never reached the Node.
func TestConditionsLandWhenTheEarlyReportDoesNotFit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(crowdedNode(255 * 1024))
		annotationLimit(client)
		// What the checks collected before the first write: a few KiB.
		store, det := diskUsageHighBootB(30)
		h := startOpts(t, client, store, det, io.Discard, nil)
		<-h.r.Adopted()
		time.Sleep(time.Minute)
		synctest.Wait()
		got := h.node(t)
		if c := findCond(got, "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("DiskUsageHigh on the Node a minute after the start: %+v; want True (the status writes: %v)", c, countActions(client))
		}
		// The Node never holds this boot's conditions beside the earlier
		// boot's report.
		if b := report.ReportBootID(got.Annotations); b == "boot-a" {
			t.Errorf("the earlier boot's report beside this boot's conditions")
		}
		// The writes that follow are the conditions alone: not one
		// refused write before each.
		writes := countActions(client)["patch nodes/status"]
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		time.Sleep(time.Minute)
		synctest.Wait()
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionFalse {
			t.Errorf("DiskUsageHigh after the change: %+v; want False", c)
		}
		if got := countActions(client)["patch nodes/status"] - writes; got != 1 {
			t.Errorf("%d status writes for one change; want 1", got)
		}
		h.stop()
	})
}

// A change that comes while a report refresh carrying the heartbeat is in
// flight (after the write read the conditions, before it is answered) is
// not in that write: it is written within the coalescing, as any change,
// not with the next heartbeat minutes later, and status says it is pending
// until then.
func TestChangeDuringTheFoldedWriteIsWrittenAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		var mu sync.Mutex
		var armed bool
		var changedAt time.Time
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if armed && a.GetSubresource() == "status" && strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"annotations"`) {
				// The check finds the disk full while the write is on
				// its way to the API server.
				armed, changedAt = false, time.Now()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
			}
			return false, nil, nil
		})
		h := start(t, client, store)
		<-h.r.Adopted()
		time.Sleep(10 * time.Minute) // settle
		synctest.Wait()
		mu.Lock()
		armed = true
		mu.Unlock()
		// The next refresh that carries the heartbeat comes within 4 min.
		for range 5 * 60 {
			time.Sleep(time.Second)
			synctest.Wait()
			mu.Lock()
			at := changedAt
			mu.Unlock()
			if !at.IsZero() {
				break
			}
		}
		mu.Lock()
		at := changedAt
		mu.Unlock()
		if at.IsZero() {
			h.stop()
			t.Fatalf("no report refresh carried the heartbeat in 5 min: %v", countActions(client))
		}
		time.Sleep(time.Until(at.Add(time.Second)))
		synctest.Wait()
		c := findCond(h.node(t), "DiskUsageHigh")
		if c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("a change made during the write that carried the heartbeat, 1 s later on the Node: %+v; want True", c)
			if !h.m.Reporting().StatusPending {
				t.Error("status says nothing is pending while the change is not on the Node")
			}
		}
		h.stop()
	})
}

// SIGTERM while a report refresh carrying the heartbeat hangs, after a
// change came that the write does not carry: the change still gets its one
// short attempt, as when SIGTERM cuts any other write of the conditions
// short. (The loop's choice between the stop and the change is the
// runtime's: it is tried 30 times; a test stops at its first failure.)
func TestShutdownDuringTheFoldedWriteStillWritesTheLastChange(t *testing.T) {
	for i := range 30 {
		synctest.Test(t, func(t *testing.T) {
			client := fake.NewClientset(kubeletNode())
			// Armed, the first status write carrying the report (a
			// report refresh with the heartbeat) hangs.
			armed := false
			hang := &slowStatus{Client: kubefake.New(client), hung: make(chan struct{}),
				when: func(p string) bool { return armed && strings.Contains(p, `"annotations"`) }}
			store := report.NewStore("b")
			store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
			h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = hang })
			<-h.r.Adopted()
			time.Sleep(10 * time.Minute) // settle
			synctest.Wait()
			hang.mu.Lock()
			armed = true
			hang.mu.Unlock()
			<-hang.hung // within 4 min
			store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
			h.stop() // SIGTERM, within the coalescing
			if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
				t.Errorf("try %d: after a shutdown during the write that carried the heartbeat: DiskUsageHigh %+v; want the change written", i, c)
			}
		})
	}
}

// A message read back from the Node at start is one line of printable text
// like any other the store holds: an earlier build wrote the kernel's line
// raw (a hung task named with a terminal escape sequence), and a restart
// without the state file (or one whose state file the Node's word
// replaces) carried it over as it was, into status (whose output the
// administrator's terminal acts on), the state file, and back onto the
// Node with every write, for the whole boot: a kernel condition True is
// held until the reboot, and its line may be gone from the ring buffer.
// Longer than the store's cap, it is capped as a new message is.
func TestAdoptedMessagesArePrintable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		raw := "INFO: task runc:\x1b[2J:4242 blocked for more than 120 seconds.\nforged: line"
		want := `INFO: task runc:\x1b[2J:4242 blocked for more than 120 seconds.\x0aforged: line`
		long := strings.Repeat("x", 3*report.MaxMessageLen)
		client := fake.NewClientset(kubeletNode(
			corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionTrue, Reason: "CriticalTaskHung",
				Message: raw, LastTransitionTime: metav1.NewTime(t0)},
			corev1.NodeCondition{Type: "DiskUsageHigh", Status: corev1.ConditionTrue, Reason: "FilesystemSpaceHigh",
				Message: long, LastTransitionTime: metav1.NewTime(t0)},
		))
		store := report.NewStore("b")
		h := start(t, client, store)
		defer h.stop()
		<-h.r.Adopted()
		if c, ok := store.Get("KernelDeadlock"); !ok || c.Message != want {
			t.Errorf("carried over from the Node: %q; want %q", c.Message, want)
		}
		if c, ok := store.Get("DiskUsageHigh"); !ok || len(c.Message) > report.MaxMessageLen {
			t.Errorf("carried over from the Node: a message of %d bytes; want at most %d", len(c.Message), report.MaxMessageLen)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "KernelDeadlock"); c == nil || c.Message != want || !c.LastTransitionTime.Time.Equal(t0) {
			t.Errorf("on the Node after the first write: %+v; want the message %q, since %v", c, want, t0)
		}
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || len(c.Message) > report.MaxMessageLen {
			t.Errorf("on the Node after the first write: a message of %d bytes; want at most %d", len(c.Message), report.MaxMessageLen)
		}
	})
}
