package kube

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
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
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// otherWrites changes the Node's condition ty as another writer would
// (kubectl patch --subresource=status, a stale controller).
func otherWrites(t *testing.T, client *fake.Clientset, ty string, change func(*corev1.NodeCondition)) {
	t.Helper()
	if err := changeOnNode(client, ty, change); err != nil {
		t.Fatal(err)
	}
}

func changeOnNode(client *fake.Clientset, ty string, change func(*corev1.NodeCondition)) error {
	nodes := corev1.SchemeGroupVersion.WithResource("nodes")
	o, err := client.Tracker().Get(nodes, "", node)
	if err != nil {
		return err
	}
	n := o.(*corev1.Node).DeepCopy()
	c := findCond(n, ty)
	if c == nil {
		return fmt.Errorf("no %s on the Node", ty)
	}
	change(c)
	return client.Tracker().Update(nodes, n, "")
}

// warnings counts the log's warnings that another writer changed a
// condition.
func warnings(logs string) int {
	n := 0
	for l := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "another writer changed a condition") {
			n++
		}
	}
	return n
}

// Another writer flips the daemon's condition True to False on the Node:
// the next report refresh's answer shows it, and the conditions are written
// again within the second, the transition time the daemon holds kept (before,
// the other writer's False stood until the heartbeat, 5 to 5.5 minutes after
// the daemon's last write). A writer that does it again at every refresh
// gets one write a refresh, no more, and one warning; a change of the
// message alone waits for the heartbeat.
func TestAnotherWritersStatusIsPutBackAtTheNextRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		wt := &writeTimes{Client: kubefake.New(client)}
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		h := startOpts(t, client, store, report.NewDetails(), &logs, func(o *Options) { o.Client = wt })
		<-h.r.Adopted()
		// Its transition time with nanoseconds, on the Node to the second.
		store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHung", Message: "task kubelet blocked"},
			time.Now().Add(-500*time.Millisecond))
		time.Sleep(time.Second)
		synctest.Wait()
		want := *findCond(h.node(t), "KernelDeadlock")
		if want.Status != corev1.ConditionTrue {
			t.Fatalf("not written: %+v", want)
		}
		wt.mu.Lock()
		mark := len(wt.writes)
		wt.mu.Unlock()
		otherWrites(t, client, "KernelDeadlock", func(c *corev1.NodeCondition) { c.Status = corev1.ConditionFalse })
		time.Sleep(2 * time.Minute) // the next report refresh
		synctest.Wait()
		c := findCond(h.node(t), "KernelDeadlock")
		if c.Status != want.Status || c.Reason != want.Reason || !c.LastTransitionTime.Equal(&want.LastTransitionTime) {
			t.Fatalf("after the next report refresh: %+v, want the daemon's %+v", c, want)
		}
		wt.mu.Lock()
		var refresh, status time.Time
		for _, w := range wt.writes[mark:] {
			if !w.status && refresh.IsZero() {
				refresh = w.at
			}
			if w.status && status.IsZero() {
				status = w.at
			}
		}
		wt.mu.Unlock()
		if refresh.IsZero() || status.IsZero() || status.Before(refresh) || status.Sub(refresh) > time.Second {
			t.Errorf("refresh answered at %v, conditions written at %v: want within a second after it", refresh, status)
		}

		// A writer at every refresh: one write of the conditions a refresh.
		client.ClearActions()
		for range 10 {
			otherWrites(t, client, "KernelDeadlock", func(c *corev1.NodeCondition) { c.Status, c.Reason = corev1.ConditionFalse, "Stale" })
			time.Sleep(2 * time.Minute)
			synctest.Wait()
		}
		acts := countActions(client)
		if acts["patch nodes/status"] != 10 || acts["patch nodes"] != 10 {
			t.Errorf("a writer at every refresh for 10 refreshes: %v; want 10 of each", acts)
		}
		if c := findCond(h.node(t), "KernelDeadlock"); c.Status != want.Status || !c.LastTransitionTime.Equal(&want.LastTransitionTime) {
			t.Errorf("after the fight: %+v", c)
		}
		if n := h.m.Overwrites(); n != 11 {
			t.Errorf("%v overwrites counted, want 11", n)
		}
		if n := warnings(logs.String()); n != 2 {
			t.Errorf("%d warnings, want 2 (the first writer's False, then the one at every refresh):\n%s", n, logs.String())
		}

		client.ClearActions()
		otherWrites(t, client, "KernelDeadlock", func(c *corev1.NodeCondition) { c.Message = "someone else's words" })
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if n := countActions(client)["patch nodes/status"]; n != 0 || findCond(h.node(t), "KernelDeadlock").Message != "someone else's words" {
			t.Errorf("another writer's message alone: %d writes; want it left until the heartbeat", n)
		}
		h.stop()
	})
}

