//go:build integration

package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	mathbig "math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tests/harness"
)

// Every event reason of the catalog, emitted twice with the node's own
// credentials (NodeRestriction on), lands on the real API server as one
// Event about the Node with a count of 2: its reason, in namespace default,
// the involvedObject the Node (kubelet's convention: UID = node name), source
// autopilot-health, and type Warning for a problem (the spec's temp rules)
// and Normal for an operator's action (TamperCleared), which is no problem
// and must not show among the node's warnings.
func TestKubeEveryCatalogEventLandsAsOneAggregatedNodeEvent(t *testing.T) {
	s := apiServer(t)
	node := "node-catalog-events-" + harness.Token()
	registerNode(t, s, node)
	client, _ := nodeClient(t, s, node)
	store := report.NewStore("boot")
	startReporter(t, client, node, store)
	msg := func(e report.EventDesc) string { return fmt.Sprintf("%s on %s", e.Reason, node) }
	for range 2 {
		for _, e := range report.Events {
			store.Emit(report.Event{Reason: e.Reason, Message: msg(e), Time: time.Now()})
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := s.Admin.CoreV1().Events(kube.EventNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		if err != nil {
			t.Fatal(err)
		}
		byReason := map[string]corev1.Event{}
		counted := 0
		for _, e := range evs.Items {
			byReason[e.Reason] = e
			if e.Count == 2 {
				counted++
			}
		}
		if len(evs.Items) == len(report.Events) && counted == len(report.Events) {
			for _, d := range report.Events {
				e, ok := byReason[d.Reason]
				if !ok {
					t.Errorf("%s: no Event", d.Reason)
					continue
				}
				want := corev1.EventTypeWarning
				if d.Operator {
					want = corev1.EventTypeNormal
				}
				if e.Type != want {
					t.Errorf("%s: type %s, want %s", d.Reason, e.Type, want)
				}
				o := e.InvolvedObject
				if o.Kind != "Node" || o.Name != node || string(o.UID) != node || o.APIVersion != "v1" || o.Namespace != "" {
					t.Errorf("%s: involvedObject %+v", d.Reason, o)
				}
				if e.Namespace != "default" || e.Source.Component != "autopilot-health" || e.Source.Host != node || e.Message != msg(d) {
					t.Errorf("%s: %+v", d.Reason, e)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Events (want %d), %d with count 2: %+v", len(evs.Items), len(report.Events), counted, byReason)
		}
		time.Sleep(100 * time.Millisecond) // polling interval of an awaited condition
	}
}

// catalogSys is the host's system calls with statfs answered from a table
// and adjtimex from fields (the clock is not the test's to step).
type catalogSys struct {
	checks.Sys
	mu     sync.Mutex
	statfs map[string]unix.Statfs_t
	timex  unix.Timex
}

func (f *catalogSys) Statfs(path string, st *unix.Statfs_t) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.statfs[path]
	if !ok {
		return unix.ENOENT
	}
	*st = v
	return nil
}

func (f *catalogSys) Adjtimex(tx *unix.Timex) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*tx = f.timex
	return 0, nil // TIME_OK; the status and error fields decide
}

func (f *catalogSys) SinceBoot() (time.Duration, error) { return 24 * time.Hour, nil } // past every boot grace

func (f *catalogSys) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// catalogCert writes a self-signed certificate expiring at notAfter to path,
// of a year's lifetime (kubeadm's kubelet certificates): a shorter one is
// judged by the last tenth of its lifetime, not renew_within's 7 days.
func catalogCert(t *testing.T, path string, notAfter time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: mathbig.NewInt(1), Subject: pkix.Name{CommonName: "system:node:n"},
		NotBefore: notAfter.Add(-365 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// catalogWrite writes data to path, creating its directory.
func catalogWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every check's condition that a fake host root (files, a local endpoint,
// injected statfs and adjtimex) can drive, run by the runner and written by
// the reporter with the node's own credentials (NodeRestriction on) to the
// real API server: True with a problem reason of its catalog row and the
// check's message, held (lastTransitionTime unchanged) through a second
// sick run, then False with the row's healthy reason and a later
// lastTransitionTime once the host is healthy, unchanged again by one more
// healthy run. The conditions not here are driven through the real API
// server by their own tests (systemd's, the kernel log's, the tamper ones,
// GpuActivationFailed, APIServerSourceIPUnavailable, KubeletHeartbeatFailed)
// or need an NVMe drive (DisksFailure's SMART part, DiskWearHigh,
// DiskTemperatureHigh).
func TestKubeCatalogConditionsSetAndClearedByTheirChecks(t *testing.T) {
	harness.Parallel(t, 0)
	s := apiServer(t)
	type tc struct {
		cond    string
		setup   func(t *testing.T, root string, cfg *config.Config, sys *catalogSys) (sick, healthy func())
		problem report.Reason
	}
	for _, c := range []tc{
		{"CertRenewalFailing", func(t *testing.T, root string, cfg *config.Config, _ *catalogSys) (func(), func()) {
			p := "/var/lib/kubelet/pki/kubelet-client-current.pem"
			cfg.Checks.CertRenewalFailing.Certificates = []string{p}
			return func() { catalogCert(t, filepath.Join(root, p), time.Now().Add(24*time.Hour)) },
				func() { catalogCert(t, filepath.Join(root, p), time.Now().Add(30*24*time.Hour)) }
		}, report.ReasonCertificateExpiringSoon},
		{"NodeInfoStale", func(t *testing.T, root string, cfg *config.Config, _ *catalogSys) (func(), func()) {
			catalogWrite(t, filepath.Join(root, "proc/stat"), fmt.Sprintf("cpu  1 0 1 1 0 0 0 0 0 0\nbtime %d\n", time.Now().Add(-24*time.Hour).Unix()))
			p := filepath.Join(root, cfg.Checks.NodeInfoStale.Path)
			catalogWrite(t, p, `{"nodes":[]}`)
			touch := func(at time.Time) {
				if err := os.Chtimes(p, at, at); err != nil {
					t.Fatal(err)
				}
			}
			return func() { touch(time.Now().Add(-10 * time.Minute)) }, func() { touch(time.Now()) }
		}, report.ReasonNodeInfoOutdated},
		{"ClockNotSynchronized", func(t *testing.T, _ string, _ *config.Config, sys *catalogSys) (func(), func()) {
			return func() { sys.set(func() { sys.timex = unix.Timex{Esterror: 6_000_000, Maxerror: 7_000_000} }) },
				func() { sys.set(func() { sys.timex = unix.Timex{Esterror: 1000, Maxerror: 2000} }) }
		}, report.ReasonClockErrorTooLarge},
		{"DiskUsageHigh", func(t *testing.T, root string, cfg *config.Config, sys *catalogSys) (func(), func()) {
			catalogWrite(t, filepath.Join(root, "proc/self/mountinfo"), "29 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n")
			cfg.Checks.DiskUsageHigh.LVMCommand = ""
			fs := func(freePct uint64) func() {
				return func() {
					sys.set(func() {
						sys.statfs = map[string]unix.Statfs_t{root: {Bsize: 4096, Frsize: 4096, Blocks: 1000, Bfree: freePct * 10, Bavail: freePct * 10, Files: 1000, Ffree: 900}}
					})
				}
			}
			return fs(5), fs(50)
		}, report.ReasonFilesystemSpaceHigh},
		{"ProxyNotServing", func(t *testing.T, _ string, cfg *config.Config, _ *catalogSys) (func(), func()) {
			var ready atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "# TYPE ready gauge\nready %d\n", ready.Load())
			}))
			t.Cleanup(srv.Close)
			cfg.Checks.ProxyNotServing.MetricsURL = srv.URL + "/metrics"
			return func() { ready.Store(0) }, func() { ready.Store(1) }
		}, report.ReasonProxyNotReady},
		{"CNIUnhealthy", func(t *testing.T, root string, cfg *config.Config, _ *catalogSys) (func(), func()) {
			sock := filepath.Join(root, cfg.Checks.CNIUnhealthy.Socket)
			if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
				t.Fatal(err)
			}
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			var state atomic.Value
			state.Store("Ok")
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, `{"cilium":{"state":%q,"msg":"checked"}}`, state.Load())
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			// Healthy once in this boot first: before that the check's
			// boot grace answers Unknown, NoData.
			return func() { state.Store("Failure") }, func() { state.Store("Ok") }
		}, report.ReasonCiliumNotOk},
	} {
		t.Run(c.cond, func(t *testing.T) {
			d, ok := report.Lookup(c.cond)
			if !ok || !slices.Contains(d.ProblemReasons, c.problem) {
				t.Fatalf("%s: %s is not a problem reason of its catalog row %+v", c.cond, c.problem, d)
			}
			// Short: the cilium socket's path under it fits a sockaddr_un.
			root, err := os.MkdirTemp("", "cat")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			cfg := config.Default()
			cfg.HostRoot = root
			cfg.Runner.FirstRunSpread = config.Duration{}
			sys := &catalogSys{Sys: checks.RealSys()}
			sick, healthy := c.setup(t, root, cfg, sys)
			node := "node-catalog-" + strings.ToLower(c.cond) + "-" + harness.Token()
			store := reporting(t, s, node, 3*time.Second, quiet(), nil).store
			env := &checks.Env{Config: cfg, NodeName: node, Role: report.RoleWorker, Log: quiet(), Sys: sys, Now: time.Now}
			r, err := checks.NewRunner(env, checks.Options{Store: store, Only: []string{c.cond}})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Checks(); len(got) != 1 || got[0] != c.cond {
				t.Fatalf("runner runs %v, want %s", got, c.cond)
			}
			run := func() report.Condition {
				t.Helper()
				out := r.RunOnce(context.Background())
				if len(out) != 1 {
					t.Fatalf("run: %+v", out)
				}
				return out[0]
			}
			if c.cond == "CNIUnhealthy" {
				healthy()
				if got := run(); got.Status != report.StatusFalse {
					t.Fatalf("first healthy run: %+v", got)
				}
			}
			onNode := func(what string, want report.Condition) *corev1.NodeCondition {
				t.Helper()
				n := waitNode(t, s, node, what, func(n *corev1.Node) bool {
					nc := cond(n, c.cond)
					return nc != nil && string(nc.Status) == string(want.Status) && nc.Reason == string(want.Reason) && nc.Message == want.Message
				})
				readyIntact(t, n)
				return cond(n, c.cond)
			}

			sick()
			got := run()
			if got.Status != report.StatusTrue || got.Reason != c.problem || got.Message == "" {
				t.Fatalf("sick: %+v, want True/%s with a message", got, c.problem)
			}
			set := onNode("True", got).LastTransitionTime
			again := run()
			if again.Status != report.StatusTrue {
				t.Fatalf("sick again: %+v", again)
			}
			// The API keeps whole seconds: heal in a later second, or
			// the move of lastTransitionTime is invisible.
			time.Sleep(time.Until(set.Add(time.Second))) // the API's one-second resolution, not a wait for a condition
			if nc := refreshedCondition(t, s, node, c.cond); !nc.LastTransitionTime.Equal(&set) {
				t.Errorf("a second True run moved lastTransitionTime: %v, was %v", nc.LastTransitionTime, set)
			}

			healthy()
			got = run()
			if got.Status != report.StatusFalse || got.Reason != d.HealthyReason || got.Message == "" {
				t.Fatalf("healthy: %+v, want False/%s with a message", got, d.HealthyReason)
			}
			cleared := onNode("False", got).LastTransitionTime
			if !cleared.After(set.Time) {
				t.Errorf("True to False did not move lastTransitionTime: %v, was %v", cleared, set)
			}
			run()
			if nc := refreshedCondition(t, s, node, c.cond); !nc.LastTransitionTime.Equal(&cleared) || nc.Status != corev1.ConditionFalse {
				t.Errorf("a second False run: %+v, lastTransitionTime was %v", nc, cleared)
			}
		})
	}
}

// refreshedCondition is the condition as the Node holds it after a report
// refresh answered after everything before (refreshedAfter): a write the
// reporter had pending has landed.
func refreshedCondition(t *testing.T, s *harness.APIServer, node, ty string) *corev1.NodeCondition {
	t.Helper()
	c := cond(refreshedAfter(t, s, node), ty)
	if c == nil {
		t.Fatalf("%s gone from the Node", ty)
	}
	return c
}
