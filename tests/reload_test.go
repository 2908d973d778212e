//go:build integration

package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// reloadConfig is the daemon's configuration in TestReloadUnderSystemd:
// DiskUsageHigh alone (True: every filesystem measured is over
// space_percent), the kernel log read with the test's own rules only, and
// the real API server.
const reloadConfig = `# written by tests/reload_test.go
node_name = %[1]q
role = "worker"
gpu = "false"

[metrics]
listen_address = "127.0.0.1:%[2]d"

[runner]
first_run_spread = "0s"

[kubernetes]
kubeconfig = "/etc/autopilot-health/kubeconfig"
# The shortest allowed: a new message alone (another threshold) reaches
# the Node with the next heartbeat.
heartbeat_period = "30s"

%[3]s
[checks.DiskUsageHigh]
interval = "1m"
space_percent = %[4]d

[kmsg]
kernel_only = false  # the test's lines have facility user
disable = [%[5]s]

[[kmsg.rules]]
name = "ReloadTestA"
kind = "temp"
reason = "IOError"
pattern = 'autopilot-health reload test A %[6]s'
%[7]s`

// systemctl reload of the daemon under its own unit file, in a real
// systemd (ReloadUnit over D-Bus: ExecReload= asks over the control socket
// and waits; a refused file fails the job), reporting to
// the real API server:
//   - a changed threshold applies in place: DiskUsageHigh's message on the
//     Node shows it, its lastTransitionTime on the Node is kept, the unit
//     keeps its main process (no restart);
//   - a kernel log rule added by the reload matches the next line, and the
//     reader's cursor stays (a line matched before the reload is not
//     matched again);
//   - a bad file is refused: the daemon runs on with the previous
//     configuration, the unit stays active, the journal has the file, line
//     and key.
func TestReloadUnderSystemd(t *testing.T) {
	harness.Parallel(t, 1)
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	api := apiServer(t)
	tok := harness.Token()
	node := "reload-" + tok
	registerNode(t, api, node)
	s, usr := shippedUnitSystemd(t, "autopilot-health-reload-"+tok+"-", nil, false)
	ctx := context.Background()

	etc := installNodeKubeconfig(t, s, api, node)
	checksOff := checksOffBut("DiskUsageHigh")
	var disable []string
	for _, r := range kmsg.DefaultRules {
		disable = append(disable, fmt.Sprintf("%q", r.Name))
	}
	metricsPort := freeTCPPort(t)
	cfgPath := filepath.Join(etc, "config.toml")
	ruleB := fmt.Sprintf("\n[[kmsg.rules]]\nname = \"ReloadTestB\"\nkind = \"temp\"\nreason = \"IOError\"\npattern = 'autopilot-health reload test B %s'\n", tok)
	writeConfig := func(spacePercent int, extra string) {
		t.Helper()
		c := fmt.Sprintf(reloadConfig, node, metricsPort, checksOff, spacePercent, strings.Join(disable, ", "), tok, extra)
		if err := os.WriteFile(cfgPath, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig(1, "")

	if err := s.StartUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("starting autopilot-health.service: %v", err)
	}
	mainPID := func() uint32 {
		pid, err := s.MainPID(ctx, "autopilot-health.service")
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	pid := mainPID()
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	metric := func(series string) (float64, string) {
		page, err := httpGet(metricsURL)
		if err != nil {
			return 0, err.Error()
		}
		v, ok := metricValue(page, series)
		if !ok {
			return 0, series + " not exposed"
		}
		return v, fmt.Sprint(series, " ", v)
	}
	threshold := func(p int) func(*corev1.Node) bool {
		return func(n *corev1.Node) bool {
			c := cond(n, "DiskUsageHigh")
			return c != nil && c.Status == corev1.ConditionTrue && strings.Contains(c.Message, fmt.Sprintf("(threshold %d%%)", p))
		}
	}
	before := cond(waitNode(t, api, node, "DiskUsageHigh True at 1%", threshold(1)), "DiskUsageHigh")

	eventually(t, 15*time.Second, "the kernel log reader up", func() (bool, string) {
		v, last := metric("autopilot_health_kmsg_reader_up")
		return v == 1, last
	})
	if err := harness.WriteKmsg("autopilot-health reload test A " + tok); err != nil {
		t.Fatal(err)
	}
	ruleA := `autopilot_health_kmsg_matches_total{rule="ReloadTestA"}`
	eventually(t, 10*time.Second, "line A matched", func() (bool, string) {
		v, last := metric(ruleA)
		return v == 1, last
	})

	// A good file: a new threshold, one more kernel rule.
	writeConfig(2, ruleB)
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("reload: %v", err)
	}
	eventually(t, 10*time.Second, "the reload counted", func() (bool, string) {
		v, last := metric(`autopilot_health_config_reloads_total{result="ok"}`)
		return v == 1, last
	})
	// RELOADING=1 then READY=1: the unit is back to active (running), not
	// left reloading.
	eventually(t, 10*time.Second, "the unit active after the reload", func() (bool, string) {
		u, err := s.Bus.Unit(ctx, "autopilot-health.service")
		return err == nil && active(u), fmt.Sprintf("%+v %v", u, err)
	})
	after := cond(waitNodeFor(t, api, node, time.Minute, "DiskUsageHigh True at the new threshold 2%", threshold(2)), "DiskUsageHigh")
	if !after.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("DiskUsageHigh's lastTransitionTime on the Node: %v before the reload, %v after", before.LastTransitionTime, after.LastTransitionTime)
	}
	if err := harness.WriteKmsg("autopilot-health reload test B " + tok); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "line B matched by the rule the reload added", func() (bool, string) {
		v, last := metric(`autopilot_health_kmsg_matches_total{rule="ReloadTestB"}`)
		return v == 1, last
	})
	if v, last := metric(ruleA); v != 1 {
		t.Errorf("line A matched again after the reload (the cursor moved back): %s", last)
	}
	if j := s.Journal("autopilot-health.service"); !strings.Contains(j, "config reloaded from /etc/autopilot-health/config.toml: checks changed: DiskUsageHigh; kmsg rules: +1 -0 ~0") {
		t.Errorf("no reload line in the journal")
	}

	// status, reporting to the real API server: the condition as on the
	// Node (since the same time; the Node has whole seconds), its evidence, the last write done and
	// nothing pending.
	var st daemon.StatusReport
	eventually(t, time.Minute, "status: DiskUsageHigh True at 2%, the conditions written (its new message with the next heartbeat), nothing pending", func() (bool, string) {
		out, err := exec.Command(filepath.Join(usr, "bin", "autopilot-health"), "status", "--json", "--socket", s.Root("/run/autopilot-health/status.sock")).Output()
		if code := exitCode(err); code != 1 {
			return false, fmt.Sprintf("exit %d (want 1: a condition is True): %s", code, out)
		}
		st = daemon.StatusReport{}
		if err := json.Unmarshal(out, &st); err != nil {
			return false, err.Error()
		}
		k := st.Kubernetes
		du := slices.IndexFunc(st.Conditions, func(c daemon.ConditionStatus) bool { return c.Type == "DiskUsageHigh" })
		return du >= 0 && strings.Contains(st.Conditions[du].Message, "(threshold 2%)") && k.State == "reporting" &&
			!k.StatusPending && !k.Calls["status"].LastSuccess.IsZero() && !k.Calls["status"].Failing, string(out)
	})
	for _, c := range st.Conditions {
		if c.Type != "DiskUsageHigh" {
			continue
		}
		if c.Status != report.StatusTrue || !c.LastTransitionTime.Truncate(time.Second).Equal(before.LastTransitionTime.Time) || c.Evidence["storage.filesystems"] == nil {
			t.Errorf("status of DiskUsageHigh: %+v; on the Node since %v", c, before.LastTransitionTime)
		}
	}

	// A bad file: refused, the daemon runs on as it was.
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(mustRead(t, cfgPath), "space_percent = 2", "space_percent = 2\nspace_percnt = 3", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// systemctl reload fails (ExecReload= waits for the daemon's answer),
	// with the daemon's reason in the unit's journal.
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); !errors.Is(err, systemd.ErrJobFailed) {
		t.Errorf("reload of the bad file: %v, want the job failed", err)
	}
	eventually(t, 10*time.Second, "ExecReload='s refusal with file, line and key in the journal", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return regexp.MustCompile(`autopilot-health reload: refused: /etc/autopilot-health/config\.toml:\d+: key checks\.DiskUsageHigh\.space_percnt: unknown key`).MatchString(j), lastBytes(j, 600)
	})
	eventually(t, 10*time.Second, "the refused reload counted", func() (bool, string) {
		v, last := metric(`autopilot_health_config_reloads_total{result="error"}`)
		return v == 1, last
	})
	line := regexp.MustCompile(`configuration reload refused; running on the previous configuration" err="/etc/autopilot-health/config\.toml:\d+: key checks\.DiskUsageHigh\.space_percnt: unknown key`)
	eventually(t, 10*time.Second, "the refusal with file, line and key in the journal", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return line.MatchString(j), lastBytes(j, 600)
	})
	if v, last := metric("autopilot_health_config_last_reload_successful"); v != 0 {
		t.Errorf("after the refused reload: %s", last)
	}
	u, err := s.Bus.Unit(ctx, "autopilot-health.service")
	if err != nil || !active(u) {
		t.Errorf("the unit after the refused reload: %+v %v", u, err)
	}
	if p := mainPID(); p != pid {
		t.Errorf("main PID %d, was %d: the daemon restarted", p, pid)
	}
	// Still the previous configuration on the Node, since the same time.
	n := waitNodeFor(t, api, node, time.Minute, "DiskUsageHigh still at 2%", threshold(2))
	if c := cond(n, "DiskUsageHigh"); !c.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("lastTransitionTime changed after the refused reload: %v", c.LastTransitionTime)
	}

	// Two reloads at once (systemctl reload twice, quickly): both jobs
	// end, the unit is active on the same process, the new threshold
	// applies and the condition keeps its lastTransitionTime.
	writeConfig(3, ruleB)
	okBefore, _ := metric(`autopilot_health_config_reloads_total{result="ok"}`)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- s.ReloadUnit(ctx, "autopilot-health.service") }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("one of two reloads at once: %v", err)
		}
	}
	n = waitNodeFor(t, api, node, time.Minute, "DiskUsageHigh True at 3% after two reloads at once", threshold(3))
	if c := cond(n, "DiskUsageHigh"); !c.LastTransitionTime.Equal(&before.LastTransitionTime) {
		t.Errorf("lastTransitionTime changed by two reloads at once: %v", c.LastTransitionTime)
	}
	eventually(t, 10*time.Second, "the two reloads counted", func() (bool, string) {
		v, last := metric(`autopilot_health_config_reloads_total{result="ok"}`)
		return v >= okBefore+1 && v <= okBefore+2, last
	})
	eventually(t, 10*time.Second, "the unit active after two reloads at once", func() (bool, string) {
		u, err := s.Bus.Unit(ctx, "autopilot-health.service")
		return err == nil && active(u), fmt.Sprintf("%+v %v", u, err)
	})

	// A key that needs a restart with another change: refused as a whole,
	// naming the key; the other change is not applied.
	writeConfig(4, ruleB+"\n[detect]\ninterval = \"7m\"\n")
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); !errors.Is(err, systemd.ErrJobFailed) {
		t.Errorf("reload with a key that needs a restart: %v, want the job failed", err)
	}
	eventually(t, 10*time.Second, "the restart key named in the journal", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		// config.toml:N: the line of the key, as every config error.
		return regexp.MustCompile(`config\.toml:\d+: key detect\.interval: needs a restart \(systemctl restart autopilot-health\); nothing applied`).MatchString(j), lastBytes(j, 600)
	})
	if v, last := metric("autopilot_health_config_last_reload_successful"); v != 0 {
		t.Errorf("after the restart key's refusal: %s", last)
	}

	// DiskUsageHigh, True on the Node, disabled by a reload: its condition
	// leaves the Node (README: as a check disabled at start), the daemon
	// runs on.
	enabled := func(on bool) {
		t.Helper()
		writeConfig(3, ruleB)
		if !on {
			c := strings.Replace(mustRead(t, cfgPath), "[checks.DiskUsageHigh]\n", "[checks.DiskUsageHigh]\nenabled = false\n", 1)
			if err := os.WriteFile(cfgPath, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
	enabled(false)
	waitNode(t, api, node, "DiskUsageHigh removed from the Node", func(n *corev1.Node) bool { return cond(n, "DiskUsageHigh") == nil })
	if j := s.Journal("autopilot-health.service"); !strings.Contains(j, "stopped: DiskUsageHigh") {
		t.Errorf("the reload that disabled DiskUsageHigh is not logged as such:\n%s", lastBytes(j, 600))
	}
	// Enabled again: it runs within first_run_spread and is back on the
	// Node, True since its new first run (a newly enabled check).
	enabled(true)
	n = waitNode(t, api, node, "DiskUsageHigh back on the Node", threshold(3))
	if c := cond(n, "DiskUsageHigh"); !c.LastTransitionTime.After(before.LastTransitionTime.Time) {
		t.Errorf("DiskUsageHigh enabled again: lastTransitionTime %v, first set %v", c.LastTransitionTime, before.LastTransitionTime)
	}
	if p := mainPID(); p != pid {
		t.Errorf("main PID %d, was %d: the daemon restarted", p, pid)
	}
}

// shippedUnitSystemd starts a real systemd with the daemon built into its
// /usr/bin and the shipped unit file, and journald; the journal of the
// daemon's unit is logged when the test fails. It returns the systemd and
// its /usr on the host. units are more unit files (name: text); with
// standin, tests/standin is at /usr/bin/standin for them (not under
// /etc/systemd/system, a tree NodeTampered protects: its full scan would
// hash the 18 MB stand-in every 5 minutes, which no node's unit files cost).
// opts change the namespace's options (SharedMounts: mounts as on a booted host).
func shippedUnitSystemd(t testing.TB, prefix string, units map[string]string, standin bool, opts ...func(*harness.Options)) (*harness.Systemd, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	usr := filepath.Join(dir, "usr")
	if err := harness.InstallDaemon(usr); err != nil {
		t.Fatal(err)
	}
	if standin {
		if _, err := harness.BuildStandin(filepath.Join(usr, "bin")); err != nil {
			t.Fatal(err)
		}
	}
	o := harness.Options{KeepSyslog: true, Data: dataDir(t), Usr: usr}
	for _, f := range opts {
		f(&o)
	}
	s, err := harness.StartSystemdWith(dir, units, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal of autopilot-health.service:\n%s", lastBytes(s.Journal("autopilot-health.service"), 20000))
		}
		s.Stop()
	})
	if err := s.StartUnit(context.Background(), "systemd-journald.service"); err != nil {
		t.Fatalf("starting journald: %v", err)
	}
	return s, usr
}