// The comparison of a report write's answer with what the daemon wrote.
func TestNodeAnsweredTellsAnotherWriter(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 500_000_000, time.UTC) // written with its nanoseconds, on the Node to the second
	disk := report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%", LastTransitionTime: at}
	tamper := report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: "ProtectedFileChanged", Message: "/var/x changed", LastTransitionTime: at}
	onNode := func(c report.Condition) kubeapi.NodeCondition {
		return kubeapi.NodeCondition{Type: c.Type, Status: string(c.Status), Reason: string(c.Reason), Message: c.Message,
			LastTransitionTime: metav1.NewTime(c.LastTransitionTime.Truncate(time.Second))}
	}
	for _, tc := range []struct {
		name   string
		change func(*kubeapi.NodeCondition)
		// race: what the daemon's own status writes did while the report
		// write was on its way: "" nothing, "inflight" one was on its way
		// when it was sent, "since" one was sent after it.
		race string
		want bool
	}{
		{"as written", nil, "", false},
		{"another status", func(c *kubeapi.NodeCondition) { c.Status = "False" }, "", true},
		{"another reason", func(c *kubeapi.NodeCondition) { c.Reason = "Stale" }, "", true},
		{"another transition time", func(c *kubeapi.NodeCondition) {
			c.LastTransitionTime = metav1.NewTime(at.Truncate(time.Second).Add(-time.Second))
		}, "", true},
		{"another message", func(c *kubeapi.NodeCondition) {
			if c.Type == "DiskUsageHigh" {
				c.Message = "someone else's"
			}
		}, "", false},
		{"another message of a condition held forever", func(c *kubeapi.NodeCondition) {
			if c.Type == "NodeTampered" {
				c.Message = "nothing to see"
			}
		}, "", true},
		{"another writer's own condition changed", nil, "", false},
		{"another status, a status write on its way when it was sent", func(c *kubeapi.NodeCondition) { c.Status = "False" }, "inflight", false},
		{"another status, a status write sent since", func(c *kubeapi.NodeCondition) { c.Status = "False" }, "since", false},
	} {
		r := New(Options{Store: report.NewStore("b"), Log: testLog(t)})
		r.nodeUID, r.nodeTypes = "uid-1", []string{disk.Type, tamper.Type}
		r.nodeConds = map[string]report.Condition{disk.Type: disk, tamper.Type: tamper}
		if tc.race == "inflight" {
			r.statusSent++
		}
		sent := r.sentBefore()
		if tc.race == "since" {
			r.statusSent++
		}
		r.wroteOnce()
		n := &kubeapi.Node{}
		n.Metadata.UID = "uid-1"
		n.Status.Conditions = []kubeapi.NodeCondition{{Type: "Ready", Status: "True"}, onNode(disk), onNode(tamper),
			{Type: "SomeoneElses", Status: "True", Reason: "Whatever"}}
		if tc.change != nil {
			for i := range n.Status.Conditions[1:3] {
				tc.change(&n.Status.Conditions[1+i])
			}
		} else if strings.HasPrefix(tc.name, "another writer's") {
			n.Status.Conditions[3].Status = "False"
		}
		if r.nodeAnswered(n, sent) {
			t.Errorf("%s: taken for a Node registered anew", tc.name)
		}
		if asked := len(r.rewrite) == 1; asked != tc.want {
			t.Errorf("%s: conditions written again %v, want %v", tc.name, asked, tc.want)
		}
		if !isClosed(r.writtenCh()) {
			t.Errorf("%s: the report waits for the conditions", tc.name)
		}
	}
}

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// holdWrite is a client whose next report write, once armed, is held until
// release is closed, before it lands on the Node (before) or after, its
// answer held: a status write of the daemon's own lands meanwhile.
type holdWrite struct {
	Client
	before  bool
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (c *holdWrite) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	hold := c.armed.CompareAndSwap(true, false)
	if hold && c.before {
		close(c.held)
		<-c.release
	}
	n, err := c.Client.PatchNode(ctx, name, patch)
	if hold && !c.before {
		close(c.held)
		<-c.release
	}
	return n, err
}

