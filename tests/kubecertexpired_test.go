//go:build integration

package tests

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/certificate"

	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// A node whose kubelet client certificate has expired, against the real
// kube-apiserver (Node authorizer, NodeRestriction) and the shipped binary:
// the daemon starts with a kubeconfig naming kubelet-client-current.pem
// whose certificate, signed by the API server's client CA for
// system:node:<name> in system:nodes, expired before the start. The API
// server answers 401; the daemon runs on without spinning and with a few
// log lines, not one per retry, and once no write has landed for 60 s
// `autopilot-health status` says "credentials rejected by the API server
// (401 Unauthorized)". Then the kubelet's certificate manager rotates it
// (client-go's certificate.FileStore, as the kubelet does: a new
// kubelet-client-<time>.pem, a kubelet-client-updated.pem symlink to it,
// the current link removed and the updated one renamed over it): the
// daemon notices the files changed while its calls are refused (a stat a
// second, credsLoop), wakes the writers from the backoff's wait then under
// way (up to a minute), and its next call uses the new pair, logged once:
// the Node gets its conditions and the five report annotations within a
// few seconds of the rotation (5 s allowed here), and the note goes.
// Without the wake the Node waited out the backoff (25 and 34 s measured);
// without the reload (rotatingClient keeping its first pair) it gets
// nothing.
func TestKubeletClientCertExpiredThenRotated(t *testing.T) {
	// Mostly waits (the 60 s grace, the backoff): beside the other
	// Parallel tests. Its Node, ports, sockets and kernel log rules are
	// its own, and it writes no kernel lines.
	harness.Parallel(t, 0)
	n := newKernelNode(t)
	s := n.api
	// DiskUsageHigh on, for a condition and a storage report to land.
	cfg := mustRead(t, n.cfgPath)
	m := regexp.MustCompile(`(?m)^kubeconfig = "(.*)"$`).FindStringSubmatch(cfg)
	if m == nil {
		t.Fatalf("no kubeconfig in\n%s", cfg)
	}
	kc := m[1]
	cfg = strings.Replace(cfg, "[checks.DiskUsageHigh]\nenabled = false\n", "", 1)
	if err := os.WriteFile(n.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(t.TempDir(), "pki")
	store, err := certificate.NewFileStore("kubelet-client", pki, pki, "", "")
	if err != nil {
		t.Fatal(err)
	}
	user, groups := "system:node:"+n.name, []string{"system:nodes"}
	expiredCert, expiredKey, err := s.CA.Issue(user, groups, false, time.Now().Add(-30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Update(expiredCert, expiredKey); err != nil {
		t.Fatal(err)
	}
	current := filepath.Join(pki, "kubelet-client-current.pem")
	if err := s.WriteKubeconfig(kc, "node", current); err != nil {
		t.Fatal(err)
	}

	// The API server itself refuses the expired certificate: 401.
	pair, err := tls.X509KeyPair(expiredCert, expiredKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.CA.Cert)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}
	resp, err := hc.Get(s.URL + "/api/v1/nodes/" + n.name)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	hc.CloseIdleConnections()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the API server answers the expired certificate %s, want 401", resp.Status)
	}

	start := n.start()
	// The note: not before 60 s (the shipped NodeStaleAfter) of failed
	// calls, and within 30 s after.
	const staleAfter = 60 * time.Second
	var st = n.statusDoc()
	for deadline := start.Add(staleAfter + 30*time.Second); ; {
		var err error
		st, _, err = n.askStatus()
		if err == nil && st.Kubernetes.NodeNotUpdated != nil {
			break
		}
		select {
		case <-n.exited:
			t.Fatalf("the daemon exited with the expired certificate:\n%s", n.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no note of the Node not updated %s after the start: %+v, %v", time.Since(start).Round(time.Second), st.Kubernetes, err)
		}
		time.Sleep(200 * time.Millisecond) // polling the daemon's status for the note
	}
	saidAt := time.Now()
	note := st.Kubernetes.NodeNotUpdated
	if note.Reason != "credentials rejected by the API server (401 Unauthorized)" || !strings.Contains(note.Error, "Unauthorized") {
		t.Errorf("the note: %+v", *note)
	}
	if d := saidAt.Sub(note.FailingSince); d < staleAfter {
		t.Errorf("said %s after the first failed call, before the %s of the grace", d.Round(time.Millisecond), staleAfter)
	}
	// Backoff, no spin: 1 s doubling with jitter (half of it at least)
	// fits 7 tries in 60 s; a loop retrying at once makes hundreds.
	if note.Failures < 2 || note.Failures > 10 {
		t.Errorf("%d failed calls in a row in %s, want the backoff's few", note.Failures, saidAt.Sub(note.FailingSince).Round(time.Second))
	}
	code, out, errs := statusOf(t, n)
	if want := "Status: Node NOT updated since "; !strings.Contains(out, want) ||
		!strings.Contains(out, "credentials rejected by the API server (401 Unauthorized); ") {
		t.Errorf("autopilot-health status (exit %d) with the expired certificate:\n%s%s", code, out, errs)
	}
	t.Logf("%s after the start: %s (%d calls failed)", saidAt.Sub(start).Round(time.Millisecond), note.Note(), note.Failures)

	// The kubelet's certificate manager rotates the certificate.
	validCert, validKey, err := s.CA.Issue(user, groups, false, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Update(validCert, validKey); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	// credsPoll (1 s), then the read, the status write and the report's
	// write: 5 s allowed on a loaded machine.
	node := waitNodeFor(t, s, n.name, 5*time.Second, "the conditions and the report within 5 s of the rotation", func(node *corev1.Node) bool {
		c := cond(node, "DiskUsageHigh")
		if c == nil || cond(node, "ReadonlyFilesystem") == nil {
			return false
		}
		for _, d := range report.Domains {
			if _, ok := node.Annotations[report.AnnotationPrefix+d.Name]; !ok {
				return false
			}
		}
		return strings.Contains(node.Annotations[report.AnnotationPrefix+"storage"], `"filesystems":[{`)
	})
	landed := time.Now()
	readyIntact(t, node)
	eventually(t, 30*time.Second, "the note gone from status", func() (bool, string) {
		st, _, err := n.askStatus()
		return err == nil && st.Kubernetes.NodeNotUpdated == nil, fmt.Sprintf("%+v, %v", st.Kubernetes, err)
	})
	// "401 Unauthorized", not a bare "401": the output names temporary
	// paths whose random digits may hold it (CI, 2026-12-07:
	// /tmp/autopilot-health-apiserver-2804018585).
	if code, out, _ := statusOf(t, n); strings.Contains(out, "NOT updated") || strings.Contains(out, "401 Unauthorized") || strings.Contains(out, "credentials rejected") {
		t.Errorf("autopilot-health status (exit %d) after the rotation:\n%s", code, out)
	}
	t.Logf("on the Node %s after the rotation", landed.Sub(rotated).Round(time.Millisecond))

	n.stop()
	// The log, read once the daemon has exited: the lines of the expired
	// window, and the reload.
	var refused, before, reloads []string
	sc := bufio.NewScanner(strings.NewReader(n.logs.String()))
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		at, ok := logTime(line)
		if strings.Contains(line, "client certificate reloaded") {
			reloads = append(reloads, line)
		}
		if !ok || at.After(rotated) {
			continue
		}
		before = append(before, line)
		if strings.Contains(line, "Unauthorized") {
			refused = append(refused, line)
		}
	}
	// Each API writer says its failure once (the same error again is not
	// logged): the Node's read and the Events, one line each, and nothing
	// for the writes that wait for the read.
	if len(refused) == 0 || len(refused) > 3 {
		t.Errorf("%d log lines about the refused credentials in %s, want 1 to 3:\n%s", len(refused), rotated.Sub(start).Round(time.Second), strings.Join(refused, "\n"))
	}
	if len(reloads) != 1 {
		t.Errorf("the reload logged %d times, want once:\n%s", len(reloads), strings.Join(reloads, "\n"))
	}
	t.Logf("%d log lines in the %s with the expired certificate, %d of them about the 401", len(before), rotated.Sub(start).Round(time.Second), len(refused))
}

var logTimeRE = regexp.MustCompile(`^time=(\S+) `)

// logTime is the time of a line of the daemon's text log.
func logTime(line string) (time.Time, bool) {
	m := logTimeRE.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	return at, err == nil
}
