//go:build integration

package tests

import (
	"context"
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
	const node = "node-lost-answers"
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

// The daemon restarted while the API server cannot be reached, its state
// file lost: the restarted daemon finds the condition True again (a first
// sighting, now), and when the API server returns the Node keeps the
// condition True since its first transition: no version of the Node shows
// it otherwise, nor with another transition time.
func TestKubeRestartInAnOutageNeitherFlapsNorResets(t *testing.T) {
	s := apiServer(t)
	const node = "node-restart-outage"
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
