package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// A metrics port another program holds (EADDRINUSE) does not keep the
// daemon from its work: it starts, evaluates and writes the conditions and
// reports ready; the failure is logged once (however often the bind is
// tried again), named in systemd's status line and in the status report;
// once the port is free the metrics and /healthz are served, and logged.
// (Before, New returned the error: the process exited and systemd
// restarted it every 5 s, the node without condition updates.)
func TestTakenMetricsPortIsRetried(t *testing.T) {
	defer func(min, max time.Duration) { metricsRetryMin, metricsRetryMax = min, max }(metricsRetryMin, metricsRetryMax)
	metricsRetryMin, metricsRetryMax = 10*time.Millisecond, 100*time.Millisecond
	sock := notifySocket(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	cfg := testConfig(t)
	cfg.Metrics.ListenAddress = addr
	cfg.Status.Socket = filepath.Join(t.TempDir(), "status.sock")
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	var logs testenv.SyncBuffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Kube: kubefake.New(client)})
	if err != nil {
		t.Fatalf("New with the metrics port taken: %v; want the daemon to start without it", err)
	}
	stop := startDaemon(t, d)
	defer stop()

	failure := "listen tcp " + addr + ": bind: address already in use"
	ready := next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	if !strings.Contains(ready, "STATUS=metrics not served: "+failure+" (retrying); ") || !strings.Contains(ready, " conditions: ") {
		t.Errorf("ready message %q does not name the bind failure before the summary", ready)
	}
	await(t, d, "the conditions on the Node", func() bool {
		n, err := client.CoreV1().Nodes().Get(context.Background(), cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "DiskUsageHigh" {
				return true
			}
		}
		return false
	})
	var st StatusReport
	await(t, d, "a status report with three failed binds", func() bool {
		st, err = getStatus(t, cfg.Status.Socket)
		return err == nil && st.Metrics.Attempts >= 3
	})
	if m := st.Metrics; m.Address != addr || m.Serving || m.Error != failure || m.FailingSince.IsZero() {
		t.Errorf("status while the port is taken: %+v", m)
	}
	if n := strings.Count(logs.String(), `level=WARN msg="metrics not served: cannot bind metrics.listen_address; the daemon works on without /metrics and /healthz, retrying with backoff" addr=`+addr+` err="`+failure+`"`); n != 1 {
		t.Errorf("the bind failure logged %d times after %d tries, want once:\n%s", n, st.Metrics.Attempts, logs.String())
	}

	busy.Close()
	client2 := http.Client{Timeout: time.Second}
	var code int
	await(t, d, "the metrics served once the port is free", func() bool {
		resp, err := client2.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		code = resp.StatusCode
		return true
	})
	if code != http.StatusOK {
		t.Errorf("/metrics: %d", code)
	}
	if code, body := get(t, "http://"+addr+"/healthz"); code != http.StatusOK || !strings.HasPrefix(body, "ok: ") {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if d.Addr() == nil || d.Addr().String() != addr {
		t.Errorf("Addr() = %v, want %s", d.Addr(), addr)
	}
	if !strings.Contains(logs.String(), `level=INFO msg="metrics listener bound; serving metrics" addr=`+addr) {
		t.Errorf("the bind is not logged:\n%s", logs.String())
	}
	next(t, sock, "a status line without the failure", func(m string) bool {
		return strings.Contains(m, "STATUS=") && strings.Contains(m, " conditions: ") && !strings.Contains(m, "metrics not served")
	})
	if st, err := getStatus(t, cfg.Status.Socket); err != nil || !st.Metrics.Serving || st.Metrics.Error != "" || st.Metrics.Address != addr {
		t.Errorf("status once served: %+v %v", st.Metrics, err)
	}
}
