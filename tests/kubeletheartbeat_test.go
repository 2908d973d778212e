//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// standinKubeletLog is a stand-in kubelet.service that writes klog lines to
// stderr as kubelet does: at start its version and one failed node-status
// try ("will retry": not a give-up), and on SIGHUP the line kubelet logs
// when it gives up a node-status update (kubelet_node_status.go,
// klog.ErrorS(err, "Unable to update node status")).
const standinKubeletLog = `#!/bin/sh
klog() { echo "$1$(date -u '+%m%d %H:%M:%S.%6N')    $$ $2" >&2; }
klog I 'server.go:487] "Kubelet version" kubeletVersion="v1.31.0"'
klog E 'kubelet_node_status.go:549] "Error updating node status, will retry" err="error getting node \"n1\": Get \"https://10.0.0.1:6443/api/v1/nodes/n1?timeout=10s\": dial tcp 10.0.0.1:6443: connect: connection refused"'
trap 'klog E "kubelet_node_status.go:536] \"Unable to update node status\" err=\"update node status exceeds retry count\""' HUP
while :; do sleep infinity & s=$!; wait $s; kill $s 2>/dev/null; done
`

// TestKubeletHeartbeatRealJournald: a real systemd-journald in a namespaced
// systemd holds the entries of a stand-in kubelet.service; the check reads
// them with the real journalctl (--root on the namespace's root). It is
// False while kubelet only logs a failed try, True once kubelet logs the
// give-up, and False again, with the time of that entry, once a whole window
// (the check's interval, 2 s here) has passed without another. A daemon
// restarted within the boot continues after the saved cursor: the old
// give-up is not counted again, a new one is.
func TestKubeletHeartbeatRealJournald(t *testing.T) {
	s, journalctl := startJournald(t, "journal")
	defer func() {
		if t.Failed() {
			t.Logf("journal of kubelet.service:\n%s", s.Journal("kubelet.service"))
		}
	}()
	ctx := context.Background()
	startStandinKubelet(t, s, standinKubeletLog, "stand-in kubelet (klog lines)")

	const window = 2 * time.Second
	state := t.TempDir()
	newCheck := func(store *report.Store) checks.Check {
		cfg := config.Default()
		cfg.HostRoot = s.Root("/")
		cfg.Checks.KubeletHeartbeatFailed.Journalctl = journalctl
		cfg.Checks.KubeletHeartbeatFailed.Interval = config.Duration{Duration: window}
		env := &checks.Env{Config: cfg, NodeName: "n", Role: report.RoleWorker, Log: quiet(), Sys: checks.RealSys(), Now: time.Now, Memos: store}
		c, err := checks.NewForTest("KubeletHeartbeatFailed", env)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	store := report.NewStore("boot-1")
	if _, err := store.Load(state); err != nil {
		t.Fatal(err)
	}
	c := newCheck(store)
	probe := func() checks.Result {
		t.Helper()
		r, err := c.Probe(ctx)
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		return r
	}
	// await probes until ok; every probe on the way must be True or False.
	await := func(what string, limit time.Duration, ok func(checks.Result) bool) checks.Result {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			r := probe()
			if ok(r) {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting %s for %s; last: %s/%s %q", limit, what, r.Status, r.Reason, r.Message)
			}
			time.Sleep(100 * time.Millisecond) // polling the journal through the check
		}
	}
	isFalse := func(r checks.Result) bool {
		return r.Status == report.StatusFalse && r.Reason == report.ReasonKubeletHeartbeatOK
	}
	isTrue := func(r checks.Result) bool {
		return r.Status == report.StatusTrue && r.Reason == report.ReasonNodeStatusUpdateGaveUp
	}

	// Kubelet's start and a failed try: in the journal, and not a give-up.
	eventually(t, 10*time.Second, "the stand-in's failed try in the journal", func() (bool, string) {
		j := s.Journal("kubelet.service")
		return strings.Contains(j, `"Error updating node status, will retry"`), j
	})
	r := probe()
	if !isFalse(r) || !strings.Contains(r.Message, "none since") {
		t.Fatalf("before a give-up: %s/%s %q", r.Status, r.Reason, r.Message)
	}
	t.Logf("before: %s %q", r.Status, r.Message)

	// Kubelet gives up.
	gaveUp := time.Now()
	if err := s.KillMain(ctx, "kubelet.service", int32(syscall.SIGHUP)); err != nil {
		t.Fatal(err)
	}
	r = await("True after the give-up", 10*time.Second, isTrue)
	t.Logf("after the give-up: %s %q", r.Status, r.Message)
	if !regexp.MustCompile(`: E\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ kubelet_node_status.go:536\] "Unable to update node status" err="update node status exceeds retry count"$`).MatchString(r.Message) {
		t.Errorf("True message does not carry kubelet's line: %q", r.Message)
	}
	at := regexp.MustCompile(`logged at (\S+) `).FindStringSubmatch(r.Message)
	if at == nil {
		t.Fatalf("no time in %q", r.Message)
	}
	when, err := time.Parse(time.RFC3339, at[1])
	if err != nil || when.Before(gaveUp.Truncate(time.Second)) || when.After(time.Now()) {
		t.Errorf("give-up logged at %s (%v), sent at %s", at[1], err, gaveUp.Format(time.RFC3339Nano))
	}

	// A whole window without another: False, with the time of the last one.
	r = await("False after a clean window", window+10*time.Second, isFalse)
	t.Logf("a window later: %s %q", r.Status, r.Message)
	if !strings.Contains(r.Message, "the last one at "+at[1]) {
		t.Errorf("False message does not name the last give-up (%s): %q", at[1], r.Message)
	}

	// The daemon restarts within the boot: it continues after the saved
	// cursor, so the old give-up is not read again.
	if err := store.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}
	store2 := report.NewStore("boot-1")
	if _, err := store2.Load(state); err != nil {
		t.Fatal(err)
	}
	c = newCheck(store2)
	r = probe()
	if !isFalse(r) || !strings.Contains(r.Message, "the last one at "+at[1]) {
		t.Errorf("after a restart: %s/%s %q", r.Status, r.Reason, r.Message)
	}
	// And a new give-up is True again.
	if err := s.KillMain(ctx, "kubelet.service", int32(syscall.SIGHUP)); err != nil {
		t.Fatal(err)
	}
	r = await("True after the second give-up", 10*time.Second, isTrue)
	if !strings.Contains(r.Message, "; 1 such entries since the last run)") {
		t.Errorf("second give-up: %q", r.Message)
	}
}

