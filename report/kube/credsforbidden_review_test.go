package kube

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// forbiddenWrites is a client whose Node writes the API server refuses
// with 403 (the Node authorizer's answer to a node_name that is not the
// credentials' node), whose reads pass, and whose credentials' files never
// change; it counts the looks at them (credentialsChanged) and keeps their
// times.
type forbiddenWrites struct {
	Client
	looks, calls atomic.Int64
	mu           sync.Mutex
	at           []time.Time
}

func (f *forbiddenWrites) credentialsChanged() bool {
	f.looks.Add(1)
	f.mu.Lock()
	f.at = append(f.at, time.Now())
	f.mu.Unlock()
	return false
}

func (f *forbiddenWrites) refuse() error {
	f.calls.Add(1)
	return apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, node, errors.New("node \"other\" is not allowed to modify node \""+node+"\""))
}

func (f *forbiddenWrites) PatchNodeStatus(context.Context, string, []byte) (*kubeapi.Node, error) {
	return nil, f.refuse()
}

func (f *forbiddenWrites) PatchNode(context.Context, string, []byte) (*kubeapi.Node, error) {
	return nil, f.refuse()
}

// A node_name that is not the credentials' node: every write is refused
// (403) for hours. The journal has a line about it at error level,
// asking whether node_name is this node's own, the conditions' writer's
// (the report waits for this boot's conditions on the Node, and never
// writes); the writes are the backoff's (30 to 60 s apart); and credsLoop looks
// at the credentials' files once a second for the first 5 minutes
// (credsFast), then 2, 4 and 8 s apart, then every 10 s at the points of
// the daemon's grid (here anchored 3 s off the failure's start, so that a
// look 10 s after the one before would miss them): 1,352 looks in 3 h.
// Fails with the pace kept at credsPoll (10,799 looks), and with the grid
// left out (looks 4 s past the grid's points).
func TestReviewForbiddenForHours(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeletNode())
		c := &forbiddenWrites{Client: kubefake.New(cs)}
		logs := &testenv.SyncBuffer{}
		store := report.NewStore("b")
		// A condition in the store before the reporter starts, as the
		// daemon's are (each check's Unknown at its start): the first
		// status write carries it and is refused, so the report, which
		// waits for this boot's conditions on the Node, never writes.
		// Before, it was set after the adoption, and where the status
		// loop's first write came before it (nothing to write: the
		// conditions counted written) the report wrote too, a second
		// line; under -race the other order came (CI run 87).
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
		anchor := time.Now().Add(-3 * time.Second)
		h := startOpts(t, cs, store, report.NewDetails(), logs, func(o *Options) { o.Client = c; o.Grid = tick.New(anchor) })
		<-h.r.Adopted()
		start := time.Now()
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		h.stop()
		out := logs.String()
		lines := strings.Count(out, "\n")
		t.Logf("3 h of 403: %d looks at the files, %d calls, %d log lines:\n%s", c.looks.Load(), c.calls.Load(), lines, out)
		// One line, the conditions' writer's; the report's never wrote.
		if n := strings.Count(out, "refused by the API server: the credentials do not allow it (is node_name this node's own name?)"); n != 1 {
			t.Errorf("%d lines about the 403, want 1 (the conditions' writer; the report waits for them)", n)
		}
		if strings.Contains(out, "writing the report annotations") {
			t.Errorf("the report was written before this boot's conditions were on the Node:\n%s", out)
		}
		// One writer, retrying 30 to 60 s apart at the backoff's top (its
		// last write at the stop one more).
		if n := c.calls.Load(); n < 3*60 || n > 3*120+20 {
			t.Errorf("%d calls in 3 h: want the backoff's, 30 to 60 s apart", n)
		}
		// 300 in the first 5 minutes, 3 on the way to 10 s, then one
		// every 10 s: 1,048 in the 2 h 54 min 36 s left.
		if n := c.looks.Load(); n < 1340 || n > 1360 {
			t.Errorf("%d looks in 3 h: want one a second for %s, then one every %s (1,352)", n, credsFast, credsPollMax)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		fast, off := 0, 0
		for i, at := range c.at {
			since := at.Sub(start)
			if since <= credsFast {
				fast++
			}
			if i > 0 && since > credsFast+15*time.Second {
				if d := at.Sub(c.at[i-1]); d > credsPollMax {
					t.Errorf("look %d %s after the one before: want at most %s", i, d, credsPollMax)
				}
				if at.Sub(anchor)%credsPollMax != 0 {
					off++
				}
			}
		}
		if fast < 295 || fast > 301 {
			t.Errorf("%d looks in the first %s: want one a second", fast, credsFast)
		}
		if off > 0 {
			t.Errorf("%d of the looks at the 10 s pace off the grid's points", off)
		}
	})
}
