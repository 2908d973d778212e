//go:build integration

package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// More of the API server's bad day, through a proxy in front of the real
// kube-apiserver (NodeRestriction on, the node's own credentials): answers
// held past the client's timeout (15 s), answers reset mid-body, a JSON
// body cut short as a whole answer, and the Events refused (403: the
// node's RBAC for events gone) while the conditions are not. Each writer
// tries again with its backoff, not more often; when the answers refuse
// or break, nothing dials the address (it answers); the Events' refusal
// does not hold the conditions; and when the day ends the Node holds the
// last state since the last change, the Events every occurrence.
func TestKubeSlowCutAndForbiddenAnswersThroughAProxy(t *testing.T) {
	harness.Parallel(t, 0)
	s := apiServer(t)
	tok := harness.Token()
	forbidden := `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"events is forbidden: User \"system:node:x\" cannot create resource \"events\"","reason":"Forbidden","code":403}`
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, tc := range []struct {
		name  string
		fault func(*http.Request) *harness.Fault
		// changes: the bad day's length in seconds, a change a second.
		changes int
		// tries: at most this many status writes and Event creates each
		// through the bad day; dials: at most this many dials.
		tries, dials int
		// conditionsThrough: the conditions are on the Node through
		// the bad day.
		conditionsThrough bool
	}{
		// Each try held 15 s: in 20 s 2 tries at most, and a
		// dial that goes through doubles its wait (1, 2, 4, 8 s).
		{name: "answers held past the client's timeout", changes: 20, tries: 3, dials: 5,
			fault: func(*http.Request) *harness.Fault { return &harness.Fault{Delay: 20 * time.Second} }},
		{name: "answers reset mid-body", changes: 12, tries: 6,
			fault: func(*http.Request) *harness.Fault { return &harness.Fault{CutBody: true} }},
		{name: "a truncated JSON body", changes: 12, tries: 6,
			fault: func(*http.Request) *harness.Fault { return &harness.Fault{Truncate: true} }},
		{name: "events forbidden", changes: 12, tries: 6, conditionsThrough: true,
			fault: func(r *http.Request) *harness.Fault {
				if strings.Contains(r.URL.Path, "/events") {
					return &harness.Fault{Code: 403, Body: forbidden, Header: http.Header{"Content-Type": {"application/json"}}}
				}
				return nil
			}},
	} {
		wg.Go(func() {
			t.Run(tc.name, func(t *testing.T) {
				node := fmt.Sprintf("node-bad-day-%d-%s", i, tok)
				p, client := proxied(t, s, node)
				store := report.NewStore("boot")
				var dials countDials
				x := startProxied(t, p, client, node, store, &dials)
				<-x.r.Adopted()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
				waitNode(t, s, node, "DiskUsageHigh=False", has("DiskUsageHigh", "False", "DiskUsageOK"))

				p.SetFault(tc.fault)
				began := time.Now()
				last := changeEverySecond(store, tc.changes, func(i int) string {
					return fmt.Sprintf("INFO: task worker:%d blocked for more than 120 seconds.", 100+i)
				})
				if tc.conditionsThrough {
					waitNodeFor(t, s, node, 5*time.Second, "the last state through the bad day", func(n *corev1.Node) bool {
						c := cond(n, "DiskUsageHigh")
						return c != nil && c.LastTransitionTime.Unix() == last.Unix()
					})
				}
				p.SetFault(nil)
				ended := time.Now()
				for _, kind := range []struct{ what, sub, method string }{
					{"status writes", "/status", http.MethodPatch},
					{"Event creates", "/events", http.MethodPost},
				} {
					var n int
					for _, r := range p.Requests(kind.sub) {
						if r.Method == kind.method && r.At.After(began) && r.At.Before(ended) {
							n++
						}
					}
					if kind.what == "Event creates" || !tc.conditionsThrough {
						if n == 0 {
							t.Errorf("no %s through the bad day", kind.what)
						}
						if n > tc.tries {
							t.Errorf("%d %s in %d s of the bad day: want at most %d, the backoff's pace", n, kind.what, tc.changes, tc.tries)
						}
					}
					t.Logf("%d %s in %d s of the bad day", n, kind.what, tc.changes)
				}
				if d := dials.get(); d > tc.dials {
					t.Errorf("%d dials of the API server's address through the bad day, want at most %d", d, tc.dials)
				} else {
					t.Logf("%d dials of the API server's address through the bad day", d)
				}
				// The status the Node held before, since the last change.
				waitNodeFor(t, s, node, 90*time.Second, "the last state since the last change", func(n *corev1.Node) bool {
					c := cond(n, "DiskUsageHigh")
					return c != nil && c.Status == corev1.ConditionFalse && c.LastTransitionTime.Unix() == last.Unix() // an even number of changes: the last False
				})
				t.Logf("the Node has the last state %s after the bad day", time.Since(ended).Round(time.Millisecond))
				deadline := time.Now().Add(90 * time.Second)
				for {
					evs := nodeEvents(t, s, node)
					var count int32
					for _, e := range evs {
						count += e.Count
					}
					if count == int32(tc.changes) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after the bad day the Events count %d occurrences in %d Events, want %d", count, len(evs), tc.changes)
					}
					time.Sleep(100 * time.Millisecond) // polling the API server for the awaited Events
				}
				t.Logf("the Events have every occurrence %s after the bad day", time.Since(ended).Round(time.Millisecond))
			})
		})
	}
}