// checksOffBut is the configuration's tables that turn off every check of
// the catalog but keep.
// diskUsageOnly is the configuration of a daemon for node with
// DiskUsageHigh its only check (at spacePercent), no kernel log monitor,
// no first-run spread, metrics on 127.0.0.1:port.
func diskUsageOnly(node string, port, spacePercent int) string {
	return fmt.Sprintf("node_name = %q\nrole = \"worker\"\ngpu = \"false\"\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n[runner]\nfirst_run_spread = \"0s\"\n[kmsg]\nenabled = false\n%s[checks.DiskUsageHigh]\nspace_percent = %d\n",
		node, port, checksOffBut("DiskUsageHigh"), spacePercent)
}

func checksOffBut(keep ...string) string {
	var b strings.Builder
	for _, name := range config.Default().Checks.Names() {
		if !slices.Contains(keep, name) {
			fmt.Fprintf(&b, "[checks.%s]\nenabled = false\n", name)
		}
	}
	return b.String()
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A `systemctl reload` asked for while the unit is still activating (the
// first pass of the checks not over) is folded by systemd into the start
// job: ExecReload= does not run. The daemon, once ready, reads the file
// again: a bad file written during the start is refused, logged and
// counted, and systemctl status keeps the refusal in its status line until
// a reload applies.
func TestReloadWhileStartingUnderSystemd(t *testing.T) {
	if why := harness.SystemdAvailable(); why != "" {
		t.Fatalf("a real systemd cannot run on this machine: %s", why)
	}
	s, _ := shippedUnitSystemd(t, "autopilot-health-reloadstart-", nil, false)
	ctx := context.Background()
	etc := s.Root("/etc/autopilot-health")
	os.MkdirAll(etc, 0o755)
	off := checksOffBut("DiskUsageHigh", "NodeInfoStale")
	port := freeTCPPort(t)
	cfgPath := filepath.Join(etc, "config.toml")
	write := func(disk string) {
		t.Helper()
		c := fmt.Sprintf("node_name = \"reloadstart\"\nrole = \"worker\"\ngpu = \"false\"\n[metrics]\nlisten_address = \"127.0.0.1:%d\"\n"+
			"[runner]\nfirst_run_spread = \"8s\"\n[kubernetes]\nkubeconfig = \"\"\n[kmsg]\nenabled = false\n%s[checks.DiskUsageHigh]\n%s\n", port, off, disk)
		if err := os.WriteFile(cfgPath, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	statusText := func() string {
		p, _ := s.Properties(ctx, "autopilot-health.service", "Service")
		v, _ := p["StatusText"].Value().(string)
		return v
	}
	write("space_percent = 90")
	started := make(chan error, 1)
	go func() { started <- s.StartUnit(ctx, "autopilot-health.service") }()
	eventually(t, 10*time.Second, "the unit activating", func() (bool, string) {
		st := statusText()
		return strings.HasPrefix(st, "starting: first pass"), st
	})
	write("space_percnt = 55")
	// Folded into the start: it ends when the start does, with its result.
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
		t.Errorf("reload while activating: %v", err)
	}
	if err := <-started; err != nil {
		t.Fatalf("start: %v", err)
	}
	eventually(t, 15*time.Second, "the file written during the start refused once the daemon is ready", func() (bool, string) {
		j := s.Journal("autopilot-health.service")
		return strings.Contains(j, "the configuration file changed while the daemon started") &&
			strings.Contains(j, "configuration reload refused; running on the previous configuration") &&
			strings.Contains(j, "key checks.DiskUsageHigh.space_percnt: unknown key"), lastBytes(j, 800)
	})
	eventually(t, 10*time.Second, "the refusal in systemctl status", func() (bool, string) {
		st := statusText()
		return strings.HasPrefix(st, "configuration reload refused (running on the previous one): /etc/autopilot-health/config.toml:"), st
	})
	if v, last := metricOf(t, port, `autopilot_health_config_reloads_total{result="error"}`); v != 1 {
		t.Errorf("the refusal is not counted: %s", last)
	}
	// A good file, reloaded now that the unit is active: applied, and the
	// refusal leaves the status line.
	write("space_percent = 55")
	if err := s.ReloadUnit(ctx, "autopilot-health.service"); err != nil {
		t.Fatalf("reload of the good file: %v", err)
	}
	eventually(t, 10*time.Second, "the refusal gone from systemctl status", func() (bool, string) {
		st := statusText()
		return hasSummary(st) && !strings.Contains(st, "refused"), st
	})
}

// metricOf reads one sample of the daemon's metrics on port.
func metricOf(t *testing.T, port int, series string) (float64, string) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f, line
		}
	}
	return -1, series + " not exposed"
}

