package daemon

import (
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
)

// A kubelet.conf rewritten to name another API server (an operator moved
// it behind a new address): the daemon's calls go there (the kube client
// reads the kubeconfig again), and `status` says so, not the server read at
// start. So does the user the credentials name when it is another node's.
func TestStatusFollowsARewrittenKubeconfig(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kubernetes.Kubeconfig = "/etc/kubernetes/kubelet.conf"
	cfg.Kubernetes.ReportInterval = config.Duration{Duration: 20 * time.Millisecond}
	server := func(calls *atomic.Int32) *httptest.Server {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"metadata":{"name":"test-node","uid":"u1"}}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	var calls1, calls2 atomic.Int32
	srv1, srv2 := server(&calls1), server(&calls2)
	kc := cfg.HostPath(cfg.Kubernetes.Kubeconfig)
	dir := filepath.Dir(kc)
	kubeconfig := func(srv *httptest.Server, cert string) {
		ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
		writeFile(t, kc, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: u, user: {client-certificate: %[3]s, client-key: %[3]s}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL, ca, cert))
	}
	writeFile(t, filepath.Join(dir, "kubelet-client-current.pem"), nodeCertPEM(t, "system:node:test-node"))
	writeFile(t, filepath.Join(dir, "other.pem"), nodeCertPEM(t, "system:node:other-node"))
	kubeconfig(srv1, "kubelet-client-current.pem")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	detail := func() string { return d.Status(time.Now()).Kubernetes.Detail }
	await(t, d, "a call to the first API server", func() bool { return calls1.Load() > 0 })
	if got := detail(); !strings.Contains(got, "to "+srv1.URL+" as node test-node") {
		t.Errorf("status before the rewrite: %q", got)
	}

	kubeconfig(srv2, "kubelet-client-current.pem")
	await(t, d, "a call to the new API server", func() bool { return calls2.Load() > 0 })
	if got := detail(); !strings.Contains(got, "to "+srv2.URL+" as node test-node") || strings.Contains(got, "credentials") {
		t.Errorf("status after the rewrite: %q, want the new server %s", got, srv2.URL)
	}

	kubeconfig(srv2, "other.pem")
	await(t, d, "status naming the other node's credentials", func() bool {
		return strings.Contains(detail(), "system:node:other-node")
	})
}

// On a node that joins the cluster, the kubelet writes kubelet.conf naming
// kubelet-client-current.pem before the API server has issued that
// certificate (its TLS bootstrap: LoadClientConfig, then the CSR): a
// normal phase, which the daemon waits out with a warning, once, not an
// error; it reports once the certificate is there.
func TestKubeconfigBeforeItsCertificateIsAWarning(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kubernetes.Kubeconfig = "/etc/kubernetes/kubelet.conf"
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"metadata":{"name":"test-node","uid":"u1"}}`)
	}))
	defer srv.Close()
	kc := cfg.HostPath(cfg.Kubernetes.Kubeconfig)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	writeFile(t, kc, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: u, user: {client-certificate: kubelet-client-current.pem, client-key: kubelet-client-current.pem}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL, ca))
	var logs testenv.SyncBuffer
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln, KubeconfigPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	await(t, d, "waiting for the certificate", func() bool { return d.Status(time.Now()).Kubernetes.State == "waiting" })
	time.Sleep(50 * time.Millisecond) // several polls, to see no second line
	// As the kubelet does: the certificate written under a name of its
	// own, then kubelet-client-current.pem made to point at it, so that no
	// read finds it half-written (a plain write here let a poll read part
	// of it, an error of another kind).
	dir := filepath.Dir(kc)
	writeFile(t, filepath.Join(dir, "kubelet-client-2026-12-05.pem"), nodeCertPEM(t, "system:node:test-node"))
	if err := os.Symlink("kubelet-client-2026-12-05.pem", filepath.Join(dir, "kubelet-client-current.pem")); err != nil {
		t.Fatal(err)
	}
	await(t, d, "a call to the API server", func() bool { return calls.Load() > 0 })
	if l := grepLines(logs.String(), "level=ERROR"); l != "" {
		t.Errorf("the wait for the kubelet's certificate logged errors:\n%s", l)
	}
	if n := strings.Count(logs.String(), "until the kubelet has its client certificate"); n != 1 {
		t.Errorf("the wait was logged %d times, want one warning:\n%s", n, logs.String())
	}
}

// A disk that hangs under the kubeconfig at the start (its read does not
// return; here a FIFO in its place, whose open waits for a writer): status
// says the daemon waits for the kubeconfig's files, which do not answer,
// and the journal says it once. Before, status said "Kubernetes: " and
// nothing more, and the journal nothing, until the disk answered.
func TestHungKubeconfigAtStartIsSaid(t *testing.T) {
	defer func(d time.Duration) { kubeconfigHungAfter = d }(kubeconfigHungAfter)
	kubeconfigHungAfter = 50 * time.Millisecond
	cfg := testConfig(t)
	cfg.Kubernetes.Kubeconfig = "/etc/kubernetes/kubelet.conf"
	kc := cfg.HostPath(cfg.Kubernetes.Kubeconfig)
	if err := os.MkdirAll(filepath.Dir(kc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(kc, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	// The disk answers at the end: the read blocked in the FIFO's open
	// returns, no goroutine is left in it.
	t.Cleanup(func() {
		if f, err := os.OpenFile(kc, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	await(t, d, "status saying the kubeconfig's files do not answer", func() bool {
		return d.Status(time.Now()).Kubernetes.State == "waiting"
	})
	want := "for the kubeconfig " + kc + ": its files do not answer (a hung disk?)"
	if k := d.Status(time.Now()).Kubernetes; !strings.HasPrefix(k.Detail, want) {
		t.Errorf("status's Kubernetes part: %q (%q), want waiting (%s: ...)", k.State, k.Detail, want)
	}
	if n := strings.Count(logs.String(), "the kubeconfig's files do not answer (a hung disk?)"); n != 1 {
		t.Errorf("journal: %d lines saying the kubeconfig's files do not answer, want 1:\n%s", n, logs.String())
	}
}
