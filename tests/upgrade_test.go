//go:build integration

package tests

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/tests/harness"
)

// previousRelease is the build an upgrade comes from and a rollback goes
// back to: main at the end of 2026-12-04 (before the kernel log window's
// ioErrorSuppressed, the heartbeat riding on the report refresh, the
// repairer's stopSeenAt). AUTOPILOT_HEALTH_PREVIOUS_BINARY names another
// binary instead.
const previousRelease = "535a78f"

// previousBinary builds the daemon of previousRelease (git archive of the
// commit, built as it ships), once per test.
func previousBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("AUTOPILOT_HEALTH_PREVIOUS_BINARY"); p != "" {
		return p
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("needs the git history: no git checkout to build %s from (set AUTOPILOT_HEALTH_PREVIOUS_BINARY): %v", previousRelease, err)
	}
	src := t.TempDir()
	arch := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", strings.TrimSpace(string(root)), previousRelease, src)
	if out, err := arch.CombinedOutput(); err != nil {
		t.Skipf("needs the git history: the checkout does not hold %s (a shallow clone?; set AUTOPILOT_HEALTH_PREVIOUS_BINARY): %v\n%s", previousRelease, err, out)
	}
	bin := filepath.Join(t.TempDir(), "autopilot-health")
	for _, pkg := range []string{"./cmd/autopilot-health", "./cmd/autopilot-health-privileged"} {
		out := bin
		if strings.HasSuffix(pkg, "privileged") {
			if _, err := os.Stat(filepath.Join(src, pkg)); err != nil {
				continue // a build from before the helper
			}
			out += "-privileged"
		}
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s of %s: %v\n%s", pkg, previousRelease, err, b)
		}
	}
	return bin
}

// newUpgradeNode is a kernel node (newKernelNode) with NodeTampered on, its
// protected directory returned.
func newUpgradeNode(t *testing.T) (*kernelNode, string) {
	t.Helper()
	s := apiServer(t)
	tok := harness.Token()
	n := &kernelNode{t: t, api: s, name: "upgrade-" + tok, tok: tok, state: filepath.Join(t.TempDir(), "state"), logs: &testenv.SyncBuffer{}}
	n.status = filepath.Join(t.TempDir(), "status.sock")
	registerNode(t, s, n.name)
	_, kc := nodeClient(t, s, n.name)
	// Below the ephemeral range, given once (harness.FreeLoopbackPort): a
	// port 0 gave, closed for the daemon to bind, may be an outgoing
	// connection's by then, at a restart's bind too.
	port := freeTCPPort(t)
	n.metrics = fmt.Sprintf("127.0.0.1:%d", port)
	prot := filepath.Join(t.TempDir(), "etc", "kubernetes")
	if err := os.MkdirAll(prot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prot, "kubelet.conf"), []byte("apiVersion: v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var disable []string
	for _, r := range kmsg.DefaultRules {
		// PodVolumeReadOnly stays as ReadonlyFilesystem's part (and the
		// previous release knows no such name).
		if r.Name != "ReadonlyFilesystem" && r.Name != "Ext4Warning" && r.Kind != kmsg.PodVolume {
			disable = append(disable, fmt.Sprintf("%q", r.Name))
		}
	}
	checksOff := checksOffBut("NodeTampered")
	conf := fmt.Sprintf(`node_name = %q
role = "worker"
gpu = "false"
state_dir = %q
control_socket = %q
[log]
level = "debug"
format = "text"
[status]
socket = %q
[metrics]
listen_address = "127.0.0.1:%d"
[kubernetes]
kubeconfig = %q
[runner]
first_run_spread = "0s"
%s
[checks.NodeTampered]
paths = [%q]
baseline_after = []
settle = "0s"
[kmsg]
kernel_only = false  # the lines this test writes have facility user
disable = [%s]
[[kmsg.rules]]
name = "ReadonlyFilesystem"
kind = "perm"
condition = "ReadonlyFilesystem"
reason = "FilesystemIsReadOnly"
pattern = '^EXT4-fs \(%s\): Remounting filesystem read-only'
[[kmsg.rules]]
name = "Ext4Warning"
kind = "temp"
reason = "Ext4Warning"
pattern = '^EXT4-fs warning \(device %s\)'
`, n.name, n.state, filepath.Join(t.TempDir(), "control.sock"), n.status, port, kc, checksOff, prot, strings.Join(disable, ", "), tok, tok)
	n.cfgPath = filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(n.cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.kill()
		if t.Failed() {
			t.Logf("daemon logs:\n%s", n.logs.String())
		}
	})
	return n, prot
}

