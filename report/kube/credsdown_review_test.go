package kube

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// downCredClient is credFileClient behind an API server that may be down
// (every call refused at the dial); it counts credsLoop's looks.
type downCredClient struct {
	*credFileClient
	down  atomic.Bool
	looks atomic.Int64
}

var errRefusedDial = &url.Error{Op: "Patch", URL: "https://10.0.0.1:6443", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}

func (d *downCredClient) credentialsChanged() bool {
	d.looks.Add(1)
	return d.credFileClient.credentialsChanged()
}

func (d *downCredClient) GetNode(ctx context.Context, name string) (*kubeapi.Node, error) {
	if d.down.Load() {
		return nil, errRefusedDial
	}
	return d.credFileClient.GetNode(ctx, name)
}

func (d *downCredClient) PatchNodeStatus(ctx context.Context, name string, p []byte) (*kubeapi.Node, error) {
	if d.down.Load() {
		return nil, errRefusedDial
	}
	return d.credFileClient.PatchNodeStatus(ctx, name, p)
}

func (d *downCredClient) PatchNode(ctx context.Context, name string, p []byte) (*kubeapi.Node, error) {
	if d.down.Load() {
		return nil, errRefusedDial
	}
	return d.credFileClient.PatchNode(ctx, name, p)
}

func (d *downCredClient) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	if d.down.Load() {
		return errRefusedDial
	}
	return d.credFileClient.CreateEvent(ctx, ev)
}

func (d *downCredClient) PatchEvent(ctx context.Context, ns, name string, p []byte) (*kubeapi.Event, error) {
	if d.down.Load() {
		return nil, errRefusedDial
	}
	return d.credFileClient.PatchEvent(ctx, ns, name, p)
}

// The API server down for an hour while the node's certificate has expired,
// then back (answering 401), then the certificate rotated. While it is down
// the calls fail at the dial, not for the credentials: credsLoop does not
// look at the files (the probe dials, once a second); once it answers, the
// probe's wake has the writers call and get 401, the probe stops, and
// credsLoop looks once a second for 5 minutes (credsFast), then every
// 10 s (323 looks in the 10 minutes from 10 s after the return); the
// rotation 10 minutes in then reaches the Node within credsPollMax.
// Review of credsLoop beside probeLoop: holds.
func TestReviewCredsLoopWhileTheAPIServerIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cred := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
		if err := os.WriteFile(cred, []byte("c1"), 0o600); err != nil {
			t.Fatal(err)
		}
		cs := fake.NewClientset(kubeletNode())
		c := &downCredClient{credFileClient: &credFileClient{inner: kubefake.New(cs), path: cred, accept: "c2", ok: map[string]int{}}}
		c.down.Store(true)
		var dials atomic.Int64
		store := report.NewStore("b")
		h := startOpts(t, cs, store, report.NewDetails(), io.Discard, func(o *Options) {
			o.Client = c
			o.Dial = func(context.Context) error {
				dials.Add(1)
				if c.down.Load() {
					return syscall.ECONNREFUSED
				}
				return nil
			}
		})
		defer h.stop()
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "full"}, time.Now())
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := c.looks.Load(); n != 0 {
			t.Errorf("%d looks at the credentials' files while the API server refused connections: want none", n)
		}
		if n := dials.Load(); n < 3500 {
			t.Errorf("%d dials in the hour down: want the probe's one a second", n)
		}
		// Back, answering 401 for the expired certificate.
		c.down.Store(false)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		d0, l0 := dials.Load(), c.looks.Load()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if n := dials.Load() - d0; n > 2 {
			t.Errorf("%d dials in 10 minutes of 401: want none (the API server answers)", n)
		}
		if n := c.looks.Load() - l0; n < 315 || n > 330 {
			t.Errorf("%d looks in 10 minutes of 401: want one a second for %s, then one every %s (323)", n, credsFast, credsPollMax)
		}
		if err := os.WriteFile(cred+".tmp", []byte("c2"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cred+".tmp", cred); err != nil {
			t.Fatal(err)
		}
		time.Sleep(credsPollMax + 10*time.Millisecond)
		synctest.Wait()
		if cond := findCond(h.node(t), "DiskUsageHigh"); cond == nil || cond.Status != corev1.ConditionTrue {
			t.Errorf("the condition %s after the rotation: %+v", credsPollMax, cond)
		}
	})
}
