package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/report"
)

// Through the daemon: a True whose check then fails (nodes.json replaced by
// a directory) stays True with its transition time, and the status document
// says it is held and what the failed run found; once the check decides
// again nothing is held.
func TestStatusShowsATrueHeldThroughAFailedRun(t *testing.T) {
	cfg := testConfig(t)
	cfg.Metrics.ListenAddress = "127.0.0.1:0"
	stat := fmt.Sprintf("cpu 0 0 0 0\nbtime %d\n", time.Now().Add(-time.Hour).Unix())
	if err := os.WriteFile(filepath.Join(cfg.HostRoot, checks.ProcStat), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.HostRoot, cfg.Checks.NodeInfoStale.Path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	nodeInfo := func() ConditionStatus {
		for _, c := range d.Status(time.Now()).Conditions {
			if c.Type == "NodeInfoStale" {
				return c
			}
		}
		return ConditionStatus{}
	}
	await(t, d, "NodeInfoStale True", func() bool { return nodeInfo().Status == report.StatusTrue })
	was := nodeInfo()
	if was.Held != nil {
		t.Errorf("held after a run that decided: %+v", was.Held)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	d.currentRunner().Wake("NodeInfoStale")
	await(t, d, "the failed run held", func() bool { return nodeInfo().Held != nil })
	c := nodeInfo()
	if c.Status != report.StatusTrue || c.Reason != report.ReasonNodeInfoInvalid || !c.LastTransitionTime.Equal(was.LastTransitionTime) ||
		c.Held.Runs != 1 || c.Held.Reason != report.ReasonCheckFailed || !strings.HasSuffix(c.Held.Message, "nodes.json is a directory") {
		t.Errorf("after one failed run: %+v held %+v; want True since %v, held through 1 CheckFailed", c.Condition, c.Held, was.LastTransitionTime)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{torn again"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.currentRunner().Wake("NodeInfoStale")
	await(t, d, "the check deciding again", func() bool { return nodeInfo().Held == nil })
	if c := nodeInfo(); c.Status != report.StatusTrue || !c.LastTransitionTime.Equal(was.LastTransitionTime) {
		t.Errorf("after the check decided again: %+v, want True since %v", c.Condition, was.LastTransitionTime)
	}
}

// Through the daemon: the evidence of a True held through a failed run is
// that of the run that decided it (the certificate and its expiry), and what
// the failed run collected (the file's "not a regular file") is the held
// failure's own evidence, in the document (--json) under
// heldThroughFailure.evidence. Before, the condition's evidence was the
// failed run's, shown beside the message of the run that decided True.
func TestStatusEvidenceOfATrueHeldIsTheDecidingRuns(t *testing.T) {
	cfg := testConfig(t)
	cfg.Metrics.ListenAddress = "127.0.0.1:0"
	const certPath = "/var/lib/kubelet/pki/kubelet-client-current.pem"
	cfg.Checks.CertRenewalFailing.Certificates = []string{certPath}
	path := filepath.Join(cfg.HostRoot, certPath)
	writeFile(t, path, nodeCertPEM(t, "system:node:test-node"))
	d, err := New(cfg, quietLog(), Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, d)
	defer stop()
	certs := func() ConditionStatus {
		for _, c := range d.Status(time.Now()).Conditions {
			if c.Type == "CertRenewalFailing" {
				return c
			}
		}
		return ConditionStatus{}
	}
	await(t, d, "CertRenewalFailing True", func() bool { return certs().Status == report.StatusTrue })
	asJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	decided := asJSON(certs().Evidence)
	if !strings.Contains(decided, `"notAfter"`) || strings.Contains(decided, `"error"`) {
		t.Fatalf("evidence of the run that decided True: %s", decided)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	d.currentRunner().Wake("CertRenewalFailing")
	await(t, d, "the failed run held", func() bool { return certs().Held != nil })
	c := certs()
	if c.Status != report.StatusTrue || c.Reason != report.ReasonCertificateExpiringSoon || c.Held.Runs != 1 || !strings.HasSuffix(c.Held.Message, "not a regular file") {
		t.Fatalf("after one failed run: %+v held %+v; want True held through 1 failed run", c.Condition, c.Held)
	}
	if got := asJSON(c.Evidence); got != decided {
		t.Errorf("evidence of the held True: %s\nwant the deciding run's: %s", got, decided)
	}
	if got, want := asJSON(c.Held.Evidence), `{"certs.certs":[{"path":"`+certPath+`","error":"not a regular file"}]}`; got != want {
		t.Errorf("the failed run's evidence: %s\nwant %s", got, want)
	}
	// The document: the fields of heldThroughFailure as before, its
	// evidence added.
	var doc map[string]any
	if err := json.Unmarshal([]byte(asJSON(c)), &doc); err != nil {
		t.Fatal(err)
	}
	held, _ := doc["heldThroughFailure"].(map[string]any)
	for _, k := range []string{"runs", "since", "reason", "message", "evidence"} {
		if _, ok := held[k]; !ok {
			t.Errorf("heldThroughFailure lacks %q: %s", k, asJSON(doc))
		}
	}
	// The check decides again: nothing held, the evidence its own.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, nodeCertPEM(t, "system:node:test-node"))
	d.currentRunner().Wake("CertRenewalFailing")
	await(t, d, "the check deciding again", func() bool { return certs().Held == nil })
	if got := asJSON(certs().Evidence); strings.Contains(got, `"error"`) || !strings.Contains(got, `"notAfter"`) {
		t.Errorf("evidence after the check decided again: %s", got)
	}
}
