package daemon

import (
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The loop that waits for the kubeconfig (a first boot: the daemon starts
// before the kubelet joins) ends once the kubeconfig is there, and its
// series leaves the metrics as a stopped check's does: its
// autopilot_health_loop_last_progress_timestamp_seconds stayed, frozen at
// the join, on every node that joined after the daemon started, for an
// alert on the loops' progress to take for a stuck loop.
func TestKubeconfigLoopLeavesTheMetricsOnceReporting(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kubernetes.Kubeconfig = "/etc/kubernetes/kubelet.conf"
	asked := make(chan struct{}, 1)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/"), "/status")
		fmt.Fprintf(w, `{"metadata":{"name":%q,"uid":"u1"}}`, name)
	}))
	defer srv.Close()
	var logs testenv.SyncBuffer
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	metricsURL := "http://" + ln.Addr().String() + "/metrics"
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln, KubeconfigPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	const series = `autopilot_health_loop_last_progress_timestamp_seconds{loop="kube/kubeconfig"}`
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, page := get(t, metricsURL); strings.Contains(page, series) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s while the daemon waits for the kubeconfig\n%s", series, logs.String())
		}
		select {
		case <-d.Store().Changed():
		case <-time.After(10 * time.Millisecond):
		}
	}

	dir := filepath.Dir(cfg.HostPath(cfg.Kubernetes.Kubeconfig))
	writeFile(t, filepath.Join(dir, "kubelet-client-current.pem"), nodeCertPEM(t, "system:node:"+cfg.NodeName))
	writeFile(t, filepath.Join(dir, "ca.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	writeFile(t, cfg.HostPath(cfg.Kubernetes.Kubeconfig), fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: ca.crt}}]
users: [{name: u, user: {client-certificate: kubelet-client-current.pem, client-key: kubelet-client-current.pem}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL))
	select {
	case <-asked:
	case <-time.After(10 * time.Second):
		t.Fatalf("the daemon never called the API server\n%s", logs.String())
	}
	// The reporter calls the API server after the waiting loop ended.
	if _, page := get(t, metricsURL); strings.Contains(page, series) {
		t.Errorf("reporting to Kubernetes, the loop that waited for the kubeconfig still has its progress series:\n%s", grepLines(page, `loop="kube/kubeconfig"`))
	}
	if !strings.Contains(logs.String(), "reporting to Kubernetes") {
		t.Errorf("not reporting:\n%s", logs.String())
	}
}
