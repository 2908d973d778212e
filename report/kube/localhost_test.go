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
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// A kubeconfig whose server is https://localhost:PORT (an API server on the
// node itself, a local proxy to it) is dialled as loopback without a
// lookup, as the probes dial localhost (rawsys.DialLocal): Go's resolver
// asks the DNS servers for a localhost that /etc/hosts lacks, at each new
// connection to the API server. TLS still verifies the server's
// certificate against the kubeconfig's name: a certificate for
// "localhost" is taken, one for 127.0.0.1 alone is refused. The test binary
// re-executes itself under unshare(1) (needs root); the child mounts an
// /etc/hosts without localhost and counts the resolver's DNS connections,
// showing first that a plain net.Dialer asks DNS for localhost (the
// premise).
func TestAPIServerAtLocalhostWithoutALookup(t *testing.T) {
	if !testenv.InMountNamespace(t, "mounting a hosts file") {
		return
	}
	asked := testenv.HostsWithoutLocalhost(t)

	named := localhostServer(t, &x509.Certificate{DNSNames: []string{"localhost"}})
	if _, err := localhostClient(t, named, "localhost").GetNode(context.Background(), "n1"); err != nil {
		t.Errorf("the API server at https://localhost (its certificate for localhost): %v", err)
	}
	if _, err := localhostClient(t, named, "api.LOCALHOST").GetNode(context.Background(), "n1"); err == nil || !strings.Contains(err.Error(), "x509") || !strings.Contains(err.Error(), "api.LOCALHOST") {
		t.Errorf("the API server at https://api.LOCALHOST, its certificate for localhost only: %v, want the name refused by TLS", err)
	}
	ip := localhostServer(t, &x509.Certificate{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if _, err := localhostClient(t, ip, "localhost").GetNode(context.Background(), "n1"); err == nil || !strings.Contains(err.Error(), "x509") || !strings.Contains(err.Error(), "localhost") {
		t.Errorf("the API server at https://localhost, its certificate for 127.0.0.1 only: %v, want the name refused by TLS", err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the client asked DNS %d times for a localhost name", n)
	}
}

// localhostServer serves Node n1 over TLS on 127.0.0.1 with a self-signed
// certificate of tmpl's names.
func localhostServer(t *testing.T, tmpl *x509.Certificate) *httptest.Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber, tmpl.Subject = big.NewInt(1), pkix.Name{CommonName: "kube-apiserver"}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature|x509.KeyUsageCertSign, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"metadata":{"name":"n1"}}`)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes refused on purpose
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// localhostClient is a client of a kubeconfig naming srv as host:PORT,
// its certificate the CA.
func localhostClient(t *testing.T, srv *httptest.Server, host string) Client {
	t.Helper()
	dir := t.TempDir()
	cert := filepath.Join(dir, "client.pem")
	writeCert(t, cert, cert, "n1")
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	kc := filepath.Join(dir, "kubelet.conf")
	if err := os.WriteFile(kc, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", certificate-authority: ca.crt}}]
users: [{name: u, user: {client-certificate: client.pem, client-key: client.pem}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, net.JoinHostPort(host, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _, err := NewClient(kc, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