// A change of the daemon's own written while a report write is on its way:
// whether it landed before the report write (whose answer shows it, where
// the daemon's last write before the report write's did not) or after (the
// answer shows the condition before the change, where the daemon's last
// write now does not), the answer is no other writer's: no second write,
// nothing counted.
func TestOwnStatusWriteDuringARefreshIsNoOverwrite(t *testing.T) {
	for _, before := range []bool{false, true} {
		t.Run(fmt.Sprintf("before=%v", before), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(kubeletNode())
				hc := &holdWrite{Client: kubefake.New(client), before: before, held: make(chan struct{}), release: make(chan struct{})}
				store := report.NewStore("b")
				h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = hc })
				defer h.stop()
				<-h.r.Adopted()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
				time.Sleep(time.Second)
				synctest.Wait()
				hc.armed.Store(true)
				<-hc.held // the next refresh is on its way
				client.ClearActions()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
				time.Sleep(time.Second)
				synctest.Wait()
				close(hc.release)
				time.Sleep(time.Minute)
				synctest.Wait()
				if n := countActions(client)["patch nodes/status"]; n != 1 || h.m.Overwrites() != 0 {
					t.Errorf("%d status writes, %v overwrites counted; want the change's 1 and none", n, h.m.Overwrites())
				}
				if c := findCond(h.node(t), "DiskUsageHigh"); c.Status != corev1.ConditionFalse {
					t.Errorf("on the Node: %+v", c)
				}
			})
		})
	}
}

// mutating is a client whose status writes something in the write's path
// changes (a mutating admission webhook): the condition's reason is not
// what the daemon wrote, in the write's own answer and on the Node.
type mutating struct {
	Client
	client *fake.Clientset
	mu     sync.Mutex
	writes int
}

func (c *mutating) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c.mu.Lock()
	c.writes++
	loop := c.writes > 1000
	c.mu.Unlock()
	if n, err := c.Client.PatchNodeStatus(ctx, name, patch); err != nil || loop {
		return n, err
	}
	if err := changeOnNode(c.client, "DiskUsageHigh", func(c *corev1.NodeCondition) { c.Reason = "Mutated" }); err != nil {
		return nil, err
	}
	return c.Client.GetNode(ctx, name)
}

// Something in the write's path changes the daemon's condition at each
// write: a write that answers with it is counted and logged, not written
// again at once (that would change it back and forth without end); the
// report refresh has it written again, once a refresh.
func TestConditionChangedInTheWritesPathIsNoLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		mc := &mutating{Client: kubefake.New(client), client: client}
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		h := startOpts(t, client, store, report.NewDetails(), &logs, func(o *Options) { o.Client = mc })
		<-h.r.Adopted()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
		// The change's write, and the first refresh, which comes before
		// it or after it (then it has the conditions written again).
		time.Sleep(time.Second)
		synctest.Wait()
		mc.mu.Lock()
		first := mc.writes
		mc.mu.Unlock()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		h.stop()
		mc.mu.Lock()
		writes := mc.writes - first
		mc.mu.Unlock()
		// One at each of the 5 refreshes.
		if writes != 5 {
			t.Errorf("%d status writes in 10 minutes, want 5: one a report refresh", writes)
		}
		if n := warnings(logs.String()); n != 1 {
			t.Errorf("%d warnings, want 1:\n%s", n, logs.String())
		}
	})
}

// landsThenTimesOut is a client whose armed status writes land on the Node
// and get no answer in time (the API server was slow to answer, the
// connection reset after the write): the first lands, later ones are
// refused before they reach it.
type landsThenTimesOut struct {
	Client
	mu     sync.Mutex
	armed  bool
	landed int
}

func (c *landsThenTimesOut) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	c.mu.Lock()
	armed, landed := c.armed, c.landed
	if armed {
		c.landed++
	}
	c.mu.Unlock()
	if !armed {
		return c.Client.PatchNodeStatus(ctx, name, patch)
	}
	if landed == 0 {
		if _, err := c.Client.PatchNodeStatus(ctx, name, patch); err != nil {
			return nil, err
		}
		return nil, &url.Error{Op: "Patch", URL: "https://10.0.0.1:6443/", Err: context.DeadlineExceeded}
	}
	return nil, &url.Error{Op: "Patch", URL: "https://10.0.0.1:6443/",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
}

