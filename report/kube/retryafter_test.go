package kube

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/internal/backoff"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// A write the API server answered with a 429 whose Retry-After asks for a
// minute waits out that minute, also when the probe notices the API
// server's return meanwhile (apiBack): another writer's call went
// unanswered (its port refused), and that writer's backoff, an outage's,
// still ends at once (within 2 s of the return). Before, the return ended
// every writer's wait, the one the server asked for too: the Events (as
// the status write, the report write and the first read of the Node) were
// sent again seconds after the 429, into the priority and fairness that
// had asked for a minute.
func TestRetryAfterOutlastsTheAPIServersReturn(t *testing.T) {
	type call struct{ verb, resource, sub string }
	is := func(a k8stesting.Action, c call) bool {
		return a.GetVerb() == c.verb && a.GetResource().Resource == c.resource && a.GetSubresource() == c.sub
	}
	createEvent := call{"create", "events", ""}
	patchStatus := call{"patch", "nodes", "status"}
	for _, tc := range []struct {
		name string
		// asked: the call answered 429 (Retry-After: 60); outage: the call
		// whose port refuses, until the API server's return.
		asked, outage call
	}{
		{"events", createEvent, patchStatus},
		{"conditions", patchStatus, createEvent},
		{"report", call{"patch", "nodes", ""}, createEvent},
		{"first read of the Node", call{"get", "nodes", ""}, createEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(kubeletNode())
				var mu sync.Mutex
				// dialled: the probe's dial went through after the return; the
				// refused call fails until then, so that the return is the
				// probe's to notice, not the refused writer's own retry's.
				asking, down, wasDown, dialled := tc.asked.verb == "get", false, false, false
				var asked []time.Time    // the asked call's tries while it is answered 429
				var outageBack time.Time // when the refused call first went through after the return
				client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
					mu.Lock()
					defer mu.Unlock()
					switch {
					case asking && is(a, tc.asked):
						asked = append(asked, time.Now())
						return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
					case (down || wasDown && !dialled) && is(a, tc.outage):
						wasDown = true
						return true, nil, &url.Error{Op: "Post", URL: "https://10.0.0.1:6443/",
							Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
					case wasDown && is(a, tc.outage) && outageBack.IsZero():
						outageBack = time.Now()
					}
					return false, nil, nil
				})
				store := report.NewStore("b")
				h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) {
					o.Dial = func(context.Context) error {
						mu.Lock()
						defer mu.Unlock()
						if down {
							return errors.New("connection refused")
						}
						dialled = true
						return nil
					}
				})
				defer h.stop()
				if tc.asked.verb != "get" {
					<-h.r.Adopted()
					time.Sleep(time.Second)
					synctest.Wait() // the first status and report writes done
				}
				mu.Lock()
				asking, down = true, true
				mu.Unlock()
				// Both calls: the Event's create and a condition's write.
				store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
				store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "/var 95%"}, time.Now())
				if tc.name == "report" {
					// The report's next refresh is due in 2 minutes: the
					// wait for it is not a retry's.
					time.Sleep(2 * time.Minute)
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				mu.Lock()
				if len(asked) == 0 {
					mu.Unlock()
					t.Fatal("the call to be answered 429 was not made")
				}
				first := asked[0]
				down = false
				back := time.Now()
				mu.Unlock()
				time.Sleep(first.Add(59 * time.Second).Sub(time.Now()))
				synctest.Wait()
				mu.Lock()
				if len(asked) != 1 {
					t.Errorf("%s tried %d times in the minute its 429's Retry-After asked to wait (at %v after it), want once",
						tc.asked, len(asked), since(asked, first))
				}
				if outageBack.IsZero() || outageBack.Sub(back) > 2*time.Second {
					t.Errorf("%s, refused until the API server's return, went through %v after it, want within 2 s", tc.outage, outageBack.Sub(back))
				}
				asking = false
				mu.Unlock()
			})
		})
	}
}

func since(ts []time.Time, t0 time.Time) []time.Duration {
	var out []time.Duration
	for _, t := range ts {
		out = append(out, t.Sub(t0))
	}
	return out
}

