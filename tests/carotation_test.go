//go:build integration

package tests

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// A CA rotation that rewrites, in place, the CA file the kubeconfig names
// (certificate-authority: ca.crt, the kubeconfig itself unchanged), after
// the API server began serving a certificate of the new CA: the daemon's
// writes, failing TLS until then, reach the Node within seconds of the
// rewrite, and the reload is logged once. client-go reads such a file
// again at most once in 5 minutes: the writes failed that long. A real
// kube-apiserver of its own (its serving certificate is replaced, which
// kube-apiserver reloads from its files), with NodeRestriction.
func TestKubeCAFileRotatedInPlace(t *testing.T) {
	s, err := harness.StartAPIServer(t.TempDir())
	if err != nil {
		t.Fatalf("real kube-apiserver: %v", err)
	}
	t.Cleanup(s.Stop)
	node := "node-ca-" + harness.Token()
	registerNode(t, s, node)
	// The admin's client trusts both CAs: it watches the Node throughout.
	ca2, err := harness.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := s.CA.Issue("admin", []string{"system:masters"}, false, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	watcher := *s
	if watcher.Admin, err = kubernetes.NewForConfig(&rest.Config{Host: s.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: append(append([]byte(nil), s.CA.CertPEM...), ca2.CertPEM...), CertData: cert, KeyData: key}}); err != nil {
		t.Fatal(err)
	}

	kc, err := s.NodeKubeconfig(node, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The node's own copy of the CA, as kubelet.conf names
	// /etc/kubernetes/pki/ca.crt.
	caFile := filepath.Join(filepath.Dir(kc), "ca.crt")
	if err := os.WriteFile(caFile, s.CA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	named := strings.ReplaceAll(string(b), filepath.Join(s.Dir, "pki", "ca.crt"), caFile)
	if named == string(b) {
		t.Fatalf("the kubeconfig names no CA file:\n%s", b)
	}
	if err := os.WriteFile(kc, []byte(named), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testenv.SyncBuffer
	x := reporterWritingOn(t, &watcher, kc, node, "a write trusting the first CA", &logs)
	store := x.store

	// The CA rotation on the control plane: the API server restarts
	// serving a certificate of the new CA, trusting client certificates
	// of both (the node's of the first one). It restarts with new session
	// ticket keys, so no connection of the daemon's resumes a session of
	// before, whose handshake verified the old certificate.
	sc, sk, err := ca2.Issue("kube-apiserver", nil, true, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(s.Dir, "pki")
	for name, b := range map[string][]byte{"apiserver.key": sk, "apiserver.crt": sc,
		"ca.crt": append(append([]byte(nil), s.CA.CertPEM...), ca2.CertPEM...)} {
		if err := os.WriteFile(filepath.Join(pki, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.StopKubeAPIServer()
	s.CA = ca2 // what the harness's readiness check trusts and presents
	if err := s.StartKubeAPIServer(); err != nil {
		t.Fatal(err)
	}
	peer := func() *x509.Certificate {
		c, err := tls.Dial("tcp", strings.TrimPrefix(s.URL, "https://"), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}()
	if err := peer.CheckSignatureFrom(ca2.Cert); err != nil {
		t.Fatalf("kube-apiserver serves a certificate not of the new CA: %v", err)
	}
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "during"}, time.Now())
	for deadline := time.Now().Add(30 * time.Second); x.m.Failures() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no write failed against a certificate of a CA the node does not trust yet:\n%s", logs.String())
		}
	}

	// The CA rotation reaches the node: ca.crt rewritten in place.
	f, err := os.OpenFile(caFile, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(ca2.CertPEM); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rotated := time.Now()
	waitNodeFor(t, &watcher, node, 15*time.Second, "a write after the CA file's rewrite", has("DiskUsageHigh", "True", "FilesystemSpaceHigh"))
	t.Logf("the Node written %.2f s after the CA file's rewrite (%v writes failed before)", time.Since(rotated).Seconds(), x.m.Failures())
	if n := strings.Count(logs.String(), "certificate authority reloaded"); n != 1 {
		t.Errorf("the CA's reload was logged %d times, want once:\n%s", n, logs.String())
	}
}
