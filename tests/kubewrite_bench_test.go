//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
	"github.com/syself/autopilot-health/tests/harness"
)

// recordingClient keeps the body of the last report refresh the reporter
// sent: a merge patch of the Node (the annotations alone) and a
// nodes/status patch (the annotations with the conditions' heartbeat).
type recordingClient struct {
	kube.Client
	mu                sync.Mutex
	annotations, fold []byte
}

func (c *recordingClient) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	n, err := c.Client.PatchNode(ctx, name, patch)
	if err == nil && bytes.Contains(patch, []byte("autopilot.syself.com/")) {
		c.mu.Lock()
		c.annotations = bytes.Clone(patch)
		c.mu.Unlock()
	}
	return n, err
}

func (c *recordingClient) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	n, err := c.Client.PatchNodeStatus(ctx, name, patch)
	if err == nil && bytes.Contains(patch, []byte("autopilot.syself.com/")) {
		c.mu.Lock()
		c.fold = bytes.Clone(patch)
		c.mu.Unlock()
	}
	return n, err
}

// BenchmarkKubeWrite splits what one idle write of the report costs the
// daemon's process, against the real kube-apiserver (NodeRestriction, the
// node's own ECDSA P-256 client certificate, as a kubelet's rotated one is):
//
//   - tcp: a TCP connection to the API server, opened and closed;
//   - tls-full, tls-resumed: the same with a TLS handshake, in full and
//     resumed from the session of the connection before (the client
//     certificate presented, the server's chain verified, as the daemon's
//     client does); tls-full-x25519: in full with X25519 alone, not Go's
//     default hybrid X25519MLKEM768 (what the post-quantum key share costs);
//   - annotations-kept, fold-kept: the report's write on a kept connection
//     (the request and its answer, the Node decoded), the body the
//     reporter sent: a merge patch of the five annotations, and the
//     nodes/status patch that also carries the conditions' heartbeat;
//   - annotations-new, fold-new: the same, each on a new connection closed
//     after it, as the daemon writes every 2 minutes (the API server closes
//     a connection idle for 90 s): dial, resumed TLS, the request, close.
//
// On one processor, as the daemon runs; the client's CPU per write (its
// threads' schedstat: the API server is a process of its own) and its
// threads' wake-ups. Writes 200 ms apart (the client's rate limit is 5 a
// second), and the heap the process allocated per write. Building the
// documents is BenchmarkWriteAnnotations
// (report/kube), in process.
//
//	go test -tags integration ./tests -run '^$' -bench KubeWrite -benchtime 100x
func BenchmarkKubeWrite(b *testing.B) {
	s := apiServer(b)
	node := "node-write-bench-" + harness.Token()
	registerNode(b, s, node)
	kc, err := s.NodeKubeconfig(node, time.Now().Add(time.Hour))
	if err != nil {
		b.Fatal(err)
	}
	base, _, err := kube.NewClient(kc, "autopilot-health-bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	rec := &recordingClient{Client: base}
	annotations, fold := recordRefresh(b, rec, node)

	u, err := url.Parse(s.URL)
	if err != nil {
		b.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(filepath.Dir(kc), "client.pem"), filepath.Join(filepath.Dir(kc), "client.pem"))
	if err != nil {
		b.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(s.Dir, "pki", "ca.crt"))
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	sessions, sessionsX := tls.NewLRUClientSessionCache(4), tls.NewLRUClientSessionCache(4)
	// livez sends GET /livez on c and reads the answer: the TLS 1.3
	// server's session ticket comes after the handshake, read with it.
	livez := func(b *testing.B, c *tls.Conn) {
		if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: "+u.Host+"\r\n\r\n"); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET /livez: %s", resp.Status)
		}
	}
	dialTLS := func(b *testing.B, cache tls.ClientSessionCache, curves []tls.CurveID) *tls.Conn {
		c, err := net.Dial("tcp", u.Host)
		if err != nil {
			b.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: u.Hostname(), RootCAs: pool, Certificates: []tls.Certificate{pair},
			NextProtos: []string{"http/1.1"}, ClientSessionCache: cache, CurvePreferences: curves})
		if err := tc.Handshake(); err != nil {
			b.Fatal(err)
		}
		return tc
	}
	handshake := func(b *testing.B, cache tls.ClientSessionCache, curves []tls.CurveID, resumed bool) {
		tc := dialTLS(b, cache, curves)
		defer tc.Close()
		livez(b, tc)
		if first := cache != nil && !resumed; !first && tc.ConnectionState().DidResume != resumed {
			b.Fatalf("the handshake resumed: %v, want %v", tc.ConnectionState().DidResume, resumed)
		}
	}
	var kept *tls.Conn
	write := func(b *testing.B, patch []byte, status, keep bool) {
		var err error
		if status {
			_, err = base.PatchNodeStatus(context.Background(), node, patch)
		} else {
			_, err = base.PatchNode(context.Background(), node, patch)
		}
		if err != nil {
			b.Fatal(err)
		}
		if !keep {
			base.(interface{ CloseIdle() }).CloseIdle()
		}
	}
	cases := []struct {
		name string
		op   func(b *testing.B, i int)
	}{
		{"pace", func(*testing.B, int) {}},
		{"tcp", func(b *testing.B, _ int) {
			c, err := net.Dial("tcp", u.Host)
			if err != nil {
				b.Fatal(err)
			}
			c.Close()
		}},
		{"livez-kept", func(b *testing.B, _ int) {
			if kept == nil {
				kept = dialTLS(b, nil, nil)
			}
			livez(b, kept)
		}},
		{"tls-full", func(b *testing.B, _ int) { handshake(b, nil, nil, false) }},
		{"tls-full-x25519", func(b *testing.B, _ int) { handshake(b, nil, []tls.CurveID{tls.X25519}, false) }},
		{"tls-resumed", func(b *testing.B, i int) { handshake(b, sessions, nil, i > 0) }},
		{"tls-resumed-x25519", func(b *testing.B, i int) { handshake(b, sessionsX, []tls.CurveID{tls.X25519}, i > 0) }},
		{"annotations-kept", func(b *testing.B, i int) { write(b, stamped(annotations, i), false, true) }},
		{"annotations-new", func(b *testing.B, i int) { write(b, stamped(annotations, i), false, false) }},
		{"fold-kept", func(b *testing.B, i int) { write(b, stamped(fold, i), true, true) }},
		{"fold-new", func(b *testing.B, i int) { write(b, stamped(fold, i), true, false) }},
	}
	answer, err := s.Admin.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + node).DoRaw(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("bodies: annotations %d bytes, fold %d bytes; the Node answered %d bytes", len(annotations), len(fold), len(answer))
	// The answer's decoding alone, in process, not paced.
	b.Run("decode-answer", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var n kubeapi.Node
			if err := json.Unmarshal(answer, &n); err != nil || n.Metadata.Name != node {
				b.Fatalf("%v, %q", err, n.Metadata.Name)
			}
		}
	})
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			tc.op(b, 0) // the first session, the first connection
			full0, resumed0 := kube.TLSHandshakes()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			cpu0, wakes0 := testenv.Threads(b)
			b.ResetTimer()
			for i := range b.N {
				time.Sleep(200 * time.Millisecond) // pacing, past the client's rate limit
				tc.op(b, i+1)
			}
			b.StopTimer()
			cpu1, wakes1 := testenv.Threads(b)
			runtime.ReadMemStats(&m1)
			full, resumed := kube.TLSHandshakes()
			if strings.HasSuffix(tc.name, "-new") && (full != full0 || resumed-resumed0 != int64(b.N)) {
				b.Fatalf("%d writes on new connections: %d full and %d resumed handshakes", b.N, full-full0, resumed-resumed0)
			}
			b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(wakes1-wakes0)/float64(b.N), "wakes/op")
			// The whole process's: the harness's own clients are idle.
			b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/1024/float64(b.N), "alloc-KiB/op")
		})
	}
}

