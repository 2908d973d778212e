//go:build integration

package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// statusOf runs the shipped binary's status against the node's socket:
// exit code, stdout, stderr.
func statusOf(t *testing.T, n *kernelNode, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(daemonBinary(t), append([]string{"status", "--socket", n.status}, args...)...)
	var out, errs strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errs
	err := cmd.Run()
	return exitCode(err), out.String(), errs.String()
}

// statusFieldsTyped checks that every field README names for `status
// --json` is there and typed as it says; it returns what it found wrong.
func statusFieldsTyped(doc map[string]any, kubeState string) []string {
	var bad []string
	want := func(m map[string]any, where, key, kind string) any {
		v, ok := m[key]
		got := fmt.Sprintf("%T", v)
		okKind := ok && map[string]bool{
			"string": got == "string", "bool": got == "bool", "number": got == "float64",
			"object": got == "map[string]interface {}", "array": got == "[]interface {}",
			"time": got == "string" && func() bool { _, err := time.Parse(time.RFC3339Nano, v.(string)); return err == nil }(),
		}[kind]
		if !okKind {
			bad = append(bad, fmt.Sprintf("%s%s: %s (%v), want %s", where, key, got, v, kind))
			return nil
		}
		return v
	}
	for key, kind := range map[string]string{"version": "string", "node": "string", "role": "string", "gpu": "bool", "pid": "number",
		"started": "time", "now": "time", "ready": "bool", "summary": "string", "conditions": "array", "repairs": "object",
		"kmsg": "object", "kubernetes": "object", "config": "object", "metrics": "object"} {
		want(doc, "", key, kind)
	}
	if conds, ok := doc["conditions"].([]any); ok {
		if len(conds) == 0 {
			bad = append(bad, "conditions: none")
		}
		for i, c := range conds {
			m, _ := c.(map[string]any)
			for key, kind := range map[string]string{"type": "string", "status": "string", "reason": "string", "message": "string",
				"lastTransitionTime": "time", "lastUpdateTime": "time", "source": "string"} {
				want(m, fmt.Sprintf("conditions[%d].", i), key, kind)
			}
		}
	}
	if k, ok := doc["kmsg"].(map[string]any); ok {
		for key, kind := range map[string]string{"device": "string", "reading": "bool", "records": "number", "lost": "number", "reopens": "number", "lastRecord": "object"} {
			want(k, "kmsg.", key, kind)
		}
	}
	if k, ok := doc["kubernetes"].(map[string]any); ok {
		for key, kind := range map[string]string{"state": "string", "calls": "object", "statusPending": "bool", "eventsQueued": "number"} {
			want(k, "kubernetes.", key, kind)
		}
		if k["state"] != kubeState {
			bad = append(bad, fmt.Sprintf("kubernetes.state %v, want %s", k["state"], kubeState))
		}
	}
	if c, ok := doc["config"].(map[string]any); ok {
		want(c, "config.", "file", "string")
		want(c, "config.", "since", "time")
	}
	if m, ok := doc["metrics"].(map[string]any); ok {
		want(m, "metrics.", "address", "string")
		want(m, "metrics.", "serving", "bool")
	}
	return bad
}

