package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report/kube/kubefake"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// notifySocket listens on a real unix datagram socket as systemd does and
// points NOTIFY_SOCKET at it.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	p := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", p)
	return c
}

// next reads datagrams until one satisfies match, or fails after 10 s.
// The socket is left without a deadline: a reader that goes on after it
// (statusLineSettles', the reload storm's) would otherwise stop at the
// 10 s mark with a timeout taken for the socket's close, and the daemon's
// next notification block on a queue nobody reads (make test-race's first
// whole run: TestReloadNeverLeavesAnOlderStatusLine failed at round 264-423,
// 10 s in, and hung once, where its 500 rounds take 9 s without -race).
func next(t *testing.T, c *net.UnixConn, what string, match func(string) bool) string {
	t.Helper()
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 4096)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.SetReadDeadline(deadline)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if m := string(buf[:n]); match(m) {
			return m
		}
	}
}

// testConfig is hermetic: the host is a fixture tree (one filesystem, a
// boot id), there is no kubeconfig and no kernel log (tests/ covers the real
// /dev/kmsg and API server), so the tests pass the same on a real node.
func testConfig(t testing.TB) *config.Config {
	c := config.Default()
	root := t.TempDir()
	for p, content := range map[string]string{
		"proc/sys/kernel/random/boot_id": "0f6c4a0e-3b1d-4a57-9a3c-5d1f6f0b2c11\n",
		"proc/self/mountinfo":            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n",
	} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.HostRoot = root
	c.Kubernetes.Kubeconfig = ""
	c.Kmsg.Enabled = false
	c.Status.Socket = "" // TestStatusSocket sets one of its own
	c.StateDir = t.TempDir()
	c.Runner.FirstRunSpread = config.Duration{}
	c.NodeName = "test-node"
	c.Role = "worker"
	c.GPU = "false"
	// These reach the host's systemd (and would restart its kubelet);
	// tests/ runs them against a systemd of their own.
	c.Checks.KubeletUnhealthy.Enabled = false
	c.Checks.ContainerRuntimeUnhealthy.Enabled = false
	c.Checks.ServiceNotRecovering.Enabled = false
	c.Checks.NodeServiceDown.Enabled = false
	return c
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The systemd lifecycle over a real datagram socket: READY=1 with a status
// line after the first pass, WATCHDOG=1 only while every loop makes
// progress, STOPPING=1 on shutdown, and the state saved.
func TestLifecycleOverRealNotifySocket(t *testing.T) {
	sock := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	cfg := testConfig(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()

	st := next(t, sock, "starting status", func(m string) bool { return strings.HasPrefix(m, "STATUS=") })
	if st != fmt.Sprintf("STATUS=starting: first pass of %d checks", len(d.runner.Checks())) {
		t.Errorf("first status %q", st)
	}
	ready := next(t, sock, "READY=1", func(m string) bool { return strings.HasPrefix(m, "READY=1") })
	// the checks and the kernel conditions (DisksFailure has a part in both)
	evaluated := map[string]bool{}
	for _, c := range append(d.runner.Checks(), KmsgExternal(d.kmsg)...) {
		evaluated[c] = true
	}
	if !strings.HasPrefix(ready, fmt.Sprintf("READY=1\nSTATUS=%d conditions: ", len(evaluated))) {
		t.Errorf("ready message %q", ready)
	}
	next(t, sock, "WATCHDOG=1", func(m string) bool { return m == "WATCHDOG=1" })

	url := "http://" + d.Addr().String()
	if code, body := get(t, url+"/healthz"); code != 200 || !strings.HasPrefix(body, "ok: ") {
		t.Errorf("healthz while healthy: %d %q", code, body)
	}

	// A loop that stops making progress: /healthz fails naming it, and the
	// watchdog pings stop.
	// (a negative allowed silence: the loop is overdue at once)
	d.live.Expect("test/stuck", -loopSlack-time.Second)
	// A scrape says so by itself, without a /healthz request or a
	// watchdog tick before it.
	if _, page := get(t, url+"/metrics"); !strings.Contains(page, "\nautopilot_health_healthy 0\n") {
		t.Errorf("a scrape while a loop is stuck does not say unhealthy:\n%s", grepLines(page, "autopilot_health_healthy"))
	}
	code, body := get(t, url+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "test/stuck (no progress for") {
		t.Errorf("healthz while stuck: %d %q", code, body)
	}
	drain(sock)
	sock.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) // 2.5 watchdog periods
	buf := make([]byte, 4096)
	for {
		n, err := sock.Read(buf)
		if err != nil {
			break // timeout: no ping came
		}
		if string(buf[:n]) == "WATCHDOG=1" {
			t.Fatal("WATCHDOG=1 sent while a loop was stuck")
		}
	}
	d.live.Forget("test/stuck")
	if _, page := get(t, url+"/metrics"); !strings.Contains(page, "\nautopilot_health_healthy 1\n") {
		t.Errorf("a scrape after the loop recovered does not say healthy:\n%s", grepLines(page, "autopilot_health_healthy"))
	}
	next(t, sock, "WATCHDOG=1 after recovery", func(m string) bool { return m == "WATCHDOG=1" })

	cancel()
	next(t, sock, "STOPPING=1", func(m string) bool { return m == "STOPPING=1" })
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(cfg.StateDir, report.StateFileName))
	if err != nil || !bytes.Contains(b, []byte(`"ClockNotSynchronized"`)) {
		t.Errorf("state not saved on shutdown: %v %s", err, b)
	}
}

