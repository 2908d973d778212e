package kube

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed client certificate for cn and its key to
// certFile and keyFile.
func writeCert(t *testing.T, certFile, keyFile, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The client certificate named by path is read again when its file
// changes, and then presented on new connections; a file that does not hold
// a valid pair (half written, gone) leaves the last one in use. No work
// queue of client-go's runs: its heartbeat woke the daemon every 10 s.
func TestClientReloadsItsCertificateFiles(t *testing.T) {
	var seen []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			seen = append(seen, r.TLS.PeerCertificates[0].Subject.CommonName)
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"metadata":{"name":"n1"}}`)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	writeCert(t, cert, key, "first")
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubelet.conf")
	if err := os.WriteFile(kc, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: ca.crt}}]
users: [{name: u, user: {client-certificate: client.crt, client-key: client.key}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := NewClient(kc, "test")
	if err != nil {
		t.Fatal(err)
	}
	r, ok := c.(*rotatingClient)
	if !ok {
		t.Fatalf("a kubeconfig naming its certificate by path got a %T", c)
	}
	var stacks bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&stacks, 1)
	if strings.Contains(stacks.String(), "client-go/util/workqueue") || strings.Contains(stacks.String(), "client-go/transport.(*dynamicClientCert)") {
		t.Errorf("client-go's certificate reloader runs:\n%s", stacks.String())
	}
	get := func(step string) {
		t.Helper()
		// A new connection each call, so that the server sees which
		// certificate the client presents now.
		srv.CloseClientConnections()
		if _, err := c.GetNode(context.Background(), "n1"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	get("first")
	get("unchanged")
	if r.certs != 1 {
		t.Errorf("%d clients made for unchanged files", r.certs)
	}
	writeCert(t, cert, key, "second")
	get("after rotation")
	os.WriteFile(cert, []byte("-----BEGIN CERTIFICATE-----\nhalf"), 0o600)
	get("half-written certificate")
	os.Remove(key)
	get("key gone")
	if r.certs != 2 {
		t.Errorf("%d clients made, want 2", r.certs)
	}
	if want := "first first second second second"; strings.Join(seen, " ") != want {
		t.Errorf("the server saw %q, want %q", strings.Join(seen, " "), want)
	}
}