// A status write of the daemon's own that got no answer may have landed:
// the next report refresh that finds its change on the Node has found no
// other writer. Before, it counted an overwrite and warned that another
// writer changed the condition.
func TestOwnWriteWithoutAnAnswerIsNoOtherWriter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		c := &landsThenTimesOut{Client: kubefake.New(client)}
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		h := startOpts(t, client, store, report.NewDetails(), &logs, func(o *Options) { o.Client = c })
		<-h.r.Adopted()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		c.mu.Lock()
		c.armed = true
		c.mu.Unlock()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
		time.Sleep(3 * time.Minute) // a report refresh or two while the writes fail
		synctest.Wait()
		h.stop()
		if cond := findCond(h.node(t), "DiskUsageHigh"); cond.Status != corev1.ConditionTrue {
			t.Fatalf("the write without an answer did not land: %+v", cond)
		}
		if n := h.m.Overwrites(); n != 0 || warnings(logs.String()) != 0 {
			t.Errorf("%v overwrites counted, %d warnings; want none: the change on the Node is the daemon's own\n%s", n, warnings(logs.String()), logs.String())
		}
	})
}

// Another writer that changes a condition again after the daemon's put-back
// had stood (refreshes found the Node as written) is a new change: the
// journal warns again. Before, the warning was keyed by what the daemon wrote
// and what the Node showed alone, and the same overwrite a day later (an
// operator's second kubectl patch) went unlogged, counted only.
func TestAnotherWritersSameChangeLaterIsWarnedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		var logs testenv.SyncBuffer
		h := startOpts(t, client, store, report.NewDetails(), &logs, nil)
		defer h.stop()
		<-h.r.Adopted()
		store.Set(report.Condition{Type: "KernelDeadlock", Status: report.StatusTrue, Reason: "CriticalTaskHung", Message: "task kubelet blocked"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		for i := range 2 {
			otherWrites(t, client, "KernelDeadlock", func(c *corev1.NodeCondition) { c.Status = corev1.ConditionFalse })
			time.Sleep(2 * time.Minute) // the next refresh puts it back
			synctest.Wait()
			if c := findCond(h.node(t), "KernelDeadlock"); c.Status != corev1.ConditionTrue {
				t.Fatalf("overwrite %d not put back: %+v", i+1, c)
			}
			if n := warnings(logs.String()); n != i+1 {
				t.Errorf("after overwrite %d: %d warnings, want %d\n%s", i+1, n, i+1, logs.String())
			}
			time.Sleep(time.Hour) // the put-back stands, refresh after refresh
			synctest.Wait()
		}
		if n := h.m.Overwrites(); n != 2 {
			t.Errorf("%v overwrites counted, want 2", n)
		}
	})
}

// The daemon's condition types on the Node as another writer leaves them,
// each put right at the next report refresh, counted and logged as an
// overwrite once per change: one of its conditions removed from the Node
// (its UID the same: no Node registered anew, as the journal said before),
// a type it does not evaluate here added (it stood for good before), and a
// second entry of one of its types appended (a strategic merge patch
// merges into the first alone: before, the other writer's entry stood and
// every refresh had the conditions written again, counted and warned, for
// good).
func TestAnotherWritersRemovalAdditionAndDuplicateArePutRight(t *testing.T) {
	for _, tc := range []struct {
		name, warning string
		do            func(n *corev1.Node)
		ok            func(n *corev1.Node) bool
	}{
		{"removed", "another writer removed a condition of the daemon's from the Node", func(n *corev1.Node) {
			n.Status.Conditions = slices.DeleteFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == "DiskUsageHigh" })
		}, func(n *corev1.Node) bool { return entries(n, "DiskUsageHigh") == 1 }},
		{"not evaluated here, added", "another writer added a condition of the daemon's that it does not evaluate on this node", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "GpuFallenOffBus", Status: corev1.ConditionTrue, Reason: "GPUFellOffTheBus"})
		}, func(n *corev1.Node) bool { return entries(n, "GpuFallenOffBus") == 0 }},
		{"duplicated", "another writer added a second entry of a condition of the daemon's", func(n *corev1.Node) {
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "DiskUsageHigh", Status: corev1.ConditionFalse, Reason: "Stale"})
		}, func(n *corev1.Node) bool {
			c := findCond(n, "DiskUsageHigh")
			return entries(n, "DiskUsageHigh") == 1 && c.Status == corev1.ConditionTrue
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kn := kubeletNode()
				kn.UID = "uid-1"
				client := fake.NewClientset(kn)
				store := report.NewStore("b")
				var logs testenv.SyncBuffer
				h := startOpts(t, client, store, report.NewDetails(), &logs, func(o *Options) {
					o.Evaluated = func(ty string) bool { return ty != "GpuFallenOffBus" }
				})
				defer h.stop()
				<-h.r.Adopted()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
				time.Sleep(time.Second)
				synctest.Wait()
				for round := range 2 {
					n := h.node(t)
					tc.do(n)
					if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
						t.Fatal(err)
					}
					time.Sleep(2 * time.Minute) // the next report refresh
					synctest.Wait()
					if n := h.node(t); !tc.ok(n) || findCond(n, "SomeoneElses") == nil || findCond(n, "Ready") == nil {
						t.Fatalf("round %d: not put right at the next refresh: %+v", round+1, n.Status.Conditions)
					}
					time.Sleep(time.Hour) // it stands, refresh after refresh
					synctest.Wait()
				}
				client.ClearActions()
				time.Sleep(30 * time.Minute)
				synctest.Wait()
				if n := countActions(client)["patch nodes/status"]; n > 8 {
					t.Errorf("%d status writes in 30 minutes after, want the heartbeats' alone", n)
				}
				out := logs.String()
				if o := h.m.Overwrites(); o != 2 {
					t.Errorf("%v overwrites counted, want 2 (one a round)\n%s", o, out)
				}
				if k := strings.Count(out, tc.warning); k != 2 || strings.Count(out, "level=WARN") != 2 {
					t.Errorf("%d warnings %q, want 2 and no others:\n%s", k, tc.warning, out)
				}
				if strings.Contains(out, "registered anew") {
					t.Errorf("taken for a Node registered anew:\n%s", out)
				}
			})
		})
	}
}