func drain(c *net.UnixConn) {
	buf := make([]byte, 4096)
	for {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A restart restores the conditions with their transition times before the
// first run, so nothing flaps.
func TestRestartKeepsTransitionTimes(t *testing.T) {
	cfg := testConfig(t)
	run := func() report.Condition {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		for {
			// Ready first, then the condition: read the other way round, a
			// restored condition read just before the first pass ended
			// passed for this run's (the test failed once so on a loaded
			// machine).
			if !d.readyNow() {
				select {
				case err := <-done:
					t.Fatalf("daemon stopped: %v", err)
				case <-time.After(10 * time.Millisecond):
				}
				continue
			}
			if c, ok := d.Store().Get("DiskUsageHigh"); ok && c.LastUpdateTime.After(time.Now().Add(-time.Minute)) {
				cancel()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				return c
			}
			select {
			case err := <-done:
				t.Fatalf("daemon stopped: %v", err)
			case <-d.Store().Changed():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	first := run()
	second := run()
	if first.Status != second.Status || !first.LastTransitionTime.Equal(second.LastTransitionTime) {
		t.Errorf("after restart: %v since %v; before: %v since %v", second.Status, second.LastTransitionTime, first.Status, first.LastTransitionTime)
	}
	if !second.LastUpdateTime.After(first.LastUpdateTime) {
		t.Error("the second run did not evaluate the check again")
	}
}

func (d *Daemon) readyNow() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ready
}

func TestMetricsEndpoint(t *testing.T) {
	cfg := testConfig(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "v9", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	for !d.readyNow() {
		<-time.After(5 * time.Millisecond)
	}
	code, body := get(t, "http://"+d.Addr().String()+"/metrics")
	for _, want := range []string{
		`autopilot_health_build_info{goversion=`,
		`autopilot_health_ready 1`,
		`problem_gauge{reason="ClockUnsynchronized",type="ClockNotSynchronized"}`,
		`autopilot_health_check_runs_total{check="DiskUsageHigh",result=`,
		`problem_counter{reason="TaskHung"} 0`,
		`autopilot_health_loop_last_progress_timestamp_seconds{loop="check/DiskUsageHigh"}`,
		// No kubeconfig: standalone.
		`autopilot_health_kubernetes_reporting 0`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %s", code, want)
		}
	}
	if strings.Contains(body, `type="GpuFallenOffBus"`) || strings.Contains(body, `reason="NvidiaXidError"`) {
		t.Error("GPU-only series on a node without a GPU")
	}
}

// A metrics address the node does not have (yet: an IP configured after
// the daemon starts at boot, EADDRNOTAVAIL) is no reason to refuse to
// start: New records the failure for status and systemd's status line, and
// Run tries again (TestTakenMetricsPortIsRetried).
func TestUnboundMetricsAddressDoesNotRefuseToStart(t *testing.T) {
	cfg := testConfig(t)
	cfg.Metrics.ListenAddress = "192.0.2.1:20257" // TEST-NET-1: on no interface
	d, err := New(cfg, quietLog(), Options{})
	if err != nil {
		t.Fatalf("New: %v, want the daemon to start without the metrics listener", err)
	}
	m := d.metricsStatus()
	if ln := d.metricsListener(); ln != nil {
		ln.Close()
		testenv.Skip(t, "this host binds an address it does not have (net.ipv4.ip_nonlocal_bind)")
	}
	if m.Serving || m.Attempts != 1 || !strings.Contains(m.Error, "listen tcp 192.0.2.1:20257: bind: cannot assign requested address") || d.Addr() != nil {
		t.Errorf("status %+v, Addr %v", m, d.Addr())
	}
	if s := d.StatusLine(); !strings.HasPrefix(s, "metrics not served: "+m.Error+" (retrying); ") {
		t.Errorf("status line %q", s)
	}
}

// Run's error is what makes `autopilot-health run` exit 1. A final save that
// fails (a read-only /var; here the state directory's parent is a file) is
// logged with the directory and the cause and counted, and is not an error:
// systemd would mark the unit failed on every stop. The metrics server
// failing still is one.
func TestRunErrorIsNotTheFinalSave(t *testing.T) {
	cfg := testConfig(t)
	blocker := filepath.Join(t.TempDir(), "var")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = filepath.Join(blocker, "lib", "autopilot-health")
	var logs testenv.SyncBuffer
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Run(ctx); err != nil {
		t.Errorf("Run after a stop whose save failed: %v, want nil", err)
	}
	if !strings.Contains(logs.String(), `level=ERROR msg="saving state on shutdown failed; stopping anyway" dir=`+cfg.StateDir+" err=") ||
		!strings.Contains(logs.String(), "not a directory") {
		t.Errorf("the failed save is not logged with its directory and cause:\n%s", logs.String())
	}
	if n := testutil.ToFloat64(d.metrics.StateWritesFor("error")); n < 1 {
		t.Errorf("%v failed state writes counted", n)
	}

	// The metrics server fails (its listener is closed under it).
	ln, _ = net.Listen("tcp", "127.0.0.1:0")
	d, err = New(testConfig(t), quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := d.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "metrics server: ") {
		t.Errorf("Run with a failed metrics server: %v", err)
	}
}

func TestSummarize(t *testing.T) {
	c := func(ty string, s report.Status) report.Condition { return report.Condition{Type: ty, Status: s} }
	for _, tc := range []struct {
		in   []report.Condition
		want string
	}{
		{[]report.Condition{c("A", "False"), c("B", "False")}, "2 conditions: 2 ok, 0 problems"},
		{[]report.Condition{c("A", "False"), c("DiskUsageHigh", "True")}, "2 conditions: 1 ok, 1 problem (DiskUsageHigh)"},
		{[]report.Condition{c("A", "True"), c("B", "True"), c("C", "Unknown"), c("D", "Unknown"), c("E", "Unknown"), c("F", "Unknown")},
			"6 conditions: 0 ok, 2 problems (A, B), 4 unknown (C, D, E, +1 more)"},
		// A failing check is told apart from one with nothing to check.
		{[]report.Condition{c("A", "False"), {Type: "SealedOSTampered", Status: "Unknown", Reason: report.ReasonNothingToCheck},
			{Type: "DiskUsageHigh", Status: "Unknown", Reason: report.ReasonCheckTimeout}, {Type: "CertificateExpiring", Status: "Unknown", Reason: report.ReasonCheckFailed},
			{Type: "NodeTampered", Status: "Unknown", Reason: report.ReasonBaselinePending}},
			"5 conditions: 1 ok, 0 problems, 2 checks failing (CertificateExpiring, DiskUsageHigh), 2 unknown (NodeTampered, SealedOSTampered)"},
		{[]report.Condition{{Type: "X", Status: "Unknown", Reason: report.ReasonCheckPanicked}},
			"1 condition: 0 ok, 0 problems, 1 check failing (X)"},
	} {
		if got := Summarize(tc.in); got != tc.want {
			t.Errorf("Summarize = %q, want %q", got, tc.want)
		}
	}
}

func TestJournalLogFormat(t *testing.T) {
	var b bytes.Buffer
	log, err := NewLogger(&b, "journal", "debug")
	if err != nil {
		t.Fatal(err)
	}
	log.With("check", "DiskUsageHigh").Warn("check failed", "err", "line1\nline2")
	log.Debug("d")
	log.Error("e")
	log.Info("i")
	want := "<4>level=WARN msg=\"check failed\" check=DiskUsageHigh err=\"line1\\nline2\"\n<7>level=DEBUG msg=d\n<3>level=ERROR msg=e\n<6>level=INFO msg=i\n"
	if b.String() != want {
		t.Errorf("journal output\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	log, _ = NewLogger(&b, "text", "warn")
	log.Info("hidden")
	log.Warn("shown")
	if !strings.HasPrefix(b.String(), "time=") || strings.Contains(b.String(), "hidden") {
		t.Errorf("text output %q", b.String())
	}
	if _, err := NewLogger(&b, "xml", "info"); err == nil {
		t.Error("bad format accepted")
	}
}

// log.format = "json": a value anyone chose (a protected file's name, a
// line of journalctl's output) keeps no character that is not printable:
// encoding/json's escapes for the C0 controls, and \u escapes for DEL, the
// C1 controls and the bidi overrides, which slog's JSON handler writes raw
// into the journal and onto a terminal that follows it. The text and
// journal formats quote them already.
func TestJSONLogFormatIsPrintable(t *testing.T) {
	var b bytes.Buffer
	log, err := NewLogger(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	name := "/etc/cni/net.d/00-\x1b]0;x\x07\n\u009b2J\x7f\u202e.conflist"
	log.Warn("protected file changed since the baseline", "path", name)
	want := `"path":"/etc/cni/net.d/00-\u001b]0;x\u0007\n\u009b2J\u007f\u202e.conflist"}` + "\n"
	if !strings.HasSuffix(b.String(), want) || strings.Count(b.String(), "\n") != 1 {
		t.Errorf("json output %q\nwant it to end in %q", b.String(), want)
	}
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["path"] != name {
		t.Errorf("json output decodes to %v (%v), want the path %q", rec, err, name)
	}
}

func TestStderrIsJournal(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	if StderrIsJournal() {
		t.Error("no JOURNAL_STREAM, yet journal")
	}
	var st = statFd(t, 2)
	t.Setenv("JOURNAL_STREAM", st)
	if !StderrIsJournal() {
		t.Errorf("JOURNAL_STREAM=%s matches stderr, yet not journal", st)
	}
	t.Setenv("JOURNAL_STREAM", "1:2")
	if StderrIsJournal() {
		t.Error("JOURNAL_STREAM of another file taken for stderr")
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func nodeCertPEM(t *testing.T, cn string) string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-365 * 24 * time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	// kubelet-client-current.pem holds the certificate and the key.
	return string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})) + string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestDetect(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root+"/proc/sys/kernel/random/boot_id", "0f2e\n")
	writeFile(t, root+"/proc/sys/kernel/hostname", "Worker-7\n")
	cfg := config.Default()
	cfg.HostRoot = root

	id, err := Detect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if id.NodeName != "worker-7" || id.NodeNameSource != "kernel hostname" || id.Role != report.RoleWorker || id.GPU || id.BootID != "0f2e" {
		t.Errorf("bare host: %+v", id)
	}

	writeFile(t, root+"/var/lib/kubelet/pki/kubelet-client-current.pem", nodeCertPEM(t, "system:node:cp-1.example"))
	writeFile(t, root+"/etc/kubernetes/manifests/kube-apiserver.yaml", "kind: Pod\n")
	writeFile(t, root+"/sys/bus/pci/devices/0000:00:02.0/vendor", "0x8086\n")
	writeFile(t, root+"/sys/bus/pci/devices/0000:00:02.0/class", "0x030000\n")
	writeFile(t, root+"/sys/bus/pci/devices/0000:41:00.0/vendor", "0x10de\n")
	writeFile(t, root+"/sys/bus/pci/devices/0000:41:00.0/class", "0x030200\n")
	id, err = Detect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if id.NodeName != "cp-1.example" || id.Role != report.RoleControlPlane || !id.GPU || id.GPUSource != "NVIDIA GPU at PCI 0000:41:00.0" {
		t.Errorf("control plane GPU host: %+v", id)
	}

	cfg.NodeName, cfg.Role, cfg.GPU = "override", "worker", "false"
	id, _ = Detect(cfg)
	if id.NodeName != "override" || id.Role != report.RoleWorker || id.GPU {
		t.Errorf("overrides ignored: %+v", id)
	}

	os.Remove(root + "/proc/sys/kernel/random/boot_id")
	if _, err := Detect(cfg); err == nil || !strings.Contains(err.Error(), "cannot read the boot id") {
		t.Errorf("missing boot id: %v", err)
	}
}

// kubelet's kubelet-client-current.pem is an absolute link to the dated
// file (/var/lib/kubelet/pki/kubelet-client-<date>.pem): under a host_root
// other than / the node name is the CN of the host's certificate under the
// root, as CertRenewalFailing reads it, not the kernel hostname because
// the link was followed from the daemon's own / and found nothing.
func TestDetectNodeNameThroughKubeletsAbsoluteLink(t *testing.T) {
	const dated = "/var/lib/kubelet/pki/kubelet-client-2026-06-01-00-00-00.pem"
	root := t.TempDir()
	writeFile(t, root+"/proc/sys/kernel/random/boot_id", "0f2e\n")
	writeFile(t, root+"/proc/sys/kernel/hostname", "host-7\n")
	writeFile(t, root+dated, nodeCertPEM(t, "system:node:worker-7.example"))
	if err := os.Symlink(dated, root+"/var/lib/kubelet/pki/kubelet-client-current.pem"); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot = root
	id, err := Detect(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := "kubelet client certificate /var/lib/kubelet/pki/kubelet-client-current.pem"; id.NodeName != "worker-7.example" || id.NodeNameSource != want {
		t.Errorf("node name %q from %q; want \"worker-7.example\" from %q", id.NodeName, id.NodeNameSource, want)
	}
}

// "GPU node" is decided by the same PCI scan GpuActivationFailed counts
// the GPUs with (checks.NvidiaGPUs), on the check's fixture trees: an
// NVIDIA audio function, an NVSwitch or another vendor's display
// controller does not make a GPU node; a GPU bound to vfio-pci does, even
// where it is the only one (GpuActivationFailed leaves it out).
func TestDetectGPUFromPCITrees(t *testing.T) {
	for tree, want := range map[string]string{
		"pci-no-gpu":    "no NVIDIA GPU on PCI",
		"pci-1-gpu":     "NVIDIA GPU at PCI 0000:3b:00.0",
		"pci-4-gpu":     "NVIDIA GPU at PCI 0000:18:00.0, 0000:2a:00.0, 0000:ab:00.0, 0000:ba:00.0",
		"pci-vfio":      "NVIDIA GPU at PCI 0000:18:00.0, 0000:2a:00.0 (bound to vfio-pci), 0000:ab:00.0, 0000:ba:00.0 (bound to vfio-pci)",
		"pci-vfio-only": "NVIDIA GPU at PCI 0000:3b:00.0 (bound to vfio-pci)",
	} {
		cfg := config.Default()
		cfg.HostRoot, _ = filepath.Abs(filepath.Join("../../checks/testdata/roots", tree))
		_, _, gpu, source := DetectRoleGPU(cfg, nil)
		if gpu != (tree != "pci-no-gpu") || source != want {
			t.Errorf("%s: gpu %t, %q; want %q", tree, gpu, source, want)
		}
	}
}

// Events emitted before the reporter runs (e.g. while the node has not
// joined and the kubeconfig does not exist yet) are queued, not lost.
func TestEventsBeforeReporterAreQueued(t *testing.T) {
	cfg := testConfig(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, Kube: kubefake.New(client)})
	if err != nil {
		t.Fatal(err)
	}
	d.Store().Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:1 blocked for more than 120 seconds.", Time: time.Now()})
	runDaemon(t, d)
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, _ := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if evs != nil && len(evs.Items) == 1 && evs.Items[0].Reason == "TaskHung" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event emitted before Run never reached the API: %+v", evs)
		}
		time.Sleep(20 * time.Millisecond) // the event loop flushes every second
	}
}

// On a first boot the kube-apiserver manifest appears after the daemon
// started: the role is detected again, the checks are re-planned (a
// worker-only check now reports Unknown/NotApplicable), the change is logged
// once, and the report annotations carry the new role.
func TestRoleRedetected(t *testing.T) {
	cfg := testConfig(t)
	cfg.Role = ""
	cfg.Detect.Interval = config.Duration{Duration: 20 * time.Millisecond}
	cfg.Kubernetes.ReportInterval = config.Duration{Duration: 20 * time.Millisecond}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	var logs testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	d, err := New(cfg, log, Options{Version: "test", Listener: ln, Kube: kubefake.New(client)})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	roleIn := func(role string) func() bool {
		return func() bool {
			n, err := client.CoreV1().Nodes().Get(context.Background(), cfg.NodeName, metav1.GetOptions{})
			return err == nil && strings.Contains(n.Annotations["autopilot.syself.com/storage"], `"role":"`+role+`"`)
		}
	}
	await(t, d, "ProxyNotServing evaluated on a worker", func() bool {
		c, ok := d.Store().Get("ProxyNotServing")
		return ok && c.Reason != report.ReasonNotApplicable
	})
	await(t, d, "the report annotations say worker", roleIn("worker"))

	manifest := cfg.HostPath(cfg.Detect.ControlPlaneManifest)
	os.MkdirAll(filepath.Dir(manifest), 0o755)
	if err := os.WriteFile(manifest, []byte("apiVersion: v1\nkind: Pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	await(t, d, "ProxyNotServing set aside on a control plane node", func() bool {
		c, _ := d.Store().Get("ProxyNotServing")
		return c.Status == report.StatusUnknown && c.Reason == report.ReasonNotApplicable
	})
	await(t, d, "the report annotations say controlplane", roleIn("controlplane"))
	if slices.Contains(d.currentRunner().Checks(), "ProxyNotServing") {
		t.Error("the worker-only check still runs")
	}
	// A few more detection rounds: the change is logged once.
	time.Sleep(100 * time.Millisecond) // several detection intervals, to see no second log line
	if n := strings.Count(logs.String(), "node identity changed"); n != 1 {
		t.Errorf("the change was logged %d times:\n%s", n, logs.String())
	}
}

// await waits until cond holds, re-checking on every store change and at
// least every 10 ms, for at most 10 s.
func await(t *testing.T, d *Daemon, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-d.Store().Changed():
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("waiting for %s", what)
		}
	}
}

// grepLines is the lines of page that contain sub.
func grepLines(page, sub string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// The daemon lets its start-up pages go after the first pass and once more
// after trimAgainAfter (README, Cost: "Start-up pages let go"), as Run wires
// it, not only when trim.StartupPages is called by hand (TestTrimStartupPages).
func TestRunTrimsAfterTheFirstPassAndAgain(t *testing.T) {
	after, grid := trimAgainAfter, trimAgainGrid
	t.Cleanup(func() { trimAgainAfter, trimAgainGrid = after, grid }) // after the daemon stopped
	trimAgainAfter, trimAgainGrid = 50*time.Millisecond, 50*time.Millisecond
	f := newFileDaemon(t, "", Options{})
	f.start(t)
	for _, line := range []string{"trimmed the start-up pages of the binary", "trimmed the pages of the binary once more"} {
		await(t, f.Daemon, fmt.Sprintf("%q in the log", line), func() bool { return strings.Contains(f.logs.String(), line) })
	}
}

// runDaemon runs d until the test ends, then stops it and waits for Run to
// return.
func runDaemon(t *testing.T, d *Daemon) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// startDaemon runs d until stop is called, which stops it, waits for Run
// to return and fails the test if Run returned an error.
func startDaemon(t *testing.T, d *Daemon) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}