// node_name names another node than the credentials do: NodeRestriction
// refuses every write, again at each retry of the backoff, and the journal
// says so once per writer, not once per retry; the refusals are counted.
// No Event goes about the other node (NodeRestriction would let it).
func TestKubeRefusedForAnotherNodeIsLoggedOnce(t *testing.T) {
	s := apiServer(t)
	tok := harness.Token()
	self, other := "node-self-once-"+tok, "node-other-once-"+tok
	registerNode(t, s, self)
	registerNode(t, s, other)
	client, kc := nodeClient(t, s, self)
	store := report.NewStore("boot")
	var logs testenv.SyncBuffer
	m := kube.NewMetrics(nil)
	r := kube.New(kube.Options{Client: client, NodeName: other, Identity: kube.CredentialsUser(kc), Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
		Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: m, HeartbeatPeriod: time.Minute, ReportInterval: time.Minute, EventCountFlush: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-r.Adopted()
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
	store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
	// The backoff's 1, 2, 4 s: the conditions' and the report's writes
	// refused three times each or so.
	for deadline := time.Now().Add(30 * time.Second); m.Forbidden() < 6; {
		if time.Now().After(deadline) {
			t.Fatalf("%v forbidden API calls in 30 s, want 6; log:\n%s", m.Forbidden(), logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the metrics for the awaited refusals
	}
	refused := strings.Count(logs.String(), "refused by the API server: the credentials do not allow it")
	if refused == 0 || refused > 2 {
		t.Errorf("%v refusals logged %d times, want once per writer that was refused:\n%s", m.Forbidden(), refused, logs.String())
	}
	if n := strings.Count(logs.String(), "node_name names another node than the credentials do"); n != 1 {
		t.Errorf("node_name naming another node logged %d times, want once:\n%s", n, logs.String())
	}
	t.Logf("%v forbidden calls, %d log lines saying so", m.Forbidden(), refused)
	n, err := s.Admin.CoreV1().Nodes().Get(context.Background(), other, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cond(n, "DiskUsageHigh") != nil {
		t.Error("wrote a condition on another node")
	}
	// NodeRestriction does not restrict Events: the daemon itself sends
	// none about the other node (it sent this node's kernel events about
	// it). Awaited: the event writer took the event, dropped (with the
	// fix) or sent.
	var evs []corev1.Event
	for deadline := time.Now().Add(30 * time.Second); ; {
		evs = nodeEvents(t, s, other)
		if len(evs) > 0 || m.Dropped(kube.DropAnotherNode) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event neither sent nor dropped in 30 s; log:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the API server and the metrics for the event's fate
	}
	for _, e := range evs {
		t.Errorf("an Event about the other node: %s %q count %d (source %s)", e.Reason, e.Message, e.Count, e.Source.Host)
	}
	if d := m.Dropped(kube.DropAnotherNode); d != 1 {
		t.Errorf("%v events dropped for another node, want 1", d)
	}
}

// The credentials the event writer checks are those of the client in use
// now, not those read at start: kubelet.conf's certificate (a symlink the
// kubelet moves) swapped between this node's and another node's (an image
// cloned with another node's kubelet.conf, a wrong file put in place),
// from each as the start's. With another node's, this node's Events are
// dropped (NodeRestriction would let them through about this Node); with
// its own, they are sent; each change said once. Before, the identity read
// at start held for the daemon's life: an Event went out about this node
// with another node's credentials, and a daemon started with another
// node's went on dropping every Event after the kubelet had its own.
func TestKubeEventsFollowTheCredentialsInUse(t *testing.T) {
	s := apiServer(t)
	for _, first := range []string{"self", "other"} {
		t.Run("from "+first, func(t *testing.T) {
			tok := harness.Token()
			names := map[string]string{"self": "node-self-now-" + tok, "other": "node-other-now-" + tok}
			self := names["self"]
			registerNode(t, s, self)
			registerNode(t, s, names["other"])
			dir := t.TempDir()
			current := filepath.Join(dir, "kubelet-client-current.pem")
			var n int
			// swap issues a certificate of node and points the symlink
			// at it, as the kubelet's certificate manager does.
			swap := func(node string) {
				t.Helper()
				cert, key, err := s.CA.Issue("system:node:"+node, []string{"system:nodes"}, false, time.Now().Add(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				n++
				f := filepath.Join(dir, fmt.Sprintf("kubelet-client-2026-12-06-00-00-%02d.pem", n))
				if err := os.WriteFile(f, append(cert, key...), 0o600); err != nil {
					t.Fatal(err)
				}
				tmp := current + ".tmp"
				os.Remove(tmp)
				if err := os.Symlink(f, tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, current); err != nil {
					t.Fatal(err)
				}
			}
			swap(names[first])
			kc := filepath.Join(dir, "kubelet.conf")
			if err := s.WriteKubeconfig(kc, "node", current); err != nil {
				t.Fatal(err)
			}
			var logs testenv.SyncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			client, _, err := kube.NewClient(kc, "autopilot-health-test", log)
			if err != nil {
				t.Fatal(err)
			}
			// As the daemon does: the user of the client made at start.
			_, identity := kube.Source(client)
			if identity != "system:node:"+names[first] {
				t.Fatalf("identity at start %q", identity)
			}
			store := report.NewStore("boot")
			m := kube.NewMetrics(nil)
			r := kube.New(kube.Options{Client: client, NodeName: self, Identity: identity, Role: report.RoleWorker, Store: store, Details: report.NewDetails(),
				Log: log, Metrics: m, HeartbeatPeriod: time.Minute, ReportInterval: time.Minute, EventCountFlush: time.Second})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { r.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			<-r.Adopted()
			// emit sends one event and awaits its fate: an Event about
			// self with its message, or one more dropped for another node.
			emit := func(msg string) (sent bool) {
				t.Helper()
				before := m.Dropped(kube.DropAnotherNode)
				store.Emit(report.Event{Reason: "TaskHung", Message: msg, Time: time.Now()})
				for deadline := time.Now().Add(30 * time.Second); ; {
					for _, e := range nodeEvents(t, s, self) {
						if e.Message == msg {
							return true
						}
					}
					if m.Dropped(kube.DropAnotherNode) > before {
						return false
					}
					if time.Now().After(deadline) {
						t.Fatalf("the event %q neither sent nor dropped in 30 s; log:\n%s", msg, logs.String())
					}
					time.Sleep(50 * time.Millisecond) // polling the API server and the metrics for the event's fate
				}
			}
			order := []string{"self", "other", "self"}
			if first == "other" {
				order = []string{"other", "self", "other"}
			}
			for i, cred := range order {
				if i > 0 {
					swap(names[cred])
				}
				if sent := emit(fmt.Sprintf("INFO: task kubelet:%d blocked for more than 120 seconds.", i+1)); sent != (cred == "self") {
					t.Errorf("event %d with %s's credentials in use: sent %v, want %v; log:\n%s", i+1, cred, sent, cred == "self", logs.String())
				}
			}
			if d, want := m.Dropped(kube.DropAnotherNode), map[string]float64{"self": 1, "other": 2}[first]; d != want {
				t.Errorf("%v dropped for another node, want %v", d, want)
			}
			for _, said := range []string{"the credentials now name another node than node_name", "the credentials name node_name's node again"} {
				if c, want := strings.Count(logs.String(), said), 1; c != want {
					t.Errorf("%q said %d times, want %d:\n%s", said, c, want, logs.String())
				}
			}
		})
	}
}

// The kubelet rotates its client certificate as it does on a node: a new
// kubelet-client-<time>.pem (certificate and key), then the symlink
// kubelet-client-current.pem, which kubelet.conf names, swapped to it. The
// next call uses the new certificate (the old one then expires: no call
// refused). A pair read at the wrong moment (the file the symlink names
// holding the new certificate and the old key) is a warning, once, and the
// last pair stays in use; written whole, it is used from the next call.
func TestKubeletClientCertSymlinkSwappedAndHalfWritten(t *testing.T) {
	s := apiServer(t)
	node := "node-symlink-" + harness.Token()
	registerNode(t, s, node)
	user, groups := "system:node:"+node, []string{"system:nodes"}
	dir := t.TempDir()
	current := filepath.Join(dir, "kubelet-client-current.pem")
	var n int
	// swap writes kubelet-client-<n>.pem and points the symlink at it, as
	// the kubelet's certificate manager does.
	swap := func(cert, key []byte) string {
		t.Helper()
		n++
		f := filepath.Join(dir, fmt.Sprintf("kubelet-client-2026-12-06-00-00-%02d.pem", n))
		if err := os.WriteFile(f, append(append([]byte{}, cert...), key...), 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := current + ".tmp"
		os.Remove(tmp)
		if err := os.Symlink(f, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, current); err != nil {
			t.Fatal(err)
		}
		return f
	}
	issue := func(notAfter time.Time) (cert, key []byte) {
		t.Helper()
		cert, key, err := s.CA.Issue(user, groups, false, notAfter)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	expires1 := time.Now().Add(5 * time.Second)
	swap(issue(expires1))
	kc := filepath.Join(dir, "kubelet.conf")
	if err := s.WriteKubeconfig(kc, "node", current); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	client, _, err := kube.NewClient(kc, "autopilot-health-test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	store := report.NewStore("boot")
	x := startReporter(t, client, node, store)
	<-x.r.Adopted()
	set := func(st report.Status, reason report.Reason, msg string) {
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: st, Reason: reason, Message: msg}, time.Now())
		waitNode(t, s, node, msg, func(n *corev1.Node) bool {
			c := cond(n, "DiskUsageHigh")
			return c != nil && string(c.Status) == string(st) && c.Message == msg
		})
	}
	set(report.StatusFalse, "DiskUsageOK", "the first certificate")

	cert2, key2 := issue(time.Now().Add(time.Hour))
	swap(cert2, key2)
	time.Sleep(time.Until(expires1) + time.Second) // the first certificate is now expired
	set(report.StatusTrue, "FilesystemSpaceHigh", "after the swap")

	// The wrong moment: the new certificate beside the old key.
	cert3, key3 := issue(time.Now().Add(time.Hour))
	half := swap(cert3, key2)
	set(report.StatusFalse, "DiskUsageOK", "a half-written pair")
	set(report.StatusTrue, "FilesystemSpaceHigh", "a half-written pair, again")
	if err := os.WriteFile(half, append(append([]byte{}, cert3...), key3...), 0o600); err != nil {
		t.Fatal(err)
	}
	set(report.StatusFalse, "DiskUsageOK", "the pair written whole")
	if f := x.m.Failures(); f != 0 {
		t.Errorf("%v API calls failed around the rotations:\n%s", f, logs.String())
	}
	if c := strings.Count(logs.String(), "client certificate reloaded"); c != 2 {
		t.Errorf("the reload logged %d times, want 2 (the swap, the pair written whole):\n%s", c, logs.String())
	}
	if c := strings.Count(logs.String(), "cannot be used; keeping the certificate read before"); c != 1 {
		t.Errorf("the half-written pair logged %d times, want once:\n%s", c, logs.String())
	}
}

// The Node deleted and, 5 s later, registered anew by the kubelet: the
// writes that find no Node meanwhile back off (no spin), and the Node
// registered anew gets the daemon's condition back within the report
// interval (3 s here) with the transition time it had: a re-registration
// resets no "True for N s" timer.
func TestKubeNodeRegisteredAnewKeepsTheTransitionTime(t *testing.T) {
	s := apiServer(t)
	node := "node-anew-ltt-" + harness.Token()
	x := reportingEvery3s(t, s, node)
	x.store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
	first := waitNode(t, s, node, "DiskUsageHigh=True and the report", func(n *corev1.Node) bool {
		return has("DiskUsageHigh", "True", "FilesystemSpaceHigh")(n) && storageReported(n)
	})
	since := cond(first, "DiskUsageHigh").LastTransitionTime
	time.Sleep(time.Second) // a second later: a transition time written anew would show
	if err := s.Admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f0 := x.m.Failures()
	time.Sleep(5 * time.Second) // the Node away, as between a deletion and the kubelet's registration
	away := x.m.Failures() - f0
	if away > 6 {
		t.Errorf("%v failed calls in the 5 s without a Node, want the backoff's few", away)
	}
	registerNode(t, s, node)
	back := time.Now()
	n := waitNodeFor(t, s, node, 10*time.Second, "DiskUsageHigh=True on the Node registered anew", func(n *corev1.Node) bool {
		return has("DiskUsageHigh", "True", "FilesystemSpaceHigh")(n) && n.UID != first.UID
	})
	if got := cond(n, "DiskUsageHigh").LastTransitionTime; !got.Equal(&since) {
		t.Errorf("the Node registered anew has DiskUsageHigh since %v, want %v as before", got, since)
	}
	readyIntact(t, n)
	t.Logf("%v failed calls while the Node was away; the condition back %s after the registration", away, time.Since(back).Round(time.Millisecond))
}
