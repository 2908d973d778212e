//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/tests/harness"
)

// privateTmpUnitConfig protects a directory in /var/tmp and one in /etc.
const privateTmpUnitConfig = `# written by tests/privatetmp_test.go
role = "worker"
gpu = "false"

[metrics]
listen_address = "127.0.0.1:%[1]d"

[runner]
first_run_spread = "0s"

[checks.KubeletUnhealthy]
enabled = false

[checks.ContainerRuntimeUnhealthy]
enabled = false

[checks.NodeTampered]
paths = ["/var/tmp/autopilot-health-test", "/etc/autopilot-health-test/protected"]
baseline_after = []
settle = "0s"

[kubernetes]
kubeconfig = "/etc/autopilot-health/kubeconfig"
`

// NodeTampered under the packaged units with a protected path in /var/tmp:
// the helper's PrivateTmp=yes mounts a directory of its own over /tmp and
// /var/tmp in its mount namespace, so the scan cannot see the host's
// /var/tmp; the condition says so (Unknown, CheckFailed, naming the path
// and why) instead of vouching for what it cannot see. Before, the scan read
// the helper's empty /var/tmp, and NodeTampered was False, NodeIntact, with
// the host's files there never looked at.
func TestNodeTamperedPathInThePrivateTmpIsNotVouchedFor(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	dir, err := os.MkdirTemp("", "autopilot-health-privatetmp-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	usr := filepath.Join(dir, "usr")
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(usr, "bin", "autopilot-health")
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), nil, harness.Options{KeepSyslog: true, Usr: usr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	defer func() {
		if t.Failed() {
			t.Logf("journal of the namespace:\n%s", lastBytes(s.Journal("autopilot-health.service", "autopilot-health-privileged.service"), 6000))
		}
	}()
	for p, content := range map[string]string{
		"/var/tmp/autopilot-health-test/a.conf":       "a\n",
		"/etc/autopilot-health-test/protected/a.conf": "a\n",
		"/etc/autopilot-health/config.toml":           fmt.Sprintf(privateTmpUnitConfig, freeTCPPort(t)),
		"/etc/autopilot-health/kubeconfig":            fmt.Sprintf(deadAPIKubeconfig, freeTCPPort(t)),
	} {
		if err := writeFile(s.Root(p), []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := s.StartUnit(ctx, "systemd-journald.service"); err != nil {
		t.Fatalf("starting journald: %v", err)
	}
	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("starting autopilot-health.service: %v", err)
	}
	sock := s.Root("/run/autopilot-health/status.sock")
	nodeTampered := func() (string, string) {
		out, _ := exec.Command(bin, "status", "--json", "--socket", sock).Output()
		var st struct {
			Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			return "", fmt.Sprintf("%v: %s", err, out)
		}
		for _, c := range st.Conditions {
			if c.Type == "NodeTampered" {
				return c.Status + "/" + c.Reason, c.Message
			}
		}
		return "", string(out)
	}
	const why = "/var/tmp/autopilot-health-test (hidden by the sandbox: /var/tmp is"
	eventually(t, 30*time.Second, "NodeTampered Unknown/CheckFailed naming /var/tmp/autopilot-health-test", func() (bool, string) {
		sr, msg := nodeTampered()
		return sr == "Unknown/CheckFailed" && strings.Contains(msg, "cannot read 1 protected path(s)") && strings.Contains(msg, why), sr + " " + msg
	})
	sr, msg := nodeTampered()
	t.Logf("NodeTampered under the units: %s %s", sr, msg)
}
