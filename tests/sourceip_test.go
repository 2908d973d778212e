//go:build integration

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// auditPolicy logs every request at Metadata level, as a cluster that audits
// would; alice's configmap creates at Request level (the body is logged),
// so that a few of them fill kube-apiserver's 1 MiB log and rotate it.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  users: ["alice"]
  verbs: ["create"]
  resources: [{group: "", resources: ["configmaps"]}]
- level: Metadata
`

// auditAPI is a kube-apiserver of its own that writes an audit log and
// rotates it at 1 MiB.
type auditAPI struct {
	t     *testing.T
	s     *harness.APIServer
	alice *http.Client // user alice, in system:masters (allowed everything)
	node  *http.Client // system:node:n1, one of the cluster's own components
	n     int
}

func startAuditAPI(t *testing.T) *auditAPI {
	t.Helper()
	dir, err := os.MkdirTemp("", "autopilot-health-audit-")
	if err != nil {
		t.Fatal(err)
	}
	s, err := harness.StartAPIServerWith(dir, harness.APIOptions{AuditPolicy: auditPolicy, AuditLogMaxSizeMB: 1, AuditLogMaxBackups: 10})
	t.Cleanup(func() {
		if s != nil {
			s.Stop()
		}
		if t.Failed() {
			t.Logf("kube-apiserver's logs and audit log kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	if err != nil {
		t.Fatalf("real kube-apiserver with an audit log: %v", err)
	}
	a := &auditAPI{t: t, s: s}
	if a.alice, err = s.HTTPClient("alice", []string{"system:masters"}); err != nil {
		t.Fatal(err)
	}
	if a.node, err = s.HTTPClient("system:node:n1", []string{"system:nodes"}); err != nil {
		t.Fatal(err)
	}
	return a
}

// do sends a request, with X-Forwarded-For when xff is set, and waits until
// kube-apiserver has written its ResponseComplete record (found by the
// Audit-Id it answered with, in the log or a rotated file). It returns the
// record's sourceIPs as written.
func (a *auditAPI) do(c *http.Client, method, path string, body []byte, xff string) []string {
	a.t.Helper()
	req, err := http.NewRequest(method, a.s.URL+path, bytes.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	resp, err := c.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusForbidden {
		a.t.Fatalf("%s %s: %s", method, path, resp.Status)
	}
	id := resp.Header.Get("Audit-Id")
	if id == "" {
		a.t.Fatalf("%s %s: no Audit-Id header in the answer", method, path)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ips, ok := a.findRecord(id); ok {
			return ips
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("kube-apiserver wrote no ResponseComplete record for audit ID %s within 30s", id)
		}
		time.Sleep(20 * time.Millisecond) // polling interval of an awaited condition
	}
}

func (a *auditAPI) findRecord(id string) ([]string, bool) {
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(a.s.AuditLog), "*"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			if !bytes.Contains(sc.Bytes(), []byte(id)) {
				continue
			}
			var ev struct {
				AuditID   string   `json:"auditID"`
				Stage     string   `json:"stage"`
				SourceIPs []string `json:"sourceIPs"`
			}
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.AuditID == id && ev.Stage == "ResponseComplete" {
				fh.Close()
				return ev.SourceIPs, true
			}
		}
		fh.Close()
	}
	return nil, false
}

// get is a GET of the configmaps of default by c.
func (a *auditAPI) get(c *http.Client, xff string) []string {
	a.t.Helper()
	return a.do(c, http.MethodGet, "/api/v1/namespaces/default/configmaps", nil, xff)
}

// bigCreate creates a configmap of 300 KiB as alice (logged with its body).
func (a *auditAPI) bigCreate(xff string) {
	a.t.Helper()
	a.n++
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big-%d"},"data":{"x":%q}}`, a.n, strings.Repeat("a", 300<<10))
	a.do(a.alice, http.MethodPost, "/api/v1/namespaces/default/configmaps", []byte(body), xff)
}

