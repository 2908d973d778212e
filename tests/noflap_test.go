//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	mathrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// nodeWatch records every version of a Node the API server stores: its
// conditions and its report annotations.
type nodeWatch struct {
	mu   sync.Mutex
	seen []*corev1.Node
	done chan struct{}
}

func watchNode(t *testing.T, s *harness.APIServer, node string) *nodeWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &nodeWatch{done: make(chan struct{})}
	wi, err := s.Admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			w.mu.Lock()
			w.seen = append(w.seen, ev.Object.(*corev1.Node))
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// sawVersion waits until the watch delivered the Node's version rv (or a
// later one): every write before it has been seen.
func (w *nodeWatch) sawVersion(t *testing.T, n *corev1.Node) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		seen := false
		for _, s := range w.seen {
			if s.ResourceVersion == n.ResourceVersion {
				seen = true
			}
		}
		w.mu.Unlock()
		if seen {
			return
		}
		select {
		case <-w.done:
			t.Fatal("the watch on the Node ended early")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch did not deliver version %s within 30 s", n.ResourceVersion)
		}
		time.Sleep(20 * time.Millisecond) // polling for the awaited watch event
	}
}

// flaps returns, per condition type of types, what the Node showed after
// the type first turned True other than True with its first transition
// time.
func (w *nodeWatch) flaps(types []string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, ty := range types {
		var first *corev1.NodeCondition
		for _, n := range w.seen {
			c := cond(n, ty)
			if c == nil {
				if first != nil {
					out = append(out, fmt.Sprintf("%s gone from the Node (version %s)", ty, n.ResourceVersion))
				}
				continue
			}
			if first == nil {
				if c.Status == corev1.ConditionTrue {
					first = c
				}
				continue
			}
			if c.Status != corev1.ConditionTrue {
				out = append(out, fmt.Sprintf("%s %s/%s %q (version %s)", ty, c.Status, c.Reason, c.Message, n.ResourceVersion))
			} else if !c.LastTransitionTime.Equal(&first.LastTransitionTime) {
				out = append(out, fmt.Sprintf("%s: transition time moved from %s to %s", ty, first.LastTransitionTime.Format(time.RFC3339), c.LastTransitionTime.Format(time.RFC3339)))
			}
		}
	}
	return out
}

// reportContent is what a report document must keep once it had it: the
// list or object the domain is about, not empty.
var reportContent = map[string]string{"storage": "filesystems", "certs": "certs", "tamper": "tamper"}

// docHas reports whether the annotation of domain holds its content.
func docHas(n *corev1.Node, domain string) bool {
	var doc map[string]json.RawMessage
	if json.Unmarshal([]byte(n.Annotations[report.AnnotationPrefix+domain]), &doc) != nil {
		return false
	}
	v := strings.TrimSpace(string(doc[reportContent[domain]]))
	return v != "" && v != "null" && v != "[]" && v != "{}"
}

// lostReport returns every Node version whose report documents lost the
// content an earlier version had.
func (w *nodeWatch) lostReport() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for domain := range reportContent {
		had := false
		for _, n := range w.seen {
			if docHas(n, domain) {
				had = true
			} else if had {
				out = append(out, fmt.Sprintf("%s (version %s): %.300s", domain, n.ResourceVersion, n.Annotations[report.AnnotationPrefix+domain]))
			}
		}
	}
	return out
}

// clockTrueHere reports whether this machine's kernel clock makes
// ClockNotSynchronized True (the check reads the real adjtimex): not
// synchronized, or an estimated error over maxErr.
func clockTrueHere(t *testing.T, maxErr time.Duration) bool {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	if err != nil {
		t.Fatal(err)
	}
	return tx.Maxerror >= 16_000_000 || state == unix.TIME_ERROR && tx.Status&unix.STA_UNSYNC == 0 ||
		time.Duration(tx.Esterror)*time.Microsecond > maxErr
}