// The Node registered anew while the status write waits out a 429's
// Retry-After of a minute: the report write, refused for the old Node's UID,
// has the conditions written again (rewrite), at the end of that minute, not
// at once into the 429. Before, the rewrite ended the wait the API server
// had asked for as it ends a backoff.
func TestRetryAfterOutlastsARewrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.UID = "uid-0"
		client := fake.NewClientset(n)
		var mu sync.Mutex
		asking := false
		var asked []time.Time
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if !asking || a.GetSubresource() != "status" {
				return false, nil, nil
			}
			asked = append(asked, time.Now())
			return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
		})
		wt := &writeTimes{Client: kubefake.New(client)}
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = wt })
		defer h.stop()
		<-h.r.Adopted()
		start := time.Now()
		time.Sleep(time.Second)
		synctest.Wait()
		if h.node(t).Annotations["autopilot.syself.com/storage"] == "" {
			t.Fatal("no report on the Node a second after the start")
		}
		// The next report write is due 2 minutes after the start: the
		// Node changes, and the status write is answered 429, just before.
		time.Sleep(time.Until(start.Add(110 * time.Second)))
		mu.Lock()
		asking = true
		mu.Unlock()
		nodes := corev1.SchemeGroupVersion.WithResource("nodes")
		if err := client.Tracker().Delete(nodes, "", node); err != nil {
			t.Fatal(err)
		}
		n = kubeletNode()
		n.UID = "uid-1"
		if err := client.Tracker().Add(n); err != nil {
			t.Fatal(err)
		}
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"}, time.Now())
		time.Sleep(5 * time.Second)
		synctest.Wait()
		mu.Lock()
		if len(asked) == 0 {
			mu.Unlock()
			t.Fatal("the status write was not answered 429")
		}
		first := asked[0]
		mu.Unlock()
		time.Sleep(time.Until(first.Add(59 * time.Second)))
		synctest.Wait()
		wt.mu.Lock()
		refused := false
		for _, w := range wt.writes {
			refused = refused || !w.status && w.err != nil && uidRefused(w.err) && w.at.After(first)
		}
		wt.mu.Unlock()
		if !refused {
			t.Fatal("no report write refused for the old UID in the minute after the 429")
		}
		mu.Lock()
		if len(asked) != 1 {
			t.Errorf("the status write tried %d times in the minute its 429's Retry-After asked to wait (at %v after it), want once",
				len(asked), since(asked, first))
		}
		asking = false
		mu.Unlock()
		time.Sleep(time.Minute)
		synctest.Wait()
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("a minute after the Retry-After: DiskUsageHigh %+v on the Node registered anew, want True", c)
		}
	})
}

// A report refresh that carries the heartbeat (one nodes/status patch)
// answered with a 429 whose Retry-After asks for a minute: that answer is to
// the status writer's own write, and its next write (a change, the
// heartbeat) waits the minute out, as after a 429 to a change's write.
// Before, the status loop took no note of it: a change that came a second
// later was written at once, into the 429.
func TestFoldedRefreshsRetryAfterHoldsTheConditions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		var asked time.Time // when the folded write was answered 429
		var after []time.Time
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			p := a.(k8stesting.PatchAction)
			if p.GetSubresource() != "status" {
				return false, nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case asked.IsZero() && strings.Contains(string(p.GetPatch()), `"annotations"`):
				asked = time.Now()
				return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
			case !asked.IsZero():
				after = append(after, time.Now())
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, nil)
		defer h.stop()
		<-h.r.Adopted()
		for {
			time.Sleep(time.Second)
			synctest.Wait()
			mu.Lock()
			at := asked
			mu.Unlock()
			if !at.IsZero() {
				break
			}
		}
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
		mu.Lock()
		at := asked
		mu.Unlock()
		time.Sleep(time.Until(at.Add(59 * time.Second)))
		synctest.Wait()
		mu.Lock()
		if len(after) != 0 {
			t.Errorf("status writes %v after the folded refresh's 429 asked for a minute; want none before it ends", since(after, at))
		}
		mu.Unlock()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("the change not on the Node once the minute ended: %+v", c)
		}
	})
}

