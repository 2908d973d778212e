package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report/kube/kubefake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

func getStatus(t *testing.T, sock string) (StatusReport, error) {
	t.Helper()
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	var st StatusReport
	resp, err := c.Get("http://x" + StatusPath)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return st, json.Unmarshal(b, &st)
}

// The status socket answers from the daemon's memory while every write to
// the API server fails: conditions with their times and evidence, the
// failing writes and what waits. It is root's only; a socket file left by a
// daemon that is gone is replaced, a second daemon does not take over a live
// one; it is gone after the daemon stops.
func TestStatusSocket(t *testing.T) {
	cfg := testConfig(t)
	cfg.Status.Socket = filepath.Join(t.TempDir(), "status.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Status.Socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close() // the file stays, nothing answers
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "v9", Listener: ln, Kube: kubefake.New(client)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	var st StatusReport
	await(t, d, "a status with a failed write of the conditions", func() bool {
		st, err = getStatus(t, cfg.Status.Socket)
		return err == nil && st.Ready && st.Kubernetes.Calls["status"].Failing
	})
	if fi, err := os.Stat(cfg.Status.Socket); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Errorf("socket %v %v, want a socket of mode 0600", fi.Mode(), err)
	}
	if st.Version != "v9" || st.Node != cfg.NodeName || st.Role != "worker" || st.Started.IsZero() || st.PID != os.Getpid() {
		t.Errorf("header: %+v", st)
	}
	var du *ConditionStatus
	for i, c := range st.Conditions {
		if c.Type == "DiskUsageHigh" {
			du = &st.Conditions[i]
		}
	}
	want, _ := d.Store().Get("DiskUsageHigh")
	if du == nil || du.Status != want.Status || du.Message != want.Message || !du.LastTransitionTime.Equal(want.LastTransitionTime) || du.LastUpdateTime.IsZero() || du.Source != "check" {
		t.Fatalf("DiskUsageHigh in status %+v, in the store %+v", du, want)
	}
	if fs, _ := json.Marshal(du.Evidence["storage.filesystems"]); !strings.Contains(string(fs), `"mountPoint":"/"`) {
		t.Errorf("DiskUsageHigh evidence: %s", fs)
	}
	k := st.Kubernetes
	if k.State != "reporting" || !k.StatusPending || !strings.Contains(k.Calls["status"].LastError, "connection refused") || !k.Calls["status"].LastSuccess.IsZero() || k.Calls["read"].LastSuccess.IsZero() {
		t.Errorf("kubernetes: %+v", k)
	}
	if st.Summary != Summarize(d.Store().All()) {
		t.Errorf("summary %q", st.Summary)
	}

	// A second daemon with the same socket runs, without taking it (a
	// state directory of its own: on the same one it refuses to start,
	// TestSecondDaemonOnTheSameStateDirRefuses).
	var logs testenv.SyncBuffer
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	cfg2 := *cfg
	cfg2.StateDir = t.TempDir()
	d2, err := New(&cfg2, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "second", Listener: ln2, Kube: kubefake.New(client)})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- d2.Run(ctx2) }()
	await(t, d2, "the second daemon refused the socket", func() bool {
		return strings.Contains(logs.String(), "another daemon answers on it")
	})
	cancel2()
	<-done2
	if st, err := getStatus(t, cfg.Status.Socket); err != nil || st.Version != "v9" {
		t.Errorf("after the second daemon: %+v %v", st.Version, err)
	}

	cancel()
	<-done
	stopped = true
	if _, err := os.Stat(cfg.Status.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after stop: %v", err)
	}
}

// The status document carries a condition's evidence: the tamper findings'
// paths, which whoever creates a file under a protected directory names.
// Its DEL, C1 controls and bidi overrides are \u escapes (encoding/json
// writes them raw), and the value decodes to the same name.
func TestStatusDocumentIsPrintable(t *testing.T) {
	const evil = "/etc/cni/net.d/\x1b]0;pwn\x07\u009b2J\x7f\u202e.conflist"
	d, err := New(testConfig(t), quietLog(), Options{Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	d.store.Set(report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged, Message: "1 finding(s): " + evil + " added"}, time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	d.details.SetFor("NodeTampered", report.Detail{Domain: "tamper", Field: "tamper", Value: []map[string]string{{"path": evil}}})
	rec := httptest.NewRecorder()
	d.statusHandler().ServeHTTP(rec, httptest.NewRequest("GET", StatusPath, nil))
	body := rec.Body.String()
	for _, c := range []string{"\x1b", "\x07", "\x7f", "\u009b", "\u202e"} {
		if strings.Contains(body, c) {
			t.Errorf("the status document holds %q raw", c)
		}
	}
	if !strings.Contains(body, `"path": "/etc/cni/net.d/\u001b]0;pwn\u0007\u009b2J\u007f\u202e.conflist"`) {
		t.Errorf("the evidence's path is not written with \\u escapes:\n%s", body)
	}
	var st StatusReport
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Conditions {
		if c.Type == "NodeTampered" {
			if p := fmt.Sprint(c.Evidence["tamper.tamper"]); p != "[map[path:"+evil+"]]" {
				t.Errorf("evidence %q, want the same path back", p)
			}
			return
		}
	}
	t.Errorf("no NodeTampered in %s", body)
}
