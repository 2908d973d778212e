package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report/kube"
)

// While the conditions' writes to the Node have failed for a minute, status
// shows the line systemctl status shows (the note in front of the
// summary), and under Kubernetes since when, how many calls, why and the
// error (escaped); --json carries kubernetes.nodeNotUpdated. Before, it
// said the summary alone.
func TestStatusSaysNodeNotUpdated(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	st := daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Now: now, Started: now.Add(-2 * time.Hour), Ready: true,
		Summary: "24 conditions: 24 ok",
		Config:  daemon.ConfigStatus{File: "/etc/autopilot-health/config.toml", Since: now},
		Kubernetes: daemon.KubernetesStatus{State: "reporting", Reporting: kube.Reporting{
			Calls: map[string]kube.CallStatus{"status": {LastSuccess: now.Add(-time.Hour), LastError: "forbidden", LastErrorAt: now, Failing: true}},
			NodeNotUpdated: &kube.NodeNotUpdated{Since: now.Add(-time.Hour), FailingSince: now.Add(-59 * time.Minute), Failures: 61,
				Reason: "refused by the API server (403 Forbidden)", Error: "nodes \"node-1\" is forbidden\x1b[2J"}}},
	}
	body, _ := json.Marshal(st)
	serveStatusBody(t, sock, body)
	_, out, _ := run(t, "status", "--socket", sock)
	for _, want := range []string{
		"Status: Node NOT updated since 2026-12-02 18:00:00Z: refused by the API server (403 Forbidden); 24 conditions: 24 ok\n",
		"  NODE NOT UPDATED since ",
		" ago): 61 calls failed in a row since ",
		": refused by the API server (403 Forbidden): nodes \"node-1\" is forbidden\\x1b[2J\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = run(t, "status", "--json", "--socket", sock)
	var got daemon.StatusReport
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if n := got.Kubernetes.NodeNotUpdated; n == nil || !n.Since.Equal(now.Add(-time.Hour)) || n.Failures != 61 {
		t.Errorf("--json kubernetes.nodeNotUpdated: %+v\n%s", n, out)
	}
}