func (a *auditAPI) inode() uint64 {
	a.t.Helper()
	fi, err := os.Stat(a.s.AuditLog)
	if err != nil {
		a.t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// rotate creates big configmaps as alice until kube-apiserver has rotated
// its log (audit.log is a new file); it returns how many it created.
func (a *auditAPI) rotate() int {
	a.t.Helper()
	before := a.inode()
	for i := 1; i <= 10; i++ {
		a.bigCreate("")
		if a.inode() != before {
			return i
		}
	}
	a.t.Fatal("kube-apiserver did not rotate its 1 MiB audit log after 10 creates of 300 KiB")
	return 0
}

func sourceIPEnv(a *auditAPI, store *report.Store) *checks.Env {
	cfg := config.Default()
	cfg.Checks.APIServerSourceIPUnavailable.AuditLog = a.s.AuditLog
	env := &checks.Env{Config: cfg, NodeName: "cp1", Role: report.RoleControlPlane, Log: quiet(), Sys: checks.RealSys(), Now: time.Now}
	if store != nil {
		env.Memos = store
	}
	return env
}

func probeSourceIP(t *testing.T, c checks.Check, status report.Status, reason report.Reason, msgHas ...string) string {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	t.Logf("%s/%s: %s", r.Status, r.Reason, r.Message)
	if r.Status != status || r.Reason != reason {
		t.Fatalf("got %s/%s %q, want %s/%s", r.Status, r.Reason, r.Message, status, reason)
	}
	for _, s := range msgHas {
		if !strings.Contains(r.Message, s) {
			t.Errorf("message %q lacks %q", r.Message, s)
		}
	}
	return r.Message
}

// APIServerSourceIPUnavailable against what a real kube-apiserver writes to
// its audit log: alice's requests through a proxy that sets X-Forwarded-For
// carry the client address (False); without the header only the proxy's
// loopback address (True); a window with only the cluster's own components
// (a node, even from a client address) is Unknown. A daemon restart resumes
// where the last probe left off, and the check follows the log across
// kube-apiserver's own rotation (lumberjack: rename, new file), reading the
// rest of the renamed file first.
func TestSourceIPAgainstRealAuditLog(t *testing.T) {
	a := startAuditAPI(t)
	store := report.NewStore("boot-1")
	c, err := checks.NewForTest("APIServerSourceIPUnavailable", sourceIPEnv(a, store))
	if err != nil {
		t.Fatal(err)
	}

	// kube-apiserver's sourceIPs: the X-Forwarded-For entries, then the
	// connection's remote address.
	if ips := a.get(a.alice, "203.0.113.7"); !slices.Equal(ips, []string{"203.0.113.7", "127.0.0.1"}) {
		t.Fatalf("sourceIPs of a request with X-Forwarded-For: %q", ips)
	}
	probeSourceIP(t, c, report.StatusFalse, report.ReasonSourceIPAvailable, "(203.0.113.7)", "in the last 1m")

	if ips := a.get(a.alice, ""); !slices.Equal(ips, []string{"127.0.0.1"}) {
		t.Fatalf("sourceIPs of a request without X-Forwarded-For: %q", ips)
	}
	probeSourceIP(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by users outside the cluster's own components since ", "their sourceIPs hold only 127.0.0.1")

	// Only a component of the cluster, even one with a client address.
	if ips := a.get(a.node, "203.0.113.7"); !slices.Equal(ips, []string{"203.0.113.7", "127.0.0.1"}) {
		t.Fatalf("sourceIPs of the node's request: %q", ips)
	}
	probeSourceIP(t, c, report.StatusUnknown, report.ReasonNoAuditRecords, "has no record of a request by a user outside the cluster's own components (user names starting with system:)")

	// The daemon restarts within the boot: the new check resumes where the
	// last probe left off. One that started afresh would look at the last
	// minute and see 203.0.113.7 from above too.
	state := t.TempDir()
	if err := store.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}
	store2 := report.NewStore("boot-1")
	if _, err := store2.Load(state); err != nil {
		t.Fatal(err)
	}
	c2, err := checks.NewForTest("APIServerSourceIPUnavailable", sourceIPEnv(a, store2))
	if err != nil {
		t.Fatal(err)
	}
	a.get(a.alice, "203.0.113.9")
	probeSourceIP(t, c2, report.StatusFalse, report.ReasonSourceIPAvailable, "1 of 1 audit records", "(203.0.113.9)")

	// Rotation. First fill the log once, so that the next file has room for
	// the record below.
	n := a.rotate()
	probeSourceIP(t, c2, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		fmt.Sprintf("none of the %d audit records", n), "the log was rotated; read the rest of audit-")
	ino := a.inode()
	a.get(a.alice, "203.0.113.7")
	if a.inode() != ino {
		t.Fatal("kube-apiserver rotated its log on a small record; the test expected room")
	}
	n = a.rotate()
	// The record with the client address is in the renamed file, after the
	// last probe's position: it is read there.
	probeSourceIP(t, c2, report.StatusFalse, report.ReasonSourceIPAvailable,
		fmt.Sprintf("1 of %d audit records", n+1), "(203.0.113.7)", "the log was rotated; read the rest of audit-")
	// And the check continues with the new file.
	a.get(a.alice, "")
	probeSourceIP(t, c2, report.StatusTrue, report.ReasonSourceIPMissingInAudit, "none of the 1 audit records", "only 127.0.0.1")
	a.get(a.alice, "203.0.113.9")
	probeSourceIP(t, c2, report.StatusFalse, report.ReasonSourceIPAvailable, "1 of 1 audit records", "(203.0.113.9)")
	probeSourceIP(t, c2, report.StatusUnknown, report.ReasonNoAuditRecords)
}