// What the API server asks a retry to wait (retryWait): a Retry-After of 0
// asks nothing (the backoff alone), as does a negative one; a 504's
// ServerTimeout of 0 asks for none left; one past the minute waits the
// minute (backoffMax), asked for as long. Never a wait shorter than the
// backoff, never one past the minute.
func TestRetryWaitAskedBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		timeout := func(secs int32) error {
			e := apierrors.NewServerTimeout(corev1.Resource("nodes"), "patch", 0)
			e.ErrStatus.Details.RetryAfterSeconds = secs
			return e
		}
		for _, tc := range []struct {
			name  string
			err   error
			wait  time.Duration // 0: the backoff's
			none  bool          // nothing asked
			asked time.Duration // else asked for this long from now
		}{
			{"429 of 0", apierrors.NewTooManyRequests("slow down", 0), 0, true, 0},
			{"429 of 10", apierrors.NewTooManyRequests("slow down", 10), 10 * time.Second, false, 10 * time.Second},
			{"429 of int32's largest", apierrors.NewTooManyRequests("slow down", math.MaxInt32), time.Minute, false, time.Minute},
			{"504 of 0", timeout(0), 0, false, 0},
			{"504 of -5", timeout(-5), 0, false, -5 * time.Second},
			{"refused", errors.New("connection refused"), 0, true, 0},
		} {
			bo := backoff.Backoff{Min: backoffMin, Max: backoffMax}
			wait, asked := retryWait(&bo, tc.err)
			switch {
			case tc.wait == 0 && (wait < backoffMin/2 || wait > 2*backoffMin):
				t.Errorf("%s: wait %v, want the backoff's first", tc.name, wait)
			case tc.wait != 0 && wait != tc.wait:
				t.Errorf("%s: wait %v, want %v", tc.name, wait, tc.wait)
			}
			if tc.none {
				if !asked.IsZero() {
					t.Errorf("%s: asked until %v, want none", tc.name, asked)
				}
			} else if got := asked.Sub(time.Now()); got != tc.asked {
				t.Errorf("%s: asked for %v, want %v", tc.name, got, tc.asked)
			}
			if left := afterBack(asked); left < 0 || left > backoffMax {
				t.Errorf("%s: %v left after the API server's return", tc.name, left)
			}
		}
	})
}

// SIGTERM while the status write waits out a 429's minute: the last change
// still gets its one short attempt at once (finalWrite), not after the
// minute, and the stop does not wait for it.
func TestShutdownDuringARetryAfterWritesTheLastChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		var writes []time.Time
		asking := true
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "status" {
				return false, nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			writes = append(writes, time.Now())
			if asking {
				asking = false
				return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, nil)
		<-h.r.Adopted()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
		time.Sleep(5 * time.Second)
		synctest.Wait()
		stopAt := time.Now()
		h.stop()
		mu.Lock()
		defer mu.Unlock()
		if len(writes) != 2 || writes[1].Sub(stopAt) > time.Second {
			t.Errorf("status writes at %v after the stop: want the 429's and the last change's at once", since(writes, stopAt))
		}
		if time.Since(stopAt) > finalWriteTimeout {
			t.Errorf("the stop took %v", time.Since(stopAt))
		}
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("the last change not on the Node: %+v", c)
		}
	})
}

// The probe flapping (the API server's port refusing and accepting every
// other second while the Events' creates go unanswered: apiBack every 2 s)
// does not end a 429's minute for the conditions: one try in the minute,
// the next once it ends.
func TestRetryAfterOutlastsAFlappingProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		var tries []time.Time
		client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case a.GetVerb() == "create" && a.GetResource().Resource == "events":
				return true, nil, &url.Error{Op: "Post", URL: "https://10.0.0.1:6443/",
					Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
			case a.GetVerb() == "patch" && a.GetSubresource() == "status":
				tries = append(tries, time.Now())
				if len(tries) == 2 { // the change's first write
					return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
				}
			}
			return false, nil, nil
		})
		var dials atomic.Int32
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK"}, time.Now())
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) {
			o.Dial = func(context.Context) error {
				if dials.Add(1)%2 == 1 {
					return errors.New("connection refused")
				}
				return nil
			}
		})
		defer h.stop()
		<-h.r.Adopted()
		time.Sleep(time.Second)
		synctest.Wait()
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh"}, time.Now())
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		if len(tries) != 2 {
			mu.Unlock()
			t.Fatalf("status writes %d, want the first and the change's", len(tries))
		}
		asked := tries[1]
		mu.Unlock()
		time.Sleep(time.Until(asked.Add(59 * time.Second)))
		synctest.Wait()
		mu.Lock()
		n := len(tries)
		mu.Unlock()
		if d := dials.Load(); d < 40 {
			t.Fatalf("the probe dialled %d times in the minute: not flapping", d)
		}
		if n != 2 {
			t.Errorf("%d status writes in the 429's minute with the probe flapping (%v after it), want 1", n-1, since(tries[1:], asked))
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if c := findCond(h.node(t), "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("the change not on the Node after the minute: %+v", c)
		}
	})
}
