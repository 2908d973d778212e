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
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
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
	var closed atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed.Add(1)
		}
	}
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
	var logs testenv.SyncBuffer
	c, _, err := NewClient(kc, "test", slog.New(slog.NewTextHandler(&logs, nil)))
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
		if _, err := c.GetNode(context.Background(), "n1"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	get("first")
	get("unchanged")
	if r.certs != 1 || closed.Load() != 0 {
		t.Errorf("unchanged files: %d clients made, %d connections closed", r.certs, closed.Load())
	}
	writeCert(t, cert, key, "second")
	get("after rotation")
	// The first client's connection, idle, is closed.
	for deadline := time.Now().Add(5 * time.Second); closed.Load() != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("after the rotation: %d connections closed, want the first client's", closed.Load())
		}
		time.Sleep(time.Millisecond)
	}
	os.WriteFile(cert, []byte("-----BEGIN CERTIFICATE-----\nhalf"), 0o600)
	get("half-written certificate")
	get("half-written certificate, again")
	os.Remove(key)
	get("key gone")
	if r.certs != 2 {
		t.Errorf("%d clients made, want 2", r.certs)
	}
	// Each request on the connection of the client in use: the new
	// certificate from the rotation on, kept when the files went bad.
	if want := "first first second second second second"; strings.Join(seen, " ") != want {
		t.Errorf("the server saw %q, want %q", strings.Join(seen, " "), want)
	}
	if n := strings.Count(logs.String(), "client certificate reloaded"); n != 1 {
		t.Errorf("the reload was logged %d times:\n%s", n, logs.String())
	}
	// Once for the half-written certificate, once for the missing key.
	if n := strings.Count(logs.String(), "cannot be used; keeping the certificate read before"); n != 2 {
		t.Errorf("the unusable files were logged %d times:\n%s", n, logs.String())
	}
}