// installNodeKubeconfig writes the node's credentials (a client
// certificate of system:node:<node>) and a kubeconfig for the API server
// to /etc/autopilot-health/kubeconfig inside s's namespace, and returns
// that directory on the host.
func installNodeKubeconfig(t testing.TB, s *harness.Systemd, api *harness.APIServer, node string) string {
	t.Helper()
	etc := s.Root("/etc/autopilot-health")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := api.WriteClientCert(filepath.Join(etc, "client.pem"), "system:node:"+node, []string{"system:nodes"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(api.Dir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: /etc/autopilot-health/ca.crt}
users:
- name: node
  user: {client-certificate: /etc/autopilot-health/client.pem, client-key: /etc/autopilot-health/client.pem}
contexts:
- name: test
  context: {cluster: test, user: node}
current-context: test
`, api.URL)
	if err := os.WriteFile(filepath.Join(etc, "kubeconfig"), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return etc
}

// summaryLine matches the daemon's one-line summary in STATUS= ("1
// condition: 1 ok, 0 problems", "21 conditions: ...").
var summaryLine = regexp.MustCompile(`\b\d+ conditions?: \d+ ok`)

// hasSummary reports whether a STATUS= line carries the summary.
func hasSummary(st string) bool { return summaryLine.MatchString(st) }
