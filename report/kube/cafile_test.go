package kube

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// testCA is a certificate authority and a serving certificate for
// 127.0.0.1 it signed.
type testCA struct {
	pem     []byte // the CA's certificate
	serving tls.Certificate
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name + " serving"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		pem:     pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		serving: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}
}

// A CA rotation that rewrites the CA file the kubeconfig names
// (certificate-authority: ca.crt), in place, the kubeconfig left as it
// was: the next call trusts the new CA (a new client, its connections new,
// the reload logged once). client-go reads such a file again itself at
// most once in 5 minutes, and until then every call failed TLS against an
// API server serving a certificate of the new CA. A CA file written again
// the same makes no client; one half written, or empty, leaves the last
// client in use, logged once per change; and CredentialsChanged sees the
// file change, so writers failing TLS wake for it.
func TestClientFollowsItsCAFile(t *testing.T) {
	ca1, ca2 := newTestCA(t, "ca1"), newTestCA(t, "ca2")
	var serving atomic.Pointer[tls.Certificate]
	serving.Store(&ca1.serving)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"metadata":{"name":"n1"}}`))
	}))
	srv.TLS = &tls.Config{
		ClientAuth: tls.RequestClientCert,
		// No resumption: a session of the old certificate's handshake
		// would pass without the client verifying the new one.
		SessionTicketsDisabled: true,
	}
	// Not GetCertificate: httptest's own certificate would be served to
	// a client that sends no server name (an IP address).
	srv.TLS.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{ClientAuth: tls.RequestClientCert, SessionTicketsDisabled: true,
			Certificates: []tls.Certificate{*serving.Load()}}, nil
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	pair := filepath.Join(dir, "kubelet-client-current.pem")
	writeCert(t, pair, pair, "system:node:n1")
	kc := kubeconfigFor(t, dir, srv, pair, pair)
	caFile := filepath.Join(dir, "ca.crt")
	writeCA := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(caFile, b, 0o600); err != nil { // in place: the same inode
			t.Fatal(err)
		}
	}
	writeCA(ca1.pem)
	var logs testenv.SyncBuffer
	c, _, err := NewClient(kc, "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	k := c.(*kubeconfigClient)
	get := func(step string) {
		t.Helper()
		if _, err := c.GetNode(context.Background(), "n1"); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	get("CA 1")
	if CredentialsChanged(c) {
		t.Errorf("CredentialsChanged before any change")
	}

	// The API server restarts serving a certificate of CA 2; then the CA
	// file is rewritten in place.
	serving.Store(&ca2.serving)
	srv.CloseClientConnections()
	if _, err := c.GetNode(context.Background(), "n1"); err == nil {
		t.Fatalf("a certificate of CA 2 was trusted before the CA file named it")
	}
	writeCA(ca2.pem)
	if !CredentialsChanged(c) {
		t.Errorf("CredentialsChanged missed the CA file's change")
	}
	get("CA 2, the file rewritten in place")
	if CredentialsChanged(c) {
		t.Errorf("CredentialsChanged after the call read the CA file")
	}

	// Written again the same: no new client.
	later := time.Now().Add(time.Minute)
	writeCA(ca2.pem)
	os.Chtimes(caFile, later, later)
	get("written again")
	// Half written, then empty: the last client stays.
	writeCA(ca2.pem[:len(ca2.pem)/2])
	get("half written")
	get("half written, again")
	writeCA(nil)
	get("empty")
	if k.made != 2 {
		t.Errorf("%d clients made, want 2 (CA 1, CA 2)", k.made)
	}
	if n := strings.Count(logs.String(), "certificate authority reloaded"); n != 1 {
		t.Errorf("the CA's reload was logged %d times, want once:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "holds no certificate"); n != 2 {
		t.Errorf("the unusable CA file was logged %d times, want once per change (2):\n%s", n, logs.String())
	}
}