// stamped is patch with its times (RFC 3339 seconds, as updatedAt and the
// heartbeat are written) moved on by i seconds, so that each write changes
// the Node as a refresh does.
func stamped(patch []byte, i int) []byte {
	return patchStamp.ReplaceAllFunc(patch, func(old []byte) []byte {
		t, err := time.Parse(time.RFC3339, string(old))
		if err != nil {
			return old
		}
		return []byte(t.Add(time.Duration(i) * time.Second).UTC().Format(time.RFC3339))
	})
}

var patchStamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)

// recordRefresh runs a reporter on rec until it has written the report
// both ways (alone, and folded with the heartbeat) and returns the bodies.
func recordRefresh(b *testing.B, rec *recordingClient, node string) (annotations, fold []byte) {
	store := report.NewStore("boot")
	det := report.NewDetails()
	det.SetBootID("boot")
	var fss []map[string]any
	for i := range 8 {
		fss = append(fss, map[string]any{"mountPoint": fmt.Sprintf("/var/lib/m%d", i), "usedPercent": 12})
	}
	det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: fss})
	now := time.Now()
	for _, c := range report.Conditions { // every condition of the catalog healthy
		if c.HealthyReason != "" {
			store.Set(report.Condition{Type: c.Type, Status: report.StatusFalse, Reason: c.HealthyReason, Message: "fine"}, now)
		}
	}
	// A heartbeat period shorter than the report interval would not fold;
	// one just past it folds every other refresh.
	r := kube.New(kube.Options{Client: rec, NodeName: node, Role: report.RoleWorker, Store: store, Details: det,
		Log: quiet(), Metrics: kube.NewMetrics(nil), HeartbeatPeriod: 3 * time.Second, ReportInterval: 2 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rec.mu.Lock()
		annotations, fold = rec.annotations, rec.fold
		rec.mu.Unlock()
		if annotations != nil && fold != nil {
			return annotations, fold
		}
		if time.Now().After(deadline) {
			b.Fatalf("no report refresh of each kind in 60 s (annotations %d bytes, fold %d bytes)", len(annotations), len(fold))
		}
		time.Sleep(50 * time.Millisecond) // polling an awaited condition
	}
}
