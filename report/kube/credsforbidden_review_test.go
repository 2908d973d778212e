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

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// forbiddenWrites is a client whose Node writes the API server refuses
// with 403 (the Node authorizer's answer to a node_name that is not the
// credentials' node), whose reads pass, and whose credentials' files never
// change; it counts the looks at them (credentialsChanged).
type forbiddenWrites struct {
	Client
	looks, calls atomic.Int64
}

func (f *forbiddenWrites) credentialsChanged() bool { f.looks.Add(1); return false }

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

type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// A node_name that is not the credentials' node: every write is refused
// (403) for hours. The journal has a line about it at error level,
// asking whether node_name is this node's own, one per writer; the writes
// are the backoff's (30 to 60 s apart: 484 in 3 h); and
// credsLoop looks at the credentials' files once a second all along (3
// hours: about 10,800 looks), which the README says it does while calls
// fail for the credentials. Review: holds; the looks are not bounded in
// time.
func TestReviewForbiddenForHours(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeletNode())
		c := &forbiddenWrites{Client: kubefake.New(cs)}
		logs := &lockedLog{}
		store := report.NewStore("b")
		h := startOpts(t, cs, store, report.NewDetails(), logs, func(o *Options) { o.Client = c })
		<-h.r.Adopted()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		h.stop()
		logs.mu.Lock()
		out := logs.b.String()
		logs.mu.Unlock()
		lines := strings.Count(out, "\n")
		t.Logf("3 h of 403: %d looks at the files, %d calls, %d log lines:\n%s", c.looks.Load(), c.calls.Load(), lines, out)
		// One line per writer: the conditions' and the report's.
		if n := strings.Count(out, "refused by the API server: the credentials do not allow it (is node_name this node's own name?)"); n != 2 {
			t.Errorf("%d lines about the 403, want 2 (one per writer)", n)
		}
		// Two writers, each retrying 30 to 60 s apart at the backoff's top.
		if n := c.calls.Load(); n > 2*3*120+20 {
			t.Errorf("%d calls in 3 h: want the backoff's, 30 to 60 s apart", n)
		}
		if n := c.looks.Load(); n < 3*3600-60 || n > 3*3600+60 {
			t.Errorf("%d looks in 3 h: want one a second", n)
		}
	})
}