func entries(n *corev1.Node, ty string) int {
	k := 0
	for _, c := range n.Status.Conditions {
		if string(c.Type) == ty {
			k++
		}
	}
	return k
}

// The write that puts a duplicate right (every entry of the type deleted,
// the daemon's written after) answered 429 or 409: nothing changed on the
// Node, and the retry still carries the delete directive, so the
// duplicate goes with it; the write that took it off carries it no more.
func TestDuplicateEntryPutRightAfterARefusedWrite(t *testing.T) {
	for _, refusal := range []error{
		apierrors.NewTooManyRequests("slow down", 1),
		apierrors.NewConflict(corev1.Resource("nodes"), "n", fmt.Errorf("the object has been modified")),
	} {
		t.Run(string(apierrors.ReasonForError(refusal)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				kn := kubeletNode()
				kn.UID = "uid-1"
				client := fake.NewClientset(kn)
				var refused, directives atomic.Int32
				client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					p, ok := a.(k8stesting.PatchAction)
					if !ok || a.GetSubresource() != "status" || !strings.Contains(string(p.GetPatch()), `"$patch":"delete"`) {
						return false, nil, nil
					}
					directives.Add(1)
					if refused.Add(1) == 1 {
						return true, nil, refusal
					}
					return false, nil, nil
				})
				store := report.NewStore("b")
				var logs testenv.SyncBuffer
				h := startOpts(t, client, store, report.NewDetails(), &logs, nil)
				defer h.stop()
				<-h.r.Adopted()
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
				time.Sleep(time.Second)
				synctest.Wait()
				n := h.node(t)
				n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "DiskUsageHigh", Status: corev1.ConditionFalse, Reason: "Stale"})
				if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Minute) // the next report refresh, its write refused
				synctest.Wait()
				if refused.Load() < 1 {
					t.Fatalf("no write with the delete directive in the refresh after the duplicate: %+v", h.node(t).Status.Conditions)
				}
				time.Sleep(30 * time.Second) // the retry, before the next refresh
				synctest.Wait()
				n = h.node(t)
				if c := findCond(n, "DiskUsageHigh"); entries(n, "DiskUsageHigh") != 1 || c.Status != corev1.ConditionTrue || findCond(n, "SomeoneElses") == nil || findCond(n, "Ready") == nil {
					t.Fatalf("after the refused write and its retry: %+v", n.Status.Conditions)
				}
				time.Sleep(10 * time.Minute)
				synctest.Wait()
				if d := directives.Load(); d != 2 {
					t.Errorf("%d status writes with the delete directive, want 2 (the refused one, its retry)\n%s", d, logs.String())
				}
				if o := h.m.Overwrites(); o != 1 {
					t.Errorf("%v overwrites counted, want 1\n%s", o, logs.String())
				}
			})
		})
	}
}