// TestStatusOfTheShippedDaemonOnABadDay holds README's "`status`: ask the
// running daemon" against the shipped binary, the real API server and the
// real /dev/kmsg: --json's fields and types on a healthy node, one with a
// problem and a standalone one; what status shows against the Node and
// /metrics at the same moment; a frozen daemon (SIGSTOP), named hung after
// the stated 10 s with exit 2; one gone (SIGKILL) with its socket left,
// "not running", exit 2; nothing on stdout for either.
func TestStatusOfTheShippedDaemonOnABadDay(t *testing.T) {
	n := newKernelNode(t)
	n.start()
	var doc map[string]any
	eventually(t, 30*time.Second, "status --json: ready", func() (bool, string) {
		code, out, errs := statusOf(t, n, "--json")
		doc = nil
		json.Unmarshal([]byte(out), &doc)
		return code == 0 && doc["ready"] == true, fmt.Sprintf("exit %d: %s%s", code, out, errs)
	})
	if bad := statusFieldsTyped(doc, "reporting"); len(bad) > 0 {
		t.Errorf("a healthy node's status --json:\n  %s", strings.Join(bad, "\n  "))
	}

	// A problem: status exits 1 and says what the Node and /metrics say.
	n.line("EXT4-fs (TOKEN): Remounting filesystem read-only")
	node := waitNode(t, n.api, n.name, "ReadonlyFilesystem True", func(node *corev1.Node) bool {
		c := cond(node, "ReadonlyFilesystem")
		return c != nil && c.Status == corev1.ConditionTrue
	})
	code, out, errs := statusOf(t, n, "--json")
	doc = nil
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 1 {
		t.Fatalf("status --json with ReadonlyFilesystem True on the Node: exit %d (want 1), %v: %s%s", code, err, out, errs)
	}
	if bad := statusFieldsTyped(doc, "reporting"); len(bad) > 0 {
		t.Errorf("status --json with a problem:\n  %s", strings.Join(bad, "\n  "))
	}
	var st struct {
		Conditions []struct {
			Type, Status, Reason, Message string
			LastTransitionTime            time.Time
		}
	}
	json.Unmarshal([]byte(out), &st)
	onNode := cond(node, "ReadonlyFilesystem")
	found := false
	for _, c := range st.Conditions {
		if c.Type != "ReadonlyFilesystem" {
			continue
		}
		found = true
		if c.Status != "True" || c.Reason != onNode.Reason || c.Message != onNode.Message || !c.LastTransitionTime.Truncate(time.Second).Equal(onNode.LastTransitionTime.Time) {
			t.Errorf("status %+v, the Node %+v: not one truth", c, *onNode)
		}
	}
	if !found {
		t.Errorf("status --json has no ReadonlyFilesystem: %s", out)
	}
	page := metricsPage(t, n.metrics)
	for status, want := range map[string]float64{"True": 1, "False": 0, "Unknown": 0} {
		series := fmt.Sprintf(`autopilot_health_condition_status{condition="ReadonlyFilesystem",status=%q}`, status)
		if v, ok := metricValue(page, series); !ok || v != want {
			t.Errorf("/metrics %s = %v (found %v), want %v, while status and the Node say True", series, v, ok, want)
		}
	}
	code, text, errs := statusOf(t, n)
	if code != 1 || !strings.Contains(text, "ReadonlyFilesystem=True (FilesystemIsReadOnly) since") || errs != "" {
		t.Errorf("status: exit %d (want 1), stdout %q, stderr %q", code, text, errs)
	}
	if m := regexp.MustCompile(`Status: (.*)\n`).FindStringSubmatch(text); m == nil || !strings.Contains(m[1], "1 problem (ReadonlyFilesystem)") {
		t.Errorf("status's summary line: %q", m)
	}

	// Frozen: the kernel takes the connection into the backlog, nothing
	// answers; named hung after the stated wait, exit 2, stdout empty.
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{nil, {"--json"}} {
		code, out, errs := statusOf(t, n, args...)
		want := "autopilot-health status: the daemon on " + n.status + " accepts but does not answer within 10s: it may be hung"
		if code != 2 || out != "" || !strings.HasPrefix(errs, want) {
			t.Errorf("status %v of a frozen daemon: exit %d, stdout %q, stderr %q; want exit 2 and %q", args, code, out, errs, want)
		}
	}
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	// Gone, its socket left behind: not running, exit 2.
	n.kill()
	if _, err := os.Lstat(n.status); err != nil {
		t.Fatalf("the SIGKILLed daemon's socket: %v (the case needs it left behind)", err)
	}
	for _, args := range [][]string{nil, {"--json"}} {
		code, out, errs := statusOf(t, n, args...)
		want := "autopilot-health status: the daemon is not running, or still starting: nothing answers on " + n.status
		if code != 2 || out != "" || !strings.HasPrefix(errs, want) {
			t.Errorf("status %v of a daemon gone with its socket left: exit %d, stdout %q, stderr %q; want exit 2 and %q", args, code, out, errs, want)
		}
	}

	// Standalone (no kubeconfig): the same fields; the kernel condition
	// held from the state file, so exit 1.
	conf, err := os.ReadFile(n.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	conf = regexp.MustCompile(`(?m)^kubeconfig = .*$`).ReplaceAll(conf, []byte(`kubeconfig = ""`))
	if err := os.WriteFile(n.cfgPath, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	n.start()
	eventually(t, 30*time.Second, "status --json of the standalone daemon: ready", func() (bool, string) {
		code, out, errs := statusOf(t, n, "--json")
		doc = nil
		json.Unmarshal([]byte(out), &doc)
		return code == 1 && doc["ready"] == true, fmt.Sprintf("exit %d: %s%s", code, out, errs)
	})
	if bad := statusFieldsTyped(doc, "standalone"); len(bad) > 0 {
		t.Errorf("a standalone daemon's status --json:\n  %s", strings.Join(bad, "\n  "))
	}
	n.stop()
}

// metricsPage reads the daemon's /metrics.
func metricsPage(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
