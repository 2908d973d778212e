package kube

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// pacedCreds is a client whose Node writes are refused (403) while refuse
// is set, and whose credentials' files changed when change is set (once);
// it keeps the times of credsLoop's looks at them.
type pacedCreds struct {
	Client
	refuse, change atomic.Bool
	mu             sync.Mutex
	at             []time.Time
}

func (p *pacedCreds) credentialsChanged() bool {
	p.mu.Lock()
	p.at = append(p.at, time.Now())
	p.mu.Unlock()
	return p.change.Swap(false)
}

// looksSince counts the looks after from.
func (p *pacedCreds) looksSince(from time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, at := range p.at {
		if at.After(from) {
			n++
		}
	}
	return n
}

func (p *pacedCreds) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	if p.refuse.Load() {
		return nil, (&forbiddenWrites{}).refuse()
	}
	return p.Client.PatchNodeStatus(ctx, name, patch)
}

func (p *pacedCreds) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	if p.refuse.Load() {
		return nil, (&forbiddenWrites{}).refuse()
	}
	return p.Client.PatchNode(ctx, name, patch)
}

// credsLoop's pace starts anew: after 10 minutes of 403 it looks every
// 10 s; the files changed (still refused) bring back a look a second,
// calls that succeed stop the looks, and a failure after them is looked at
// once a second again. Fails with the pace not started anew on a change
// (6 looks in the minute after it), and with it not started anew when a
// failure follows calls that succeeded (8 looks in its first minute).
func TestCredsLoopPaceStartsAnew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset(kubeletNode())
		c := &pacedCreds{Client: kubefake.New(cs)}
		store := report.NewStore("b")
		h := startOpts(t, cs, store, report.NewDetails(), io.Discard, func(o *Options) { o.Client = c })
		defer h.stop()
		<-h.r.Adopted()
		c.refuse.Store(true)
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "full"}, time.Now())
		time.Sleep(9 * time.Minute)
		synctest.Wait()
		mark := time.Now()
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := c.looksSince(mark); n < 5 || n > 7 {
			t.Errorf("%d looks in the tenth minute of 403: want one every %s", n, credsPollMax)
		}
		// The files change; the calls are still refused.
		c.change.Store(true)
		time.Sleep(credsPollMax)
		synctest.Wait()
		mark = time.Now()
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := c.looksSince(mark); n < 59 || n > 61 {
			t.Errorf("%d looks in the minute after the files changed: want one a second", n)
		}
		// Fixed: the change wakes the writers, whose calls succeed.
		c.refuse.Store(false)
		c.change.Store(true)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		mark = time.Now()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if n := c.looksSince(mark); n != 0 {
			t.Errorf("%d looks in 10 minutes of calls that succeed: want none", n)
		}
		// Refused again: a new failure, looked at once a second.
		c.refuse.Store(true)
		mark = time.Now()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "fine"}, time.Now())
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := c.looksSince(mark); n < 58 || n > 61 {
			t.Errorf("%d looks in the first minute of a new failure: want one a second", n)
		}
	})
}