// journalSystemd starts a real systemd in a namespace (the test fails where
// this machine cannot run one), in a new directory named for prefix, and
// finds journalctl; the systemd is stopped and the directory removed at the
// test's end. Its journald is not started: startJournald starts it, a test
// that sets journald.conf first starts it itself.
func journalSystemd(tb testing.TB, prefix string) (*harness.Systemd, string) {
	tb.Helper()
	if why := harness.SystemdAvailable(); why != "" {
		tb.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	journalctl, err := findJournalctl()
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "autopilot-health-"+prefix+"-"+harness.Token()+"-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	s, err := harness.StartSystemd(dir, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s, journalctl
}

// startJournald is journalSystemd's systemd with its journald started.
func startJournald(tb testing.TB, prefix string) (*harness.Systemd, string) {
	tb.Helper()
	s, journalctl := journalSystemd(tb, prefix)
	if err := s.StartUnit(context.Background(), "systemd-journald.service"); err != nil {
		tb.Fatalf("starting journald: %v", err)
	}
	return s, journalctl
}

// startStandinKubelet runs script as kubelet.service in s, its unit
// described as description (no Description= where it is ""), until the
// test's end.
func startStandinKubelet(tb testing.TB, s *harness.Systemd, script, description string) {
	tb.Helper()
	ctx := context.Background()
	if err := os.WriteFile(filepath.Join(s.Units, "kubelet.sh"), []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	unit := "[Unit]\n"
	if description != "" {
		unit += "Description=" + description + "\n"
	}
	unit += "DefaultDependencies=no\n\n[Service]\nExecStart=/bin/sh /etc/systemd/system/kubelet.sh\n"
	if err := s.AddUnit(ctx, "kubelet.service", unit); err != nil {
		tb.Fatal(err)
	}
	if err := s.StartUnit(ctx, "kubelet.service"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.StopUnit(ctx, "kubelet.service") })
}

// findJournalctl is systemd's journalctl on this machine.
func findJournalctl() (string, error) {
	for _, p := range []string{"/usr/bin/journalctl", "/bin/journalctl"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("journalctl missing (apt install systemd)")
}
