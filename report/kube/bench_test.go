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
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// serverEnv makes the test binary BenchmarkReconnect's API server (TestMain):
// a process of its own, as the API server is, so that its handshakes are
// not counted as the client's CPU.
const serverEnv = "KUBE_BENCH_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) != "" {
		serveForBench()
	}
	os.Exit(m.Run())
}

// serveForBench serves a Node over TLS, HTTP/2 and HTTP/1.1 offered, as the API server does
// (an ECDSA P-256 certificate, client certificates asked for), and prints
// its address and its certificate (base64 DER) on one line.
func serveForBench() {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		os.Exit(1)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-apiserver"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(1)
	}
	fmt.Printf("%s %s\n", ln.Addr(), base64.StdEncoding.EncodeToString(der))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"metadata":{"name":"n1"}}`)
	}), TLSConfig: &tls.Config{ClientAuth: tls.RequestClientCert, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	srv.ServeTLS(ln, "", "")
	os.Exit(1)
}

// BenchmarkReconnect is a write on a new connection to the API server, as
// the report annotations' every 2 minutes (the daemon closes the connection
// after a periodic write; the API server would after 90 s idle): TCP, TLS
// with the node's client certificate, one GET, the connection closed.
// resumed: the TLS session of the connection before is resumed
// (resumeSessions), over HTTP/1.1 as the daemon speaks (apiProtocols); full:
// every handshake in full; h2: resumed, over HTTP/2 (its preface and
// settings). overlap: three GETs at once (a heartbeat, the annotations and
// an Event on the same step), each on a new connection over HTTP/1.1, on
// one over HTTP/2. On one processor, as the daemon runs; the client's CPU
// per write or per three (its threads' schedstat; the server is a process
// of its own).
//
//	go test ./report/kube -run '^$' -bench Reconnect -benchtime 100x
func BenchmarkReconnect(b *testing.B) {
	for _, name := range []string{"full", "resumed", "h2", "overlap", "overlap-h2"} {
		b.Run(name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			noResume = name == "full"
			defer func() { noResume = false }()
			h2 := strings.HasSuffix(name, "h2")
			if h2 {
				defer func(p []string) { apiProtocols = p }(apiProtocols)
				apiProtocols = nil
			}
			writes := 1
			if strings.HasPrefix(name, "overlap") {
				writes = 3
			}
			line := testenv.HelperProcess(b, serverEnv+"=1")
			addr, cert, ok := strings.Cut(line, " ")
			if !ok {
				b.Fatalf("the server process said %q", line)
			}
			der, err := base64.StdEncoding.DecodeString(cert)
			if err != nil {
				b.Fatal(err)
			}
			dir := b.TempDir()
			writeCert(b, filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.pem"), "system:node:n1")
			if err := os.WriteFile(filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
				b.Fatal(err)
			}
			kc := filepath.Join(dir, "kubelet.conf")
			if err := os.WriteFile(kc, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", certificate-authority: ca.crt}}]
users: [{name: u, user: {client-certificate: client.pem, client-key: client.pem}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, addr), 0o600); err != nil {
				b.Fatal(err)
			}
			c, _, err := NewClient(kc, "bench", nil)
			if err != nil {
				b.Fatal(err)
			}
			write := func() {
				var wg sync.WaitGroup
				for range writes {
					wg.Go(func() {
						if _, err := c.GetNode(context.Background(), "n1"); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
				c.(idleCloser).CloseIdle()
				if want := map[bool]string{false: "http/1.1", true: "h2"}[h2]; APIProtocol() != want {
					b.Fatalf("the connection speaks %q, want %q", APIProtocol(), want)
				}
			}
			write() // the first session
			full0, resumed0 := TLSHandshakes()
			cpu0, _ := testenv.Threads(b)
			b.ResetTimer()
			for range b.N {
				// Writes apart, as they are: past the client's rate limit
				// (5 a second), so that a burst's writes do not wait on it
				// and overlap.
				time.Sleep(time.Duration(writes) * 200 * time.Millisecond)
				write()
			}
			b.StopTimer()
			cpu1, _ := testenv.Threads(b)
			full, resumed := TLSHandshakes()
			nf, nr := full-full0, resumed-resumed0
			// Resumed: each burst's connections but for a rare one that
			// raced another's ticket.
			if nf+nr < int64(b.N) || (name == "full") != (nr == 0) || (name != "full" && nr < int64(b.N)) {
				b.Fatalf("%d writes: %d full and %d resumed handshakes", b.N, nf, nr)
			}
			b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(nf+nr)/float64(b.N), "conns/op")
		})
	}
}

// cannedRT answers every request with the same status, headers and body,
// without a connection: what wholeAnswersRT does to an answer, alone.
type cannedRT struct {
	code int
	hdr  http.Header
	body []byte
}

func (c cannedRT) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: c.code, Header: c.hdr.Clone(), Body: io.NopCloser(bytes.NewReader(c.body)), ContentLength: int64(len(c.body))}, nil
}

// BenchmarkWholeAnswers is what wholeAnswersRT costs an answer: a Node of
// 8 KiB with a 200 (the healthy path: read whole, no other copy), a 429
// Status with a Retry-After (written into the Status: decoded and encoded
// again), and a 429 of text (left as it is).
//
//	go test ./report/kube -run '^$' -bench WholeAnswers -benchmem
func BenchmarkWholeAnswers(b *testing.B) {
	node := []byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","annotations":{"a":"` + strings.Repeat("x", 8<<10) + `"}}}`)
	status := []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"try again later","reason":"TooManyRequests","code":429}`)
	for _, tc := range []struct {
		name string
		rt   cannedRT
	}{
		{"node-200", cannedRT{200, http.Header{"Content-Type": {"application/json"}}, node}},
		{"status-429", cannedRT{429, http.Header{"Content-Type": {"application/json"}, "Retry-After": {"5"}}, status}},
		{"text-429", cannedRT{429, http.Header{"Content-Type": {"text/plain"}, "Retry-After": {"5"}}, []byte("Too many requests, please try again later.\n")}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rt := wholeAnswers(tc.rt)
			req := httptest.NewRequest("GET", "https://127.0.0.1/api/v1/nodes/n1", nil)
			b.ReportAllocs()
			for range b.N {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}
