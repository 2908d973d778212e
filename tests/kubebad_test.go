//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// The API server's bad days, with a proxy in front of the real
// kube-apiserver (harness.Proxy) that injects what such a day answers.

// proxied registers node, starts a proxy that calls the API server as the
// node, and returns a client of the daemon's that calls the proxy with the
// node's own kubeconfig (another server address).
func proxied(t *testing.T, s *harness.APIServer, node string) (*harness.Proxy, kube.Client) {
	t.Helper()
	registerNode(t, s, node)
	p, err := s.StartProxy("system:node:"+node, []string{"system:nodes"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	kc, err := s.NodeKubeconfig(node, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	pkc := filepath.Join(t.TempDir(), "kubelet.conf")
	if err := os.WriteFile(pkc, []byte(strings.Replace(string(b), s.URL, p.URL, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := kube.NewClient(pkc, "autopilot-health-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// startProxied starts a reporter through p's client with a probe dial of
// the proxy's address that counts its dials.
func startProxied(t *testing.T, p *harness.Proxy, client kube.Client, node string, store *report.Store, dials *countDials) *running {
	t.Helper()
	dial, err := kube.Dialer(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	x := &running{store: store, det: report.NewDetails(), m: kube.NewMetrics(nil), done: make(chan struct{})}
	x.r = kube.New(kube.Options{Client: client, NodeName: node, Role: report.RoleWorker, Store: store, Details: x.det,
		Log: quiet(), Metrics: x.m, HeartbeatPeriod: 5 * time.Minute, ReportInterval: 2 * time.Minute, EventCountFlush: time.Second,
		Dial: func(ctx context.Context) error { dials.add(); return dial(ctx) }})
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	go func() { x.r.Run(ctx); close(x.done) }()
	t.Cleanup(x.stop)
	return x
}

type countDials struct {
	mu sync.Mutex
	n  int
}

func (c *countDials) add() { c.mu.Lock(); c.n++; c.mu.Unlock() }
func (c *countDials) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// nodeEvents lists the Events about node (as admin).
func nodeEvents(t *testing.T, s *harness.APIServer, node string) []corev1.Event {
	t.Helper()
	evs, err := s.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	return evs.Items
}

// Writes the API server saved whose answers a reset connection lost (the
// first status write, the first Event create, the first count patch): the
// retries find them (the create's AlreadyExists) and the Node and the
// Event end as if nothing was lost: one Event, its count every occurrence.
func TestKubeLostAnswersThroughAProxy(t *testing.T) {
	s := apiServer(t)
	node := "node-lost-answers-" + harness.Token()
	p, client := proxied(t, s, node)
	var mu sync.Mutex
	lost := map[string]bool{}
	p.SetFault(func(r *http.Request) *harness.Fault {
		mu.Lock()
		defer mu.Unlock()
		var kind string
		switch {
		case r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status"):
			kind = "status"
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events"):
			kind = "create"
		case r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/events/"):
			kind = "count"
		default:
			return nil
		}
		if lost[kind] {
			return nil
		}
		lost[kind] = true
		return &harness.Fault{LoseAnswer: true}
	})
	store := report.NewStore("boot")
	var dials countDials
	x := startProxied(t, p, client, node, store, &dials)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	for range 5 {
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(700 * time.Millisecond) // occurrences over time: a create, then count patches
	}
	waitNode(t, s, node, "DiskUsageHigh=True", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := nodeEvents(t, s, node)
		if len(evs) == 1 && evs[0].Count == 5 {
			break
		}
		if time.Now().After(deadline) {
			var got []string
			for _, e := range evs {
				got = append(got, fmt.Sprintf("%s count %d", e.Name, e.Count))
			}
			t.Fatalf("Events after lost answers: %v, want one with count 5", got)
		}
		time.Sleep(100 * time.Millisecond) // polling the API server for the awaited count
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range []string{"status", "create", "count"} {
		if !lost[k] {
			t.Errorf("no %s answer was lost: the test did not test it", k)
		}
	}
}

// The API server's bad day answers every request for 12 s, while conditions
// change and distinct events come: a 429 storm of its priority and fairness
// (text/plain and a Retry-After, as kube-apiserver answers it), the same
// as a Status (as a proxy in front of it may answer), a 503 with a
// Retry-After, a 409 Conflict, a 500, a 200 that is a load balancer's page.
// Each writer tries again no sooner than a Retry-After asked, and otherwise
// with its backoff (not more often); nothing dials the address (it
// answers); and when the day ends the Node holds the last state since the
// last change and the Events count every occurrence.
func TestKubeBadAnswersThroughAProxy(t *testing.T) {
	harness.Parallel(t, 0)
	s := apiServer(t)
	tok := harness.Token()
	status := func(code int, reason string) string {
		return fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"bad day","reason":%q,"code":%d}`, reason, code)
	}
	// The cases run at once, each through a proxy of its own to a Node of
	// its own: one after another they took 112-140 s, most of it the 12 s
	// bad day and the backoff after it, which do not compete for the CPU.
	// (t.Run from goroutines, as testing allows, not t.Parallel: -parallel
	// is GOMAXPROCS, 2 on CI's machine.)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, tc := range []struct {
		name       string
		fault      harness.Fault
		retryAfter time.Duration
	}{
		{"429 of priority and fairness", harness.Fault{Code: 429, Body: "Too many requests, please try again later.\n",
			Header: http.Header{"Retry-After": {"5"}, "Content-Type": {"text/plain; charset=utf-8"}}}, 5 * time.Second},
		{"429 Status with Retry-After", harness.Fault{Code: 429, Body: status(429, "TooManyRequests"),
			Header: http.Header{"Retry-After": {"5"}, "Content-Type": {"application/json"}}}, 5 * time.Second},
		{"503 Status with Retry-After", harness.Fault{Code: 503, Body: status(503, "ServiceUnavailable"),
			Header: http.Header{"Retry-After": {"5"}, "Content-Type": {"application/json"}}}, 5 * time.Second},
		// A Retry-After as an HTTP date, 6 s ahead when the fault answers
		// (dated below): RFC 9110 allows one, and client-go reads only
		// seconds (the date was a second of the backoff).
		{"429 Status with Retry-After as an HTTP date", harness.Fault{Code: 429, Body: status(429, "TooManyRequests"),
			Header: http.Header{"Retry-After": {"date"}, "Content-Type": {"application/json"}}}, 4 * time.Second},
		{"409 Conflict", harness.Fault{Code: 409, Body: status(409, "Conflict"),
			Header: http.Header{"Content-Type": {"application/json"}}}, 0},
		{"500", harness.Fault{Code: 500, Body: status(500, "InternalError"),
			Header: http.Header{"Content-Type": {"application/json"}}}, 0},
		{"200 of a load balancer's page", harness.Fault{Code: 200, Body: "<html><body>maintenance</body></html>",
			Header: http.Header{"Content-Type": {"text/html"}}}, 0},
	} {
		wg.Go(func() {
			t.Run(tc.name, func(t *testing.T) {
				node := fmt.Sprintf("node-bad-answers-%d-%s", i, tok)
				p, client := proxied(t, s, node)
				store := report.NewStore("boot")
				var dials countDials
				x := startProxied(t, p, client, node, store, &dials)
				<-x.r.Adopted()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
				waitNode(t, s, node, "DiskUsageHigh=False", has("DiskUsageHigh", "False", "DiskUsageOK"))

				p.SetFault(func(*http.Request) *harness.Fault {
					fault := tc.fault
					if fault.Header.Get("Retry-After") == "date" {
						fault.Header = fault.Header.Clone()
						fault.Header.Set("Retry-After", time.Now().Add(6*time.Second).UTC().Format(http.TimeFormat))
					}
					return &fault
				})
				began := time.Now()
				last := changeEverySecond(store, 12, func(i int) string {
					return fmt.Sprintf("INFO: task worker:%d blocked for more than 120 seconds.", 100+i)
				})
				p.SetFault(nil)
				for _, kind := range []struct{ what, sub, method string }{
					{"status writes", "/status", http.MethodPatch},
					{"Event creates", "/events", http.MethodPost},
				} {
					var tries []time.Time
					for _, r := range p.Requests(kind.sub) {
						if r.Method == kind.method && r.Fault && r.At.After(began) {
							tries = append(tries, r.At)
						}
					}
					if len(tries) == 0 {
						t.Errorf("no %s through the bad day", kind.what)
					}
					// The backoff: 1 s doubling, jittered; 12 s take 4 tries
					// or so, not one a change.
					if len(tries) > 6 {
						t.Errorf("%d %s in 12 s of answers refusing them, one a change: want the backoff to pace them", len(tries), kind.what)
					}
					for i := 1; i < len(tries) && tc.retryAfter > 0; i++ {
						if gap := tries[i].Sub(tries[i-1]); gap < tc.retryAfter-100*time.Millisecond {
							t.Errorf("%s %d came %s after the one before; the answer asked for %s", kind.what, i+1, gap.Round(time.Millisecond), tc.retryAfter)
						}
					}
					t.Logf("%d %s answered by the fault in 12 s", len(tries), kind.what)
				}
				if d := dials.get(); d != 0 {
					t.Errorf("%d dials of the API server's address while it answered, want none", d)
				}
				// The status the Node held before, since the last change.
				waitNodeFor(t, s, node, 90*time.Second, "the last state since the last change", func(n *corev1.Node) bool {
					c := cond(n, "DiskUsageHigh")
					return has("DiskUsageHigh", "False", "DiskUsageOK")(n) && c.LastTransitionTime.Unix() == last.Unix()
				})
				deadline := time.Now().Add(90 * time.Second)
				for {
					evs := nodeEvents(t, s, node)
					var count int32
					for _, e := range evs {
						count += e.Count
					}
					if count == 12 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after the bad day the Events count %d occurrences in %d Events, want 12", count, len(evs))
					}
					time.Sleep(100 * time.Millisecond) // polling the API server for the awaited Events
				}
			})
		})
	}
}

// The daemon restarted while the API server cannot be reached, its state
// file lost: the restarted daemon finds the condition True again (a first
// sighting, now), and when the API server returns the Node keeps the
// condition True since its first transition: no version of the Node shows
// it otherwise, nor with another transition time.
func TestKubeRestartInAnOutageNeitherFlapsNorResets(t *testing.T) {
	s := apiServer(t)
	node := "node-restart-outage-" + harness.Token()
	p, client := proxied(t, s, node)
	store := report.NewStore("boot")
	var dials countDials
	x := startProxied(t, p, client, node, store, &dials)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	first := waitNode(t, s, node, "DiskUsageHigh=True", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	since := cond(first, "DiskUsageHigh").LastTransitionTime

	w, err := s.Admin.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector: "metadata.name=" + node, ResourceVersion: first.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	p.Refuse()
	x.stop()
	time.Sleep(time.Until(since.Add(2 * time.Second))) // a later second than the first transition, not a wait for a condition
	store2 := report.NewStore("boot")
	store2.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 96%"}, time.Now())
	store2.Set(report.Condition{Type: "ClockNotSynchronized", Status: report.StatusFalse, Reason: "ClockSynchronized"}, time.Now())
	x2 := startProxied(t, p, client, node, store2, &dials)
	for deadline := time.Now().Add(20 * time.Second); failures(x2.m) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the restarted reporter never found the API server unreachable")
		}
		time.Sleep(50 * time.Millisecond) // polling the metric for the awaited failures
	}
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-deadline:
			t.Fatal("the restarted daemon's conditions not on the Node within 30 s of the API server's return")
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended")
			}
			n, isNode := ev.Object.(*corev1.Node)
			if !isNode {
				continue
			}
			c := cond(n, "DiskUsageHigh")
			if c == nil || c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&since) {
				t.Fatalf("version %s of the Node: DiskUsageHigh %+v, want True since %v throughout", n.ResourceVersion, c, since)
			}
			if cond(n, "ClockNotSynchronized") != nil {
				if c.Message != "/var 96%" {
					t.Errorf("DiskUsageHigh's message %q, want the restarted daemon's", c.Message)
				}
				return
			}
		}
	}
}

// The API server's port refuses connections for 35 s (the writers' backoff
// grows past 16 s) while the conditions change and events come: the probe
// dials about once a second, not more; once the port takes connections
// again, the Node has the last state and the Events their counts within
// seconds, not at the end of the writers' backoff.
func TestKubeRefusedPortThroughAProxy(t *testing.T) {
	harness.Parallel(t, 0)
	s := apiServer(t)
	node := "node-refused-port-" + harness.Token()
	p, client := proxied(t, s, node)
	store := report.NewStore("boot")
	var dials countDials
	x := startProxied(t, p, client, node, store, &dials)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
	waitNode(t, s, node, "DiskUsageHigh=False", has("DiskUsageHigh", "False", "DiskUsageOK"))

	p.Refuse()
	down := time.Now()
	last := changeEverySecond(store, 35, func(int) string { return "INFO: task kubelet:4242 blocked for more than 120 seconds." })
	if d, secs := dials.get(), int(time.Since(down).Seconds()); d > secs+2 {
		t.Errorf("%d dials in a %d s outage, want about one a second", d, secs)
	} else {
		t.Logf("%d dials in a %d s outage", d, secs)
	}
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitNodeFor(t, s, node, 10*time.Second, "the last state since the last change", func(n *corev1.Node) bool {
		c := cond(n, "DiskUsageHigh")
		return c != nil && c.Status == corev1.ConditionTrue && c.LastTransitionTime.Unix() == last.Unix()
	})
	t.Logf("the Node has the last state %s after the port took connections again", time.Since(back).Round(time.Millisecond))
	for deadline := time.Now().Add(10 * time.Second); ; {
		evs := nodeEvents(t, s, node)
		if len(evs) == 1 && evs[0].Count == 35 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Events 10 s after the return: %d, want one with count 35", len(evs))
		}
		time.Sleep(100 * time.Millisecond) // polling the API server for the awaited count
	}
	t.Logf("the Event has every occurrence %s after the return", time.Since(back).Round(time.Millisecond))
}

// reportingEvery3s registers node and runs a reporter for it with the
// node's credentials, its storage report holding the root filesystem, a
// report refresh every 3 s (the daemon's comes every 2 minutes); it returns
// once the Node was read (x.store takes the conditions).
func reportingEvery3s(t *testing.T, s *harness.APIServer, node string) *running {
	t.Helper()
	return reporting(t, s, node, 3*time.Second, quiet(), nil)
}

// Another writer takes the daemon's condition off the Node and changes its
// report annotation: the next report refresh finds the condition missing
// and has the conditions written again at once, and puts its report back.
func TestKubeAnotherWriterRemovesTheConditionAndChangesTheReport(t *testing.T) {
	s := apiServer(t)
	node := "node-another-writer-" + harness.Token()
	x := reportingEvery3s(t, s, node)
	store := x.store
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	key := report.AnnotationPrefix + "storage"
	n := waitNode(t, s, node, "condition and report", func(n *corev1.Node) bool {
		return cond(n, "DiskUsageHigh") != nil && strings.Contains(n.Annotations[key], `"mountPoint":"/"`)
	})
	since := cond(n, "DiskUsageHigh").LastTransitionTime

	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"{}"}},"status":{"conditions":[{"type":"DiskUsageHigh","$patch":"delete"}]}}`, key)
	if m, err := s.Admin.CoreV1().Nodes().PatchStatus(context.Background(), node, []byte(patch)); err != nil {
		t.Fatal(err)
	} else if cond(m, "DiskUsageHigh") != nil || m.Annotations[key] != "{}" {
		t.Fatalf("the other writer's patch did not land: %v, report %s", conditionsOf(m), m.Annotations[key])
	}
	n = waitNode(t, s, node, "the condition and the report back", func(n *corev1.Node) bool {
		return cond(n, "DiskUsageHigh") != nil && strings.Contains(n.Annotations[key], `"mountPoint":"/"`)
	})
	if c := cond(n, "DiskUsageHigh"); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&since) {
		t.Errorf("DiskUsageHigh back as %+v, want True since %v", c, since)
	}
	readyIntact(t, n)
}

// Another writer changes the daemon's condition on the Node (kubectl patch
// --subresource=status, a stale controller): its status, then its reason,
// then its lastTransitionTime, each time with the report annotation
// overwritten too, so that the report coming back shows a refresh answered
// after the change. The refresh's answer has the conditions written again at
// once, the transition time the daemon holds kept; before, the other
// writer's status stood until the next heartbeat (5 min). A change of the
// message alone waits for the heartbeat, as the daemon's own do.
func TestKubeAnotherWriterChangesTheConditionsStatus(t *testing.T) {
	s := apiServer(t)
	node := "node-another-writer-status-" + harness.Token()
	x := reportingEvery3s(t, s, node)
	store := x.store
	store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHung", Message: "task kubelet blocked"}, time.Now())
	key := report.AnnotationPrefix + "storage"
	reported := func(n *corev1.Node) bool { return strings.Contains(n.Annotations[key], `"mountPoint":"/"`) }
	n := waitNode(t, s, node, "condition and report", func(n *corev1.Node) bool {
		return cond(n, "KernelDeadlock") != nil && reported(n)
	})
	want := *cond(n, "KernelDeadlock")

	// other patches the condition with fields and the report with "{}",
	// and returns when the report is back: a refresh answered after it.
	other := func(fields string) time.Time {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"{}"}},"status":{"conditions":[{"type":"KernelDeadlock",%s}]}}`, key, fields)
		m, err := s.Admin.CoreV1().Nodes().PatchStatus(context.Background(), node, []byte(patch))
		if err != nil {
			t.Fatal(err)
		}
		if m.Annotations[key] != "{}" {
			t.Fatalf("the other writer's patch did not land: report %s", m.Annotations[key])
		}
		at := time.Now()
		waitNode(t, s, node, "the report back after the other writer's patch", reported)
		return at
	}
	for _, tc := range []struct{ what, fields string }{
		{"status", `"status":"False"`},
		{"reason", `"reason":"SomethingElse"`},
		{"lastTransitionTime", fmt.Sprintf(`"lastTransitionTime":%q`, want.LastTransitionTime.Add(-time.Hour).UTC().Format(time.RFC3339))},
	} {
		at := other(tc.fields)
		// The refresh that put the report back had the conditions
		// written at once: within seconds, not with the heartbeat.
		n := waitNodeFor(t, s, node, 5*time.Second, "KernelDeadlock put back after another writer changed its "+tc.what, func(n *corev1.Node) bool {
			c := cond(n, "KernelDeadlock")
			return c != nil && c.Status == want.Status && c.Reason == want.Reason && c.LastTransitionTime.Equal(&want.LastTransitionTime)
		})
		t.Logf("%s put back %s after the other writer's change", tc.what, time.Since(at).Round(time.Millisecond))
		if c := cond(n, "KernelDeadlock"); c.Message != want.Message {
			t.Errorf("after the %s: message %q, want %q", tc.what, c.Message, want.Message)
		}
		readyIntact(t, n)
	}

	if n := x.m.Overwrites(); n != 3 {
		t.Errorf("%v overwrites counted, want 3", n)
	}

	other(`"message":"someone else's words"`)
	// Two more refreshes answered: the message alone waits for the heartbeat.
	other(`"message":"someone else's words"`)
	if c := cond(waitNode(t, s, node, "report", reported), "KernelDeadlock"); c.Message != "someone else's words" || c.Status != want.Status {
		t.Errorf("after the other writer changed the message alone: %+v, want its message kept until the heartbeat", c)
	}
	if n := x.m.Overwrites(); n != 3 {
		t.Errorf("%v overwrites counted after a change of the message alone, want 3", n)
	}
}

// kubelet's own node status update is a strategic merge patch computed
// from the Node it read (its informer's copy, maybe older than the daemon's
// last write) and the Node with its own conditions set, as kubelet's
// nodeutil.PatchNodeStatus makes it: it carries kubelet's conditions and a
// $setElementOrder/conditions naming every type, the daemon's too as they
// stood in that older copy. The API server leaves the daemon's conditions
// as the daemon wrote them, and the refreshes after it find no other
// writer: nothing counted, nothing written again.
func TestKubeKubeletsStatusPatchIsNoOtherWriter(t *testing.T) {
	s := apiServer(t)
	node := "node-kubelet-status-patch-" + harness.Token()
	x := reporting(t, s, node, 2*time.Second, quiet(), nil)
	store := x.store
	key := report.AnnotationPrefix + "storage"
	reported := func(n *corev1.Node) bool { return strings.Contains(n.Annotations[key], `"mountPoint":"/"`) }
	store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusFalse, Reason: report.ReasonKernelHasNoDeadlock}, time.Now().Add(-time.Hour))
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now().Add(-time.Hour))
	// kubelet's copy: the daemon's conditions as they were before its last write.
	stale := waitNode(t, s, node, "the daemon's first conditions and report", func(n *corev1.Node) bool {
		return cond(n, "KernelDeadlock") != nil && cond(n, "DiskUsageHigh") != nil && reported(n)
	})
	store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHung", Message: "task kubelet blocked"}, time.Now())
	want := *cond(waitNode(t, s, node, "KernelDeadlock True", func(n *corev1.Node) bool {
		c := cond(n, "KernelDeadlock")
		return c != nil && c.Status == corev1.ConditionTrue
	}), "KernelDeadlock")

	// kubelet's update: Ready's heartbeat and a MemoryPressure of its own.
	mod := stale.DeepCopy()
	for i := range mod.Status.Conditions {
		if mod.Status.Conditions[i].Type == corev1.NodeReady {
			mod.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Second))
		}
	}
	mod.Status.Conditions = append([]corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse,
		Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}, mod.Status.Conditions...)
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
	if !strings.Contains(string(patch), "$setElementOrder/conditions") || !strings.Contains(string(patch), "KernelDeadlock") {
		t.Fatalf("not kubelet's kind of patch: %s", patch)
	}
	if _, err := s.Admin.CoreV1().Nodes().PatchStatus(context.Background(), node, patch); err != nil {
		t.Fatal(err)
	}
	// Two refreshes answered after kubelet's patch: the report set to
	// "{}" (metadata only) is back each time.
	for range 2 {
		if _, err := s.Admin.CoreV1().Nodes().Patch(context.Background(), node, "application/merge-patch+json",
			[]byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"{}"}}}`, key)), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitNode(t, s, node, "the report back", reported)
	}
	n, err := s.Admin.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := cond(n, "KernelDeadlock"); c == nil || c.Status != want.Status || c.Reason != want.Reason || !c.LastTransitionTime.Equal(&want.LastTransitionTime) {
		t.Errorf("after kubelet's patch from its older copy: %+v, want the daemon's %+v", c, want)
	}
	if cond(n, string(corev1.NodeMemoryPressure)) == nil {
		t.Errorf("kubelet's patch did not land: %+v", n.Status.Conditions)
	}
	if o := x.m.Overwrites(); o != 0 {
		t.Errorf("%v overwrites counted after kubelet's patch, want 0 (patch %s)", o, patch)
	}
}

// changeEverySecond turns DiskUsageHigh True and False in turn, n times a
// second apart (the first True), each with a TaskHung Event of message(i),
// as a node's changes come through an API server's bad day, and returns
// when the last change was set.
func changeEverySecond(store *report.Store, n int, message func(i int) string) (last time.Time) {
	for i := range n {
		st, reason := report.StatusTrue, report.Reason("FilesystemSpaceHigh")
		if i%2 == 1 {
			st, reason = report.StatusFalse, "DiskUsageOK"
		}
		last = time.Now()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: st, Reason: reason}, last)
		store.Emit(report.Event{Reason: "TaskHung", Message: message(i), Time: time.Now()})
		time.Sleep(time.Second) // a change a second through the bad day
	}
	return last
}

// The Events wait out a 429's Retry-After (10 s) also when the probe notices
// the API server's return meanwhile: the port refused connections, a
// condition's write went unanswered, and the port took them again. The
// condition is on the Node within seconds of the return (an outage's
// backoff ends at once); the Event's create goes no sooner than the 429
// asked. Before, the return ended the Events' wait too: the create went
// about 3 s after the 429 that had asked for 10.
func TestKubeRetryAfterOutlastsTheAPIServersReturn(t *testing.T) {
	s := apiServer(t)
	node := "node-retry-after-return-" + harness.Token()
	p, client := proxied(t, s, node)
	store := report.NewStore("boot")
	var dials countDials
	x := startProxied(t, p, client, node, store, &dials)
	<-x.r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
	waitNode(t, s, node, "DiskUsageHigh=False and the report", func(n *corev1.Node) bool {
		return has("DiskUsageHigh", "False", "DiskUsageOK")(n) && n.Annotations["autopilot.syself.com/storage"] != ""
	})

	const retryAfter = 10 * time.Second
	p.SetFault(func(r *http.Request) *harness.Fault {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events") {
			return &harness.Fault{Code: 429, Body: "Too many requests, please try again later.\n",
				Header: http.Header{"Retry-After": {"10"}, "Content-Type": {"text/plain; charset=utf-8"}}}
		}
		return nil
	})
	store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
	var asked time.Time
	for deadline := time.Now().Add(10 * time.Second); asked.IsZero(); {
		if rs := p.Requests("/events"); len(rs) > 0 {
			asked = rs[0].At
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Event create within 10 s of the event")
		}
		time.Sleep(20 * time.Millisecond) // polling the proxy for the awaited create
	}

	p.Refuse()
	refusing := dials.get()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	// The probe's first dial refused (its second begun): it then takes a
	// dial that goes through for the API server's return.
	for deadline := time.Now().Add(5 * time.Second); dials.get() < refusing+2; {
		if time.Now().After(deadline) {
			t.Fatal("the probe did not dial twice within 5 s of the port refusing and the condition's write")
		}
		time.Sleep(20 * time.Millisecond) // polling the dials for the awaited probe
	}
	// The return is the probe's to notice: the condition's writes are cut
	// (unanswered) until its first dial after the port took connections
	// again, not answered by a retry of their own backoff first.
	d0 := dials.get()
	p.SetFault(func(r *http.Request) *harness.Fault {
		if strings.HasSuffix(r.URL.Path, "/status") && dials.get() == d0 {
			return &harness.Fault{Reset: true}
		}
		return nil
	})
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	if since := back.Sub(asked); since >= retryAfter-2*time.Second {
		t.Fatalf("the port took connections again %v after the 429: too late to tell an early create", since)
	}
	waitNodeFor(t, s, node, 5*time.Second, "DiskUsageHigh=True after the return", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	t.Logf("the condition on the Node %v after the return", time.Since(back).Round(time.Millisecond))
	for deadline := time.Now().Add(retryAfter + 10*time.Second); len(nodeEvents(t, s, node)) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no Event 20 s after the 429")
		}
		time.Sleep(100 * time.Millisecond) // polling the API server for the awaited Event
	}
	rs := p.Requests("/events")
	var creates []time.Duration
	for _, r := range rs[1:] {
		creates = append(creates, r.At.Sub(asked).Round(time.Millisecond))
	}
	if len(creates) == 0 || creates[0] < retryAfter {
		t.Errorf("the Event's creates after the 429 came %v after it, want the first no sooner than its Retry-After (%v)", creates, retryAfter)
	}
	t.Logf("the Event's creates after the 429: %v after it", creates)
}
