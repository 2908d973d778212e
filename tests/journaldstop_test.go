//go:build integration

package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/tests/harness"
)

// The daemon under its shipped unit in a real systemd 252, its stderr the
// stream socket to that systemd's journald, while journald is stopped
// (SIGSTOP: a journald stuck on a full or slow disk does the same). The
// socket's buffer is filled through the daemon's own stderr (pidfd_getfd:
// what a long outage of the journal accumulates from the daemon's lines,
// written by the test at once), so the daemon's next log line meets a full
// socket. A check flapping every second logs a line per change.
//
// While journald is stopped the daemon works on: /healthz answers 200 (no
// loop stuck behind a log write, so the watchdog is fed), `status` answers,
// the flapping condition keeps reaching the Node, the check runs every
// second, systemd restarts nothing. Before, the check's loop blocked in
// its first log line, every other check behind the store's notify lock:
// the Node saw no change after the stop, /healthz answered 503 naming
// check/KubeletUnhealthy 32 s in, and the watchdog's pings stopped. Once
// journald runs again each change made meanwhile is in the journal.
func TestDaemonWorksOnWhileJournaldIsStopped(t *testing.T) {
	harness.Parallel(t, 1)
	const unit = "autopilot-health.service"
	api := apiServer(t)
	node := "journald-" + harness.Token()
	registerNode(t, api, node)

	// kubelet's /healthz, alternating 200 and 500.
	port, _ := flappingHealthz(t)
	metricsPort := freeTCPPort(t)
	cfg := fmt.Sprintf("node_name = %q\n", node) + fmt.Sprintf(goodConfig, metricsPort) +
		"\n[kubernetes]\nkubeconfig = \"/etc/autopilot-health/kubelet.conf\"\n" +
		fmt.Sprintf("\n[checks.KubeletUnhealthy]\ninterval = \"1s\"\ntimeout = \"1s\"\nrestart_cooldown = \"2s\"\nhealthz_url = \"http://127.0.0.1:%d/healthz\"\n", port)
	s := daemonNamespace(t, "journaldstop", nil, cfg, unit)

	// The node's credentials inside the namespace (the host's /tmp, where
	// the API server's files are, is not the unit's: PrivateTmp=yes).
	kc, err := api.NodeKubeconfig(node, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	etc := s.Root("/etc/autopilot-health")
	for from, to := range map[string]string{filepath.Join(filepath.Dir(kc), "client.pem"): "client.pem", filepath.Join(api.Dir, "pki", "ca.crt"): "ca.crt"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: %s\n    certificate-authority: /etc/autopilot-health/ca.crt\nusers:\n- name: node\n  user:\n    client-certificate: /etc/autopilot-health/client.pem\n    client-key: /etc/autopilot-health/client.pem\ncontexts:\n- name: test\n  context: {cluster: test, user: node}\ncurrent-context: test\n", api.URL)
	if err := os.WriteFile(filepath.Join(etc, "kubelet.conf"), []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	if err := s.StartUnit(ctx, unit); err != nil {
		t.Fatal(err)
	}
	waitUnitFor(t, s, unit, time.Minute, "active", active)
	base := fmt.Sprintf("http://127.0.0.1:%d", metricsPort)
	// transition is KubeletUnhealthy's status and transition time on the Node.
	transition := func() string {
		n, err := api.Admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return "get: " + err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "KubeletUnhealthy" {
				return string(c.Status) + " " + c.LastTransitionTime.UTC().Format(time.RFC3339)
			}
		}
		return ""
	}
	eventually(t, time.Minute, "KubeletUnhealthy on the Node", func() (bool, string) {
		tr := transition()
		var kube []string
		for _, l := range strings.Split(s.Journal(unit), "\n") {
			if !strings.Contains(l, "condition changed") {
				kube = append(kube, l)
			}
		}
		return strings.HasPrefix(tr, "True") || strings.HasPrefix(tr, "False"), tr + "\n" + lastBytes(strings.Join(kube, "\n"), 3000)
	})

	// journald stopped.
	changes0 := changeLines(s.Journal(unit))
	if err := s.KillMain(ctx, "systemd-journald.service", int32(syscall.SIGSTOP)); err != nil {
		t.Fatal(err)
	}
	continued := false
	cont := func() {
		if !continued {
			continued = true
			if err := s.KillMain(ctx, "systemd-journald.service", int32(syscall.SIGCONT)); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(cont)

	// Its stream socket filled through the daemon's own stderr.
	sp, err := s.Properties(ctx, unit, "Service")
	if err != nil {
		t.Fatal(err)
	}
	mainPID, _ := sp["MainPID"].Value().(uint32)
	dir, _, err := hostStatus(s, mainPID)
	if err != nil {
		t.Fatal(err)
	}
	var hostPID int
	fmt.Sscanf(filepath.Base(dir), "%d", &hostPID)
	filled := fillStderr(t, hostPID)
	t.Logf("journald stopped; the daemon's stderr socket (journald's stream) took %d bytes more before a write would block", filled)

	// 50 s: past the flapping check's stuck threshold (interval 1 s +
	// timeout 1 s + 30 s), and past the kernel log reader's (40 s).
	status := filepath.Join(s.Root("/usr"), "bin", "autopilot-health")
	sock := s.Root("/run/autopilot-health/status.sock")
	transitions := map[string]bool{}
	var bad []string
	runs := func() float64 {
		page, _ := httpGet(base + "/metrics")
		ok, _ := metricValue(page, `autopilot_health_check_runs_total{check="KubeletUnhealthy",result="ok"}`)
		pr, _ := metricValue(page, `autopilot_health_check_runs_total{check="KubeletUnhealthy",result="problem"}`)
		return ok + pr
	}
	runs0 := runs()
	start := time.Now()
	for time.Since(start) < 50*time.Second {
		at := time.Since(start).Round(time.Second)
		c := http.Client{Timeout: 3 * time.Second}
		if resp, err := c.Get(base + "/healthz"); err != nil {
			bad = append(bad, fmt.Sprintf("%s: /healthz: %v", at, err))
		} else {
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				bad = append(bad, fmt.Sprintf("%s: /healthz %s: %s", at, resp.Status, strings.TrimSpace(string(b[:n]))))
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		// Exit 1: answered, a condition is True (the flapping one).
		if out, err := exec.CommandContext(sctx, status, "status", "--json", "--socket", sock).CombinedOutput(); err != nil && !(sctx.Err() == nil && strings.Contains(err.Error(), "exit status 1") && strings.HasSuffix(strings.TrimSpace(string(out)), "}")) {
			bad = append(bad, fmt.Sprintf("%s: status: %v: %s", at, err, lastBytes(string(out), 300)))
		}
		cancel()
		transitions[transition()] = true
		time.Sleep(time.Second)
	}
	runs1 := runs()
	t.Logf("50 s with journald stopped: %d KubeletUnhealthy transitions seen on the Node, %.0f check runs, %d failed looks", len(transitions), runs1-runs0, len(bad))
	for _, b := range bad {
		t.Error(b)
	}
	if len(transitions) < 10 {
		t.Errorf("the flapping condition reached the Node %d times in 50 s with journald stopped; want at least 10: %v", len(transitions), transitions)
	}
	if runs1-runs0 < 20 {
		t.Errorf("%.0f runs of a 1 s check in 50 s with journald stopped", runs1-runs0)
	}
	if sp, err := s.Properties(ctx, unit, "Service"); err == nil {
		if n, _ := sp["NRestarts"].Value().(uint32); n != 0 {
			t.Errorf("the daemon was restarted %d times while journald was stopped", n)
		}
	}

	// journald continued: the lines the socket and the daemon's log
	// writer held reach the journal, each change of the stop's; 50 s of
	// one change a second fit the writer's bound, so none is dropped
	// (the drops and their line: internal/logsink's tests).
	cont()
	eventually(t, 30*time.Second, "every change of the stop in the journal", func() (bool, string) {
		n := changeLines(s.Journal(unit))
		return n-changes0 >= len(transitions)-1, fmt.Sprintf("%d lines of changes since the stop for %d transitions seen on the Node", n-changes0, len(transitions))
	})
	page, _ := httpGet(base + "/metrics")
	if dropped, ok := metricValue(page, "autopilot_health_log_lines_dropped_total"); !ok || dropped != 0 {
		t.Errorf("autopilot_health_log_lines_dropped_total = %v (exposed %v); want 0: 50 s of a flapping check fit the log writer's bound", dropped, ok)
	}
}

// changeLines counts the lines of KubeletUnhealthy's changes in a journal.
func changeLines(j string) int {
	n := 0
	for _, l := range strings.Split(j, "\n") {
		if strings.Contains(l, "condition changed") && strings.Contains(l, "condition=KubeletUnhealthy") {
			n++
		}
	}
	return n
}

// fillStderr writes into the stderr of process pid (a stream socket to a
// stopped journald), never blocking (MSG_DONTWAIT: O_NONBLOCK would be the
// daemon's file's too), until the socket takes no more. The lines are long,
// so that journald, continued, has few of them to read.
func fillStderr(t *testing.T, pid int) int {
	t.Helper()
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(pfd)
	fd, err := unix.PidfdGetfd(pfd, 2, 0)
	if err != nil {
		t.Fatalf("pidfd_getfd %d 2: %v", pid, err)
	}
	defer unix.Close(fd)
	line := []byte("<7>filler of TestDaemonWorksOnWhileJournaldIsStopped " + strings.Repeat("x", 32<<10) + "\n")
	total := 0
	for {
		n, err := unix.SendmsgN(fd, line, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		total += max(n, 0)
		if errors.Is(err, unix.EAGAIN) {
			return total
		}
		if err != nil {
			t.Fatalf("writing the daemon's stderr: %v", err)
		}
	}
}