// Several check conditions True at once on the real API server, set by the
// shipped binary on a fake host root (DiskUsageHigh on a full tmpfs,
// NodeInfoStale, CertRenewalFailing on its 1 h interval,
// ClockNotSynchronized from this machine's real clock where it is not
// synchronized, KubeletUnhealthy on its 10 s interval with a /healthz that
// answers 500, NodeTampered): a watch on the Node sees none of them other
// than True once True, and no lastTransitionTime move, across a SIGKILL
// and immediate restart, SIGKILLs in the first pass (its runs spread over
// 3 s: checks still pending), a clean stop (SIGTERM), a restart with the
// state directory removed, a restart whose first runs fail (NodeInfoStale's
// file a directory, DiskUsageHigh's only mount point gone: held through the
// failed run) or hang (/healthz answering nothing), and a reload (SIGHUP)
// that changes nothing. The report documents (storage, certs, tamper) never
// lose their content once they had it.
func TestCheckConditionsNeverFlapAcrossRestarts(t *testing.T) {
	harness.Parallel(t, 0)
	s := apiServer(t)
	tok := harness.Token()
	n := &kernelNode{t: t, api: s, name: "noflap-" + tok, tok: tok, logs: &testenv.SyncBuffer{}}
	n.status = filepath.Join(t.TempDir(), "status.sock")
	registerNode(t, s, n.name)
	_, kc := nodeClient(t, s, n.name)

	root, err := os.MkdirTemp("", "noflap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	n.state = filepath.Join(root, "state")
	// The kubeconfig and the files it names are read under the host root.
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(s.Dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(s.Dir, filepath.Join(root, s.Dir)); err != nil {
		t.Fatal(err)
	}
	// DiskUsageHigh: a 1 MiB tmpfs, 94 % full (listed as the ext4 a
	// node's data disk is: tmpfs is excluded by fs_types_exclude).
	data := filepath.Join(root, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", data, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(data, unix.MNT_DETACH) })
	catalogWrite(t, filepath.Join(data, "fill"), strings.Repeat("x", 960<<10))
	mountinfo := filepath.Join(root, "proc/self/mountinfo")
	catalogWrite(t, mountinfo, "29 1 0:99 / /data rw,relatime shared:1 - ext4 /dev/vdz1 rw\n")
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	catalogWrite(t, filepath.Join(root, "proc/sys/kernel/random/boot_id"), string(bootID))
	// NodeInfoStale: nodes.json 10 minutes old, the boot a day ago.
	catalogWrite(t, filepath.Join(root, "proc/stat"), fmt.Sprintf("cpu  1 0 1 1 0 0 0 0 0 0\nbtime %d\n", time.Now().Add(-24*time.Hour).Unix()))
	nodesJSON := filepath.Join(root, "var/lib/syself/nodes.json")
	stale := func() {
		t.Helper()
		catalogWrite(t, nodesJSON, `{"nodes":[]}`)
		old := time.Now().Add(-10 * time.Minute)
		if err := os.Chtimes(nodesJSON, old, old); err != nil {
			t.Fatal(err)
		}
	}
	stale()
	// CertRenewalFailing: the kubelet's client certificate expires in a day.
	cert := "/var/lib/kubelet/pki/kubelet-client-current.pem"
	catalogCert(t, filepath.Join(root, cert), time.Now().Add(24*time.Hour))
	// KubeletUnhealthy: /healthz answers 500, or, while hang is set,
	// nothing until the test ends.
	var hang sync.Map
	release := make(chan struct{})
	healthz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := hang.Load("on"); ok {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		http.Error(w, "[-]syncloop failed", http.StatusInternalServerError)
	}))
	t.Cleanup(healthz.Close)
	t.Cleanup(func() { close(release) })
	// NodeTampered: a protected file, changed after the baseline.
	prot := filepath.Join(root, "etc/kubernetes/kubelet.conf")
	catalogWrite(t, prot, "apiVersion: v1\n")

	const maxErr = time.Second
	types := []string{"DiskUsageHigh", "NodeInfoStale", "CertRenewalFailing", "KubeletUnhealthy", "NodeTampered"}
	if clockTrueHere(t, maxErr) {
		types = append(types, "ClockNotSynchronized")
	} else {
		t.Logf("this machine's clock is synchronized within %s: ClockNotSynchronized is not among the True conditions", maxErr)
	}
	checksOff := checksOffBut(append([]string{"SealedOSTampered", "ClockNotSynchronized"}, types...)...)
	conf := fmt.Sprintf(`host_root = %q
node_name = %q
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
first_run_spread = "3s"
[kmsg]
enabled = false
%s
[checks.DiskUsageHigh]
lvm_command = ""
[checks.CertRenewalFailing]
certificates = [%q]
[checks.ClockNotSynchronized]
max_error = %q
[checks.KubeletUnhealthy]
healthz_url = %q
[checks.NodeTampered]
paths = ["/etc/kubernetes"]
baseline_after = []
settle = "0s"
[checks.SealedOSTampered]
recorded_hashes = "/no-root-hashes"
dm_control = "/no-dm-control"
`, root, n.name, n.state, filepath.Join(t.TempDir(), "control.sock"), n.status, freeTCPPort(t), kc, checksOff,
		cert, config.ShortDuration(maxErr), healthz.URL+"/healthz")
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

	w := watchNode(t, s, n.name)
	allTrue := func(node *corev1.Node) bool {
		for _, ty := range types {
			if c := cond(node, ty); c == nil || c.Status != corev1.ConditionTrue {
				return false
			}
		}
		return true
	}
	n.start()
	waitNode(t, s, n.name, "NodeTampered=False (the baseline taken)", has("NodeTampered", corev1.ConditionFalse, "NodeIntact"))
	catalogWrite(t, prot, "apiVersion: v1\nserver: https://evil.example\n")
	first := waitNodeFor(t, s, n.name, time.Minute, "every condition True", allTrue)
	ltt := map[string]metav1.Time{}
	for _, ty := range types {
		ltt[ty] = cond(first, ty).LastTransitionTime
	}
	waitNodeFor(t, s, n.name, time.Minute, "the report's documents with their content", func(node *corev1.Node) bool {
		for d := range reportContent {
			if !docHas(node, d) {
				return false
			}
		}
		return true
	})

	// settled waits for the restarted daemon's first full pass, its
	// first report written after the start (every document, each with an
	// updatedAt at or after it: the report is written once the conditions
	// are on the Node), then for the watch to have delivered the Node as
	// it is then. noPending: no change of the conditions pending either
	// (a change of a message alone waits for the next heartbeat: pending).
	settled := func(what string, started time.Time, noPending bool) {
		t.Helper()
		eventually(t, time.Minute, what+": the first pass done and written", func() (bool, string) {
			st := n.statusDoc()
			return st.Ready && !st.Started.Before(started.Truncate(time.Second)) && st.Kubernetes.State == "reporting" && (!noPending || !st.Kubernetes.StatusPending),
				fmt.Sprintf("ready %v, started %s, kubernetes %s, pending %v", st.Ready, st.Started, st.Kubernetes.State, st.Kubernetes.StatusPending)
		})
		node := waitNodeFor(t, s, n.name, time.Minute, what+": the report of this start", func(node *corev1.Node) bool {
			for d := range reportContent {
				var doc struct {
					UpdatedAt time.Time `json:"updatedAt"`
				}
				if json.Unmarshal([]byte(node.Annotations[report.AnnotationPrefix+d]), &doc) != nil || doc.UpdatedAt.Before(started.Truncate(time.Second)) {
					return false
				}
			}
			return true
		})
		w.sawVersion(t, node)
		if f := w.flaps(types); len(f) > 0 {
			t.Fatalf("%s: flapped on the Node: %v", what, f)
		}
		if l := w.lostReport(); len(l) > 0 {
			t.Fatalf("%s: the report lost its content: %v", what, l)
		}
	}

	n.kill()
	settled("SIGKILL, restart at once", n.start(), false)

	seed := uint64(time.Now().UnixNano())
	rng := mathrand.New(mathrand.NewPCG(seed, 0))
	t.Logf("kill points from seed %d", seed)
	for range 4 {
		n.kill()
		n.start()
		time.Sleep(time.Duration(rng.Int64N(int64(3 * time.Second)))) // the kill point under test (in the 3 s first-run spread), not a wait for a condition
	}
	n.kill()
	settled("SIGKILLs in the first pass", n.start(), false)

	n.stop()
	settled("SIGTERM, restart", n.start(), false)

	n.kill()
	if err := os.RemoveAll(n.state); err != nil {
		t.Fatal(err)
	}
	settled("SIGKILL, state directory removed, restart", n.start(), false)

	// A reload that changes nothing.
	reloaded := time.Now()
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the reload done", func() (bool, string) {
		st := n.statusDoc()
		r := st.Config.LastReload
		return r != nil && !r.At.Before(reloaded.Truncate(time.Second)), fmt.Sprintf("%+v", r)
	})
	settled("a reload that changes nothing", time.Time{}, true)

	// The first runs after the restart fail: NodeInfoStale's file is a
	// directory (an error), DiskUsageHigh's only mount point is gone (its
	// statfs fails: an error); /healthz answers nothing (the probe's
	// timeout: a failed probe, True).
	n.kill()
	if err := os.Remove(nodesJSON); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(nodesJSON, 0o755); err != nil {
		t.Fatal(err)
	}
	catalogWrite(t, mountinfo, "29 1 0:99 / /gone rw,relatime shared:1 - ext4 /dev/vdz1 rw\n")
	hang.Store("on", true)
	started := n.start()
	var failedRuns []daemon.ConditionStatus
	// Run after the restart: its result recorded, or held through (a held
	// run leaves the condition as it was, its failed run in Held).
	eventually(t, time.Minute, "NodeInfoStale and DiskUsageHigh run after the restart", func() (bool, string) {
		st := n.statusDoc()
		failedRuns = nil
		for _, c := range st.Conditions {
			if (c.Type == "NodeInfoStale" || c.Type == "DiskUsageHigh") && (!c.LastUpdateTime.Before(started) || c.Held != nil && !c.Held.Since.Before(started)) {
				failedRuns = append(failedRuns, c)
			}
		}
		return len(failedRuns) == 2 && !st.Started.Before(started.Truncate(time.Second)), fmt.Sprintf("%+v", st.Conditions)
	})
	for _, c := range failedRuns {
		if c.Status != report.StatusTrue || c.Held == nil || c.Held.Runs != 1 {
			t.Errorf("%s after a failed first run: %s/%s, held through %+v; want True held through 1 failed run", c.Type, c.Status, c.Reason, c.Held)
		}
	}
	settled("first runs failing after the restart", started, false)
	n.kill()
	os.Remove(nodesJSON)
	stale()
	catalogWrite(t, mountinfo, "29 1 0:99 / /data rw,relatime shared:1 - ext4 /dev/vdz1 rw\n")
	hang.Delete("on")
	settled("failing input restored, restart", n.start(), false)

	last, err := s.Admin.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ty := range types {
		c := cond(last, ty)
		if want := ltt[ty]; c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&want) {
			t.Errorf("%s at the end: %s/%s since %s; want True since %s", ty, c.Status, c.Reason, c.LastTransitionTime.Format(time.RFC3339), want.Format(time.RFC3339))
		}
	}
	w.mu.Lock()
	seen := len(w.seen)
	w.mu.Unlock()
	t.Logf("%d conditions True (%v) through 9 SIGKILLs, a SIGTERM, a lost state, failed first runs and a reload: %d Node versions watched, no flap", len(types), types, seen)
}
