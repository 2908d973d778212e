//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/tests/harness"
)

// NodeTampered against the real API server with the shipped binary: a
// protected file changed sets it on the Node within seconds (file
// notifications; the interval is 5 min); a revert, a SIGKILL and a restart
// with the whole state directory removed (baseline and state file gone)
// keep it True on the Node with its lastTransitionTime, never a False in
// between; so does a clear forged into tamper.json followed by a restart
// (not reported, not evented); only `autopilot-health tamper clear` (root)
// lowers it, and the clear is logged, an Event on the API server, and in
// the tamper report with who cleared. The report annotation carries the
// baseline digest.
func TestNodeTamperedHeldAcrossRestartAndCleared(t *testing.T) {
	s := apiServer(t)
	name := "tamper-" + harness.Token()
	registerNode(t, s, name)
	_, kc := nodeClient(t, s, name)
	dir := t.TempDir()
	prot := filepath.Join(dir, "etc", "kubernetes", "kubelet.conf")
	os.MkdirAll(filepath.Dir(prot), 0o755)
	if err := os.WriteFile(prot, []byte("apiVersion: v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	sock := filepath.Join(dir, "run", "control.sock")
	// Below the ephemeral range, given once (harness.FreeLoopbackPort): a
	// port 0 gave, closed for the daemon to bind, may be an outgoing
	// connection's by then, at a restart's bind too.
	port := freeTCPPort(t)
	var checksOff strings.Builder
	for _, c := range config.Default().Checks.Names() {
		if c != "NodeTampered" && c != "SealedOSTampered" {
			fmt.Fprintf(&checksOff, "[checks.%s]\nenabled = false\n", c)
		}
	}
	conf := fmt.Sprintf(`node_name = %q
role = "worker"
gpu = "false"
state_dir = %q
control_socket = %q
[log]
level = "debug"
format = "text"
[metrics]
listen_address = "127.0.0.1:%d"
[kubernetes]
kubeconfig = %q
report_interval = "30s"
[runner]
first_run_spread = "0s"
[kmsg]
enabled = false
%s
[checks.NodeTampered]
paths = [%q]
baseline_after = []
settle = "0s"
[checks.SealedOSTampered]
recorded_hashes = %q
dm_control = %q
`, name, state, sock, port, kc, checksOff.String(), filepath.Dir(prot), filepath.Join(dir, "root-hashes"), filepath.Join(dir, "no-dm-control"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.SyncBuffer{} // the daemon writes it while the test reads (make test-race)
	var cmd *exec.Cmd
	var exited chan struct{}
	start := func() time.Time {
		cmd = exec.Command(daemonBinary(t), "run", "--config", cfgPath)
		fmt.Fprintf(logs, "---- start %s\n", time.Now().Format(time.RFC3339Nano))
		cmd.Stdout, cmd.Stderr = logs, logs
		at := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited = make(chan struct{})
		c, e := cmd, exited
		go func() { c.Wait(); close(e) }()
		return at
	}
	kill := func() {
		if cmd != nil {
			cmd.Process.Kill()
			<-exited
			cmd = nil
		}
	}
	t.Cleanup(func() {
		kill()
		if t.Failed() {
			t.Logf("daemon logs:\n%s", logs.String())
		}
	})
	w := watchCondition(t, s, name, "NodeTampered")

	start()
	waitNode(t, s, name, "NodeTampered=False", has("NodeTampered", corev1.ConditionFalse, "NodeIntact"))
	waitNode(t, s, name, "SealedOSTampered=Unknown (no sealed layers here)", has("SealedOSTampered", corev1.ConditionUnknown, "NothingToCheck"))
	changed := time.Now()
	if err := os.WriteFile(prot, []byte("apiVersion: v1\nserver: https://evil.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set := waitNode(t, s, name, "NodeTampered=True", has("NodeTampered", corev1.ConditionTrue, "ProtectedFileChanged"))
	if d := time.Since(changed); d > 20*time.Second {
		t.Errorf("NodeTampered set %s after the change", d)
	} else {
		t.Logf("NodeTampered True on the Node %s after the write (polled every 20 ms)", d.Round(time.Millisecond))
	}
	ltt := cond(set, "NodeTampered").LastTransitionTime
	if !strings.Contains(cond(set, "NodeTampered").Message, prot+" modified") {
		t.Errorf("message %q", cond(set, "NodeTampered").Message)
	}
	// The report (refreshed every 30 s here) carries this boot's baseline
	// and the change.
	var node *corev1.Node
	var err error
	for deadline := time.Now().Add(75 * time.Second); ; {
		node, err = s.Admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && strings.Contains(node.Annotations["autopilot.syself.com/tamper"], prot) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tamper report with the change within 75 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // polling the API server for the awaited refresh
	}
	var doc struct {
		Tamper struct {
			Baseline struct {
				Digest string `json:"digest"`
				Files  int    `json:"files"`
			} `json:"baseline"`
			Changes []struct{ Path, Kind string } `json:"changes"`
		} `json:"tamper"`
	}
	if err := json.Unmarshal([]byte(node.Annotations["autopilot.syself.com/tamper"]), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.Tamper.Baseline.Digest, "sha256:") || doc.Tamper.Baseline.Files != 2 || len(doc.Tamper.Changes) != 1 || doc.Tamper.Changes[0].Kind != "modified" {
		t.Errorf("tamper report %+v", doc.Tamper)
	}

	// Revert, SIGKILL, remove all local state, start again.
	os.WriteFile(prot, []byte("apiVersion: v1\n"), 0o600)
	kill()
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	restarted := start()
	after := waitNode(t, s, name, "a status write after the restart", func(n *corev1.Node) bool {
		c := cond(n, "NodeTampered")
		return c != nil && !c.LastHeartbeatTime.Time.Before(restarted.Truncate(time.Second))
	})
	if c := cond(after, "NodeTampered"); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&ltt) {
		t.Errorf("after the restart without state: %s/%s since %s, want True since %s", c.Status, c.Reason, c.LastTransitionTime, ltt)
	}
	if f := w.notTrueAfterTrue(); len(f) > 0 {
		t.Errorf("NodeTampered was lowered on the Node without a clear: %v", f)
	}

	// A clear forged into tamper.json (the findings dropped, a clear
	// added, the baseline and its digest left valid, as root in a pod with
	// a hostPath mount of the state directory could write it), then a
	// SIGKILL and a start: the Node keeps NodeTampered True, the forged
	// clear is neither reported nor evented.
	waitReport(t, s, name, restarted, "")
	// The restarted daemon's tamper.json: saved beside the report's write,
	// which may land first on a loaded machine (CI run 68).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(state, "tamper.json")); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the restarted daemon saved no tamper.json within 10 s: %v", err)
		}
	}
	kill()
	forgeClear(t, filepath.Join(state, "tamper.json"), "forged by the test")
	forgedStart := start()
	rep := waitReport(t, s, name, forgedStart, "")
	if strings.Contains(rep, "forged by the test") {
		t.Errorf("the forged clear reached the tamper report: %s", rep)
	}
	if c := cond(getNode(t, s, name), "NodeTampered"); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&ltt) {
		t.Errorf("after a forged clear and a restart: %s/%s %q since %s, want True since %s", c.Status, c.Reason, c.Message, c.LastTransitionTime, ltt)
	}
	if f := w.notTrueAfterTrue(); len(f) > 0 {
		t.Errorf("NodeTampered was lowered on the Node by a forged clear: %v", f)
	}
	if evs := tamperClearedEvents(t, s, name); len(evs) > 0 {
		t.Errorf("TamperCleared event without a clear: %+v", evs)
	}

	// The operator's clear, through the binary: logged, evented, on the Node
	// with who cleared. The daemon started above answers on its control
	// socket first (a report of the same second, the one before the kill,
	// satisfies the wait above: CI ran the clear before the new daemon
	// listened, "the daemon is not running").
	eventually(t, 30*time.Second, "the control socket answering", func() (bool, string) {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	cleared := time.Now()
	out, err := exec.Command(daemonBinary(t), "tamper", "clear", "--config", cfgPath, "--reason", "reviewed by the test").CombinedOutput()
	if err != nil {
		t.Fatalf("tamper clear: %v\n%s", err, out)
	}
	waitNode(t, s, name, "NodeTampered=False after the clear", has("NodeTampered", corev1.ConditionFalse, "NodeIntact"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs := tamperClearedEvents(t, s, name)
		if len(evs) > 0 && strings.HasSuffix(evs[0].Message, ": reviewed by the test") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TamperCleared event within 30 s: %+v", evs)
		}
		time.Sleep(50 * time.Millisecond) // polling the API server for an awaited event
	}
	if !strings.Contains(logs.String(), `msg="tamper conditions cleared by an operator" reason="reviewed by the test"`) {
		t.Errorf("the clear is not in the daemon's log")
	}
	var after2 struct {
		Tamper struct {
			Cleared struct {
				At         time.Time
				Reason, By string
			} `json:"cleared"`
		} `json:"tamper"`
	}
	if err := json.Unmarshal([]byte(waitReport(t, s, name, cleared, "reviewed by the test")), &after2); err != nil {
		t.Fatal(err)
	}
	// Who cleared is visible to whoever reads the Node: the names the
	// client states, the uid and pid the kernel gives for the peer.
	if c := after2.Tamper.Cleared; !clearedBy.MatchString(c.By) || c.At.Before(cleared.Truncate(time.Second)) {
		t.Errorf("cleared on the Node: %+v, want by matching %s", c, clearedBy)
	}

	// `check --json`'s report is the daemon's documents (README: "exactly
	// as the daemon writes them to the Node's annotations"), but for
	// updatedAt and the operator's clear: check does not read the Node, the
	// only corroboration of the clear tamper.json holds, so its tamper
	// document has no tamper.cleared (README says so).
	// The clear drops the baseline and the tamper check takes a new one at
	// its next run: a report written in between has none (under load, CI's
	// neighbours, 0.4 s), and check, run after, reads the new one.
	onNode := waitReport(t, s, name, time.Now(), `"baseline":`)
	out, err = exec.Command(daemonBinary(t), "check", "--json", "--config", cfgPath).Output()
	var res struct {
		Report map[string]map[string]any `json:"report"`
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("check --json: %v, %v\n%s", err, jerr, out)
	}
	var daemonDoc map[string]any
	if err := json.Unmarshal([]byte(onNode), &daemonDoc); err != nil {
		t.Fatal(err)
	}
	delete(daemonDoc, "updatedAt")
	delete(res.Report["tamper"], "updatedAt")
	if tm, _ := res.Report["tamper"]["tamper"].(map[string]any); tm == nil || tm["cleared"] != nil {
		t.Errorf("check --json's tamper document: %v; want its tamper without cleared (README)", res.Report["tamper"])
	}
	if tm, _ := daemonDoc["tamper"].(map[string]any); tm != nil {
		delete(tm, "cleared")
	}
	if a, b := fmt.Sprint(res.Report["tamper"]), fmt.Sprint(daemonDoc); a != b {
		t.Errorf("check --json's tamper document is not the daemon's:\ncheck: %s\nNode:  %s", a, b)
	}
}

// clearedBy is what the tamper report's cleared.by holds: the sudo user and
// the login user when known, the client's uid, then the peer's uid and pid.
var clearedBy = regexp.MustCompile(`^(sudo user [^,]+, )?(login user [^,]+, )?uid 0 \(uid 0, pid [0-9]+\)$`)

func getNode(t *testing.T, s *harness.APIServer, name string) *corev1.Node {
	t.Helper()
	n, err := s.Admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitReport waits (up to 75 s: the report is refreshed every 30 s here)
// for a tamper report written at or after since containing want, and
// returns it.
func waitReport(t *testing.T, s *harness.APIServer, name string, since time.Time, want string) string {
	t.Helper()
	deadline := time.Now().Add(75 * time.Second)
	for {
		raw := getNode(t, s, name).Annotations["autopilot.syself.com/tamper"]
		var doc struct {
			UpdatedAt time.Time `json:"updatedAt"`
		}
		if json.Unmarshal([]byte(raw), &doc) == nil && !doc.UpdatedAt.Before(since.Truncate(time.Second)) && strings.Contains(raw, want) {
			return raw
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tamper report since %s containing %q within 75 s; last: %s", since.Format(time.RFC3339), want, raw)
		}
		time.Sleep(200 * time.Millisecond) // polling the API server for the awaited refresh
	}
}

func tamperClearedEvents(t *testing.T, s *harness.APIServer, name string) []corev1.Event {
	t.Helper()
	evs, err := s.Admin.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range evs.Items {
		if e.Reason == "TamperCleared" {
			out = append(out, e)
		}
	}
	return out
}

// forgeClear rewrites the daemon's tamper.json as an attacker would: no
// findings, a clear, the baseline (and its digest) untouched.
func forgeClear(t *testing.T, path, reason string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st["baseline"] == nil {
		t.Fatalf("no baseline in %s to keep", path)
	}
	st["findings"] = []any{}
	st["cleared"] = map[string]any{"at": time.Now().UTC().Format(time.RFC3339Nano), "reason": reason, "by": "uid 0 (uid 0, pid 1)"}
	out, _ := json.Marshal(st)
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// conditionWatch records every status of one condition the API server
// stores for a node.
type conditionWatch struct {
	mu   sync.Mutex
	seen []corev1.NodeCondition
}

func watchCondition(t *testing.T, s *harness.APIServer, node, ty string) *conditionWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &conditionWatch{}
	wi, err := s.Admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if c := cond(ev.Object.(*corev1.Node), ty); c != nil {
				w.mu.Lock()
				w.seen = append(w.seen, *c)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// notTrueAfterTrue lists the statuses stored after the condition first
// turned True that are not True.
func (w *conditionWatch) notTrueAfterTrue() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	wasTrue := false
	for _, c := range w.seen {
		if c.Status == corev1.ConditionTrue {
			wasTrue = true
		} else if wasTrue {
			out = append(out, fmt.Sprintf("%s/%s at %s", c.Status, c.Reason, c.LastHeartbeatTime.Format(time.RFC3339)))
		}
	}
	return out
}

// hiddenPathUnitConfig protects a path the units hide (%[2]q) beside one they
// do not.
const hiddenPathUnitConfig = `# written by tests/tamper_test.go
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
paths = [%[2]q, "/etc/autopilot-health-test/protected"]
baseline_after = []
settle = "0s"

[kubernetes]
kubeconfig = "/etc/autopilot-health/kubeconfig"
`

// hiddenProtectedPath runs the daemon under the packaged units in a real
// systemd with NodeTampered protecting hidden (a directory the units'
// sandbox hides from the helper's scan; file, a file in it, is written on
// the host) beside /etc/autopilot-health-test/protected, and awaits
// NodeTampered Unknown/CheckFailed naming hidden with why. It returns the
// namespace and a reader of NodeTampered's status/reason and message.
func hiddenProtectedPath(t *testing.T, hidden, file, why string, opts ...func(*harness.Options)) (*harness.Systemd, func() (string, string)) {
	t.Helper()
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	dir, err := os.MkdirTemp("", "autopilot-health-hidden-"+harness.Token()+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	usr := filepath.Join(dir, "usr")
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(usr, "bin", "autopilot-health")
	o := harness.Options{KeepSyslog: true, Usr: usr}
	for _, f := range opts {
		f(&o)
	}
	s, err := harness.StartSystemdWith(filepath.Join(dir, "ns"), nil, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal of the namespace:\n%s", lastBytes(s.Journal("autopilot-health.service", "autopilot-health-privileged.service"), 8000))
		}
	})
	for p, content := range map[string]string{
		file: "a protected file the scan cannot see\n",
		"/etc/autopilot-health-test/protected/a.conf": "a\n",
		"/etc/autopilot-health/config.toml":           fmt.Sprintf(hiddenPathUnitConfig, freeTCPPort(t), hidden),
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
	eventually(t, 30*time.Second, "NodeTampered Unknown/CheckFailed naming "+hidden, func() (bool, string) {
		sr, msg := nodeTampered()
		return sr == "Unknown/CheckFailed" && strings.Contains(msg, "cannot read 1 protected path(s)") && strings.Contains(msg, why), sr + " " + msg
	})
	return s, nodeTampered
}

// NodeTampered under the packaged units with a protected path in /root:
// the helper's ProtectHome=yes puts systemd's inaccessible directory over
// /root in its mount namespace, so the scan cannot see the host's
// /root/.ssh/authorized_keys; the condition says so (Unknown, CheckFailed,
// naming /root/.ssh and why) instead of vouching for it, and a change to
// the other protected path is still found. Before hostio.Scan knew the
// sandbox's inaccessible mounts, the condition was False, NodeIntact, over
// an empty directory.
func TestNodeTamperedPathHiddenByTheUnitIsNotVouchedFor(t *testing.T) {
	s, nodeTampered := hiddenProtectedPath(t, "/root/.ssh", "/root/.ssh/authorized_keys",
		"/root/.ssh (hidden by the sandbox: /root is a systemd inaccessible mount in this mount namespace")
	if err := os.WriteFile(s.Root("/etc/autopilot-health-test/protected/a.conf"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "NodeTampered True for the change beside it", func() (bool, string) {
		sr, msg := nodeTampered()
		return sr == "True/ProtectedFileChanged" && strings.Contains(msg, "/etc/autopilot-health-test/protected/a.conf modified"), sr + " " + msg
	})
	sr, msg := nodeTampered()
	t.Logf("NodeTampered under the units: %s %s", sr, msg)
}

// A bind mount over a protected file on the host (mounts shared, as on a
// booted host), under the packaged units: it propagates into the daemon's
// and the helper's mount namespaces (PrivateMounts=yes takes the host's
// mounts), sends inotify nothing, and wakes the check through the mount
// table: NodeTampered True within 20 s, the interval being 5 min. Before,
// it waited for the interval's scan.
func TestNodeTamperedBindMountOverAProtectedFileUnderTheUnits(t *testing.T) {
	s, nodeTampered := hiddenProtectedPath(t, "/root/.ssh", "/root/.ssh/authorized_keys",
		"/root/.ssh (hidden by the sandbox: /root is a systemd inaccessible mount in this mount namespace",
		func(o *harness.Options) { o.SharedMounts = true })
	if err := writeFile(s.Root("/etc/autopilot-health-test/evil.conf"), []byte("evil\n")); err != nil {
		t.Fatal(err)
	}
	// The start's runs are over before the mount, so no run but the one
	// the mount wakes can find it before the interval's: the first, and
	// the one the first watches ask for (they watch nothing new, and the
	// check waits for a notification or its interval).
	conf, err := os.ReadFile(s.Root("/etc/autopilot-health/config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var port int
	if _, after, ok := strings.Cut(string(conf), `listen_address = "127.0.0.1:`); ok {
		fmt.Sscanf(after, "%d", &port)
	}
	runs := func() (float64, string) {
		n, lines := 0.0, ""
		for _, r := range []string{"ok", "problem", "error", "timeout"} {
			if v, line := metricOf(t, port, `autopilot_health_check_runs_total{check="NodeTampered",result="`+r+`"}`); v > 0 {
				n, lines = n+v, lines+line+"; "
			}
		}
		return n, lines
	}
	eventually(t, 30*time.Second, "the start's two NodeTampered runs", func() (bool, string) {
		n, lines := runs()
		return n >= 2, lines
	})
	before, _ := runs()
	out, err := exec.Command("nsenter", "--target", fmt.Sprint(s.PID), "--mount", "--root", "--wd", "--",
		"mount", "--bind", "/etc/autopilot-health-test/evil.conf", "/etc/autopilot-health-test/protected/a.conf").CombinedOutput()
	if err != nil {
		t.Fatalf("bind mount in the namespace: %v: %s", err, out)
	}
	mounted := time.Now()
	eventually(t, 20*time.Second, "NodeTampered True for the bind mount", func() (bool, string) {
		sr, msg := nodeTampered()
		return sr == "True/ProtectedFileChanged" && strings.Contains(msg, "/etc/autopilot-health-test/protected/a.conf modified"), sr + " " + msg
	})
	t.Logf("from the bind mount to True in the daemon: %s (NodeTampered runs before the mount: %v)", time.Since(mounted).Round(10*time.Millisecond), before)
}