// An upgrade from the previous release to this build and a rollback from
// this build to it, each a stop and a start of the other binary on the
// same state directory within the boot: a held kernel condition
// (ReadonlyFilesystem) and a held tamper finding (NodeTampered) stay True
// on the Node with their lastTransitionTime, no state file is moved aside,
// and neither binary logs the other's file as unreadable.
func TestUpgradeAndRollbackKeepConditions(t *testing.T) {
	prev := previousBinary(t)
	cur := daemonBinary(t)
	n, prot := newUpgradeNode(t)
	w := watchFlaps(t, n.api, n.name)
	tw := watchCondition(t, n.api, n.name, "NodeTampered")

	n.bin = prev
	n.start()
	n.caughtUp()
	waitNode(t, n.api, n.name, "NodeTampered=False", has("NodeTampered", corev1.ConditionFalse, "NodeIntact"))
	n.line("EXT4-fs (TOKEN): Remounting filesystem read-only")
	waitNode(t, n.api, n.name, "ReadonlyFilesystem=True", has("ReadonlyFilesystem", corev1.ConditionTrue, "FilesystemIsReadOnly"))
	if err := os.WriteFile(filepath.Join(prot, "kubelet.conf"), []byte("apiVersion: v1\nserver: https://evil.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set := waitNode(t, n.api, n.name, "NodeTampered=True", has("NodeTampered", corev1.ConditionTrue, "ProtectedFileChanged"))
	rofs, tampered := cond(set, "ReadonlyFilesystem").LastTransitionTime, cond(set, "NodeTampered").LastTransitionTime
	n.caughtUp()

	for _, step := range []struct{ name, bin string }{{"upgrade", cur}, {"rollback", prev}, {"upgrade again", cur}} {
		n.stop()
		n.bin = step.bin
		logged := n.logs.Len()
		restarted := n.start()
		n.caughtUp()
		c := n.written(restarted)
		if c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&rofs) {
			t.Errorf("%s: ReadonlyFilesystem %s/%s since %s; want True since %s", step.name, c.Status, c.Reason, c.LastTransitionTime.Format(time.RFC3339), rofs.Format(time.RFC3339))
		}
		// NodeTampered has run on what this binary read of tamper.json
		// (the file is moved aside, and a finding made, before its first
		// run ends).
		page := n.afterCheckRan("NodeTampered")
		if v, ok := metricValue(page, `problem_gauge{reason="ProtectedFileChanged",type="NodeTampered"}`); !ok || v != 1 {
			t.Errorf("%s: NodeTampered is not ProtectedFileChanged after its run:\n%s", step.name, grepLines(page, "NodeTampered"))
		}
		node := getNode(t, n.api, n.name)
		if c := cond(node, "NodeTampered"); c == nil || c.Status != corev1.ConditionTrue || c.Reason != "ProtectedFileChanged" || !c.LastTransitionTime.Equal(&tampered) {
			t.Errorf("%s: NodeTampered %+v; want True/ProtectedFileChanged since %s", step.name, c, tampered.Format(time.RFC3339))
		}
		if aside, _ := filepath.Glob(filepath.Join(n.state, "*.corrupt*")); len(aside) > 0 {
			t.Errorf("%s: moved aside: %v", step.name, aside)
		}
		// A new finding, so that the next binary reads a tamper.json this
		// one wrote.
		added := filepath.Join(prot, strings.ReplaceAll(step.name, " ", "-")+".conf")
		if err := os.WriteFile(added, []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the finding of "+added+" in tamper.json", func() (bool, string) {
			b, err := os.ReadFile(filepath.Join(n.state, "tamper.json"))
			return bytes.Contains(b, []byte(added)), fmt.Sprint(err)
		})
		for _, l := range strings.Split(n.logs.String()[logged:], "\n") {
			if strings.Contains(l, "level=ERROR") || strings.Contains(l, "corrupt") || strings.Contains(l, "unreadable") {
				t.Errorf("%s: logged %s", step.name, l)
			}
		}
	}
	if f := w.flaps(); len(f) > 0 {
		t.Errorf("ReadonlyFilesystem flapped on the Node: %v", f)
	}
	if f := tw.notTrueAfterTrue(); len(f) > 0 {
		t.Errorf("NodeTampered flapped on the Node: %v", f)
	}
}

// afterCheckRan waits until the running daemon has finished a run of check
// (its check_runs_total above 0: its series of every result are there at
// 0 from the check's start), and returns its metrics page.
func (n *kernelNode) afterCheckRan(check string) string {
	n.t.Helper()
	var page string
	eventually(n.t, 30*time.Second, "a run of "+check, func() (bool, string) {
		resp, err := http.Get("http://" + n.metrics + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return false, err.Error()
		}
		page = string(b)
		runs := 0.0
		for _, l := range strings.Split(page, "\n") {
			if rest, ok := strings.CutPrefix(l, `autopilot_health_check_runs_total{check="`+check+`",`); ok {
				if _, v, ok := strings.Cut(rest, "} "); ok {
					f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
					runs += f
				}
			}
		}
		return runs > 0, grepLines(page, "check_runs_total")
	})
	return page
}

// grepLines returns the lines of page that contain s.
func grepLines(page, s string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
