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

// On a first boot the daemon starts before the kubelet has its client
// certificate (Before=kubelet.service), so the node's name is the kernel
// hostname's. When the kubelet's kubeconfig appears, its credentials name
// the node the API server lets it write (system:node:<name>): with
// node_name not set, the daemon reports as that node, not as the hostname
// (a name NodeRestriction refuses), and says so once.
func TestNodeNameFromCredentialsThatAppearAfterStart(t *testing.T) {
	cfg := testConfig(t)
	cfg.NodeName = ""
	writeFile(t, cfg.HostPath("/proc/sys/kernel/hostname"), "worker-7\n")
	cfg.Kubernetes.Kubeconfig = "/etc/kubernetes/kubelet.conf"
	asked := make(chan string, 100)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/nodes/"); ok {
			select {
			case asked <- r.Method + " " + name:
			default:
			}
		}
		w.Header().Set("Content-Type", "application/json")
		// The Node asked for (an answer naming another is a failed call).
		name := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/nodes/"), "/status")
		fmt.Fprintf(w, `{"metadata":{"name":%q,"uid":"u1"}}`, name)
	}))
	defer srv.Close()
	var logs testenv.SyncBuffer
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln, KubeconfigPoll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if n := d.currentEnv().NodeName; n != "worker-7" {
		t.Fatalf("before the kubelet's credentials: node %q, want the hostname's worker-7", n)
	}
	runDaemon(t, d)

	// The kubelet is bootstrapped: its certificate, then kubelet.conf.
	dir := filepath.Dir(cfg.HostPath(cfg.Kubernetes.Kubeconfig))
	writeFile(t, filepath.Join(dir, "kubelet-client-current.pem"), nodeCertPEM(t, "system:node:worker-7.cluster.example"))
	writeFile(t, filepath.Join(dir, "ca.crt"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	writeFile(t, cfg.HostPath(cfg.Kubernetes.Kubeconfig), fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: ca.crt}}]
users: [{name: u, user: {client-certificate: kubelet-client-current.pem, client-key: kubelet-client-current.pem}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL))

	select {
	case got := <-asked:
		if got != "GET worker-7.cluster.example" {
			t.Errorf("first call on a Node: %q, want the credentials' node (GET worker-7.cluster.example)\n%s", got, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the daemon never read its Node\n%s", logs.String())
	}
	if n := d.currentEnv().NodeName; n != "worker-7.cluster.example" {
		t.Errorf("node %q, want worker-7.cluster.example", n)
	}
	if strings.Contains(logs.String(), "node_name names another node than the credentials do") {
		t.Errorf("the detected name was taken for a configured node_name:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), "node name taken from the kubelet's credentials"); n != 1 {
		t.Errorf("the rename was logged %d times, want once:\n%s", n, logs.String())
	}
}
