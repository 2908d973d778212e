package daemon

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// refusingStatus is a client whose writes of the Node's status the API
// server refuses (NodeRestriction's 403) while refuse is set.
type refusingStatus struct {
	kubefake.Client
	refuse atomic.Bool
}

func (c *refusingStatus) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	if c.refuse.Load() {
		return nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, name, errors.New(`node "other" is not allowed to modify node "`+name+`"`))
	}
	return c.Client.PatchNodeStatus(ctx, name, patch)
}

// While the conditions' writes to the Node fail (kube.NodeStaleAfter; 60 s,
// TestNodeNotUpdatedSaidAfterTheGraceUntilAWriteLands), systemd's status
// line says the Node is not updated, since when and why, in front of the
// summary, and the status report has it (kubernetes.nodeNotUpdated); both
// clear at the next write that lands. Before, the line read "<n>
// conditions: <k> ok" while nothing reached the Node.
func TestNodeNotUpdatedInStatusLineAndReport(t *testing.T) {
	defer func(d time.Duration) { kube.NodeStaleAfter = d }(kube.NodeStaleAfter)
	kube.NodeStaleAfter = 0
	sock := notifySocket(t)
	cfg := testConfig(t)
	cfg.Status.Socket = filepath.Join(t.TempDir(), "status.sock")
	client := &refusingStatus{Client: kubefake.New(fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}}))}
	client.refuse.Store(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Kube: client})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	line := next(t, sock, "a status line saying the Node is not updated", func(m string) bool {
		return strings.Contains(m, "STATUS=Node NOT updated since ")
	})
	if !strings.Contains(line, "Z: refused by the API server (403 Forbidden); ") {
		t.Errorf("status line %q lacks the reason in front of the rest", line)
	}
	var st StatusReport
	await(t, d, "the status report's answer", func() bool {
		st, err = getStatus(t, cfg.Status.Socket)
		return err == nil
	})
	if n := st.Kubernetes.NodeNotUpdated; n == nil || n.Reason != "refused by the API server (403 Forbidden)" ||
		!strings.Contains(n.Error, "is not allowed to modify node") || n.Failures < 1 || n.Since.IsZero() {
		t.Errorf("status while the writes are refused: %+v", n)
	}
	client.refuse.Store(false)
	next(t, sock, "a status line without the note", func(m string) bool {
		return strings.Contains(m, "STATUS=") && !strings.Contains(m, "NOT updated")
	})
	if st, err := getStatus(t, cfg.Status.Socket); err != nil || st.Kubernetes.NodeNotUpdated != nil {
		t.Errorf("status once a write landed: %+v, %v", st.Kubernetes.NodeNotUpdated, err)
	}
}

// Standalone (no kubeconfig): nothing is said of the Node.
func TestNodeNotUpdatedNotSaidStandalone(t *testing.T) {
	defer func(d time.Duration) { kube.NodeStaleAfter = d }(kube.NodeStaleAfter)
	kube.NodeStaleAfter = 0
	cfg := testConfig(t)
	cfg.Kubernetes.Kubeconfig = ""
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	await(t, d, "standalone", func() bool { return d.Status(time.Now()).Kubernetes.State == "standalone" })
	if s := d.StatusLine(); strings.Contains(s, "Node") {
		t.Errorf("standalone status line %q", s)
	}
	if n := d.Status(time.Now()).Kubernetes.NodeNotUpdated; n != nil {
		t.Errorf("standalone status: %+v", n)
	}
}
