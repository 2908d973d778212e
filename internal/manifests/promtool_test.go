package manifests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// promtool is Prometheus' own rule checker: from PATH, or extracted from
// Debian's prometheus package into tests/.cache/bin by .ci/run.
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	p, _ := filepath.Abs("../../tests/.cache/bin/promtool")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	testenv.Skip(t, "promtool not found (in PATH or tests/.cache/bin; .ci/run extracts it from Debian's prometheus package)")
	return ""
}

// promtoolTestRules runs `promtool test rules` on tests against the
// shipped rules, evaluated every minute, and fails the test unless
// promtool says SUCCESS.
func promtoolTestRules(t *testing.T, tests ...promTest) {
	t.Helper()
	dir := t.TempDir()
	rules, _ := Lookup("prometheus-rules")
	rf := writeRendered(t, dir, rules)
	b, err := yaml.Marshal(map[string]any{"rule_files": []string{rf}, "evaluation_interval": "1m", "tests": tests})
	if err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(dir, "rules_test.yaml")
	if err := os.WriteFile(tf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := runPromtool(t, "test", "rules", tf)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}
}

func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeRendered(t *testing.T, dir string, m Manifest) string {
	t.Helper()
	b, err := m.Render()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, m.File)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPromtoolCheckRulesAndConfig(t *testing.T) {
	dir := t.TempDir()
	rules, _ := Lookup("prometheus-rules")
	rf := writeRendered(t, dir, rules)
	out := runPromtool(t, "check", "rules", rf)
	want := fmt.Sprintf("SUCCESS: %d rules found", len(report.Conditions)+1+len(daemonRules()))
	if !strings.Contains(out, want) {
		t.Errorf("promtool check rules: want %q in\n%s", want, out)
	}
	// The rules in a whole Prometheus configuration. (The scrape job is not
	// part of it: Debian's Prometheus is built without Kubernetes service
	// discovery, so its promtool refuses kubernetes_sd_configs.)
	cf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cf, []byte("rule_files: ["+rf+"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "check", "config", cf)
}

type promSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type promAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels"`
	ExpAnnotations map[string]string `yaml:"exp_annotations"`
}

type promAlertTest struct {
	EvalTime  string      `yaml:"eval_time"`
	Alertname string      `yaml:"alertname"`
	ExpAlerts []promAlert `yaml:"exp_alerts"`
}

type promSample struct {
	Labels string  `yaml:"labels"`
	Value  float64 `yaml:"value"`
}

type promExprTest struct {
	Expr       string       `yaml:"expr"`
	EvalTime   string       `yaml:"eval_time"`
	ExpSamples []promSample `yaml:"exp_samples"`
}

type promTest struct {
	Interval   string          `yaml:"interval"`
	InputSerie []promSeries    `yaml:"input_series"`
	AlertTests []promAlertTest `yaml:"alert_rule_test,omitempty"`
	ExprTests  []promExprTest  `yaml:"promql_expr_test,omitempty"`
}

// ksm is a kube-state-metrics series as Prometheus stores it after a scrape.
func ksm(metric string, labels map[string]string) string {
	parts := []string{`job="kube-state-metrics"`, `instance="10.0.0.9:8080"`}
	for _, k := range sortedKeys(labels) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, labels[k]))
	}
	return metric + "{" + strings.Join(parts, ",") + "}"
}

func sortedKeys(m map[string]string) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	for i := range k {
		for j := i + 1; j < len(k); j++ {
			if k[j] < k[i] {
				k[i], k[j] = k[j], k[i]
			}
		}
	}
	return k
}

func minutes(d time.Duration) string { return promDuration(d) }

// conditionTests: for every condition, node "sick" has it True (and its
// False and Unknown series at 0, as kube-state-metrics exports all three),
// node "fine" has it False. The alert is pending, not firing, a minute
// before its for: and fires at it, for "sick" only.
func conditionTests(t *testing.T) promTest {
	pt := promTest{Interval: "1m"}
	for _, r := range conditionRules() {
		c := r.Labels["condition"]
		for node, status := range map[string]string{"sick": "true", "fine": "false"} {
			for _, s := range []string{"true", "false", "unknown"} {
				v := "0+0x30"
				if s == status {
					v = "1+0x30"
				}
				pt.InputSerie = append(pt.InputSerie, promSeries{ksm("kube_node_status_condition", map[string]string{"condition": c, "node": node, "status": s}), v})
			}
		}
		d, err := time.ParseDuration(r.For)
		if err != nil {
			t.Fatalf("%s: for %q: %v", r.Alert, r.For, err)
		}
		labels := map[string]string{"condition": c, "node": "sick", "status": "true", "job": "kube-state-metrics", "instance": "10.0.0.9:8080"}
		for k, v := range r.Labels {
			labels[k] = v
		}
		ann := map[string]string{}
		for k, v := range r.Annotations {
			ann[k] = strings.ReplaceAll(v, "{{ $labels.node }}", "sick")
		}
		pt.AlertTests = append(pt.AlertTests,
			promAlertTest{EvalTime: minutes(d - time.Minute), Alertname: r.Alert},
			promAlertTest{EvalTime: minutes(d), Alertname: r.Alert, ExpAlerts: []promAlert{{labels, ann}}},
			promAlertTest{EvalTime: minutes(d + 10*time.Minute), Alertname: r.Alert, ExpAlerts: []promAlert{{labels, ann}}},
		)
	}
	return pt
}

// daemonTests: the daemon's own alerts on the series its /metrics and the
// shipped scrape job produce (job="autopilot-health", node=<name>), and
// NodeNotReady on kube-state-metrics' Ready series. Each alert fires at the
// evaluation its for: allows and not the one before.
func daemonTests() promTest {
	daemon := func(metric, node, extra string) string {
		return fmt.Sprintf(`%s{job=%q,instance="%s:20257",node=%q%s}`, metric, Job, node, node, extra)
	}
	rules := map[string]rule{readyRule().Alert: readyRule()}
	for _, r := range daemonRules() {
		rules[r.Alert] = r
	}
	exp := func(alert string, labels map[string]string) promAlert {
		r := rules[alert]
		l := map[string]string{}
		for k, v := range r.Labels {
			l[k] = v
		}
		for k, v := range labels {
			l[k] = v
		}
		ann := map[string]string{}
		for k, v := range r.Annotations {
			for _, lk := range []string{"node", "kind", "status", "domain"} {
				v = strings.ReplaceAll(v, "{{ $labels."+lk+" }}", labels[lk])
			}
			ann[k] = v
		}
		return promAlert{l, ann}
	}
	daemonNode := func(node string) map[string]string {
		return map[string]string{"node": node, "job": Job, "instance": node + ":20257"}
	}
	// "flaky": a loop stuck every 5 minutes (healthy 0 at minute 4, 9,
	// ...), and each time systemd's watchdog restarts the daemon: a new
	// process_start_time_seconds at minutes 5, 10, 15, ...
	var healthy, started []string
	for m := 0; m <= 40; m++ {
		h := "1"
		if m%5 == 4 {
			h = "0"
		}
		healthy = append(healthy, h)
		started = append(started, fmt.Sprint(1000+60*(m/5*5)))
	}
	// "once": one loop stuck at minute 4, for the 2 minutes the watchdog
	// allows, then restarted (minute 6) and healthy from then on: no
	// alert. "wedged": a loop stuck from minute 3 on with no watchdog to
	// restart the daemon: 0 for good.
	once := []string{"1+0x3", "0+0x1", "1+0x34"}
	onceStarted := []string{"1000+0x5", "1360+0x35"}
	return promTest{
		Interval: "1m",
		InputSerie: []promSeries{
			// Three nodes kube-state-metrics knows: "up" runs the daemon,
			// "down" has its target down, "gone" has no target at all.
			{ksm("kube_node_info", map[string]string{"node": "up", "kubelet_version": "v1.33.0"}), "1+0x40"},
			{ksm("kube_node_info", map[string]string{"node": "down", "kubelet_version": "v1.33.0"}), "1+0x40"},
			{ksm("kube_node_info", map[string]string{"node": "gone", "kubelet_version": "v1.33.0"}), "1+0x40"},
			{daemon("up", "up", ""), "1+0x40"},
			{daemon("up", "down", ""), "0+0x40"},
			// "up": healthy and reading the kernel log; its status calls
			// are all refused (forbidden) until minute 25, and work from
			// minute 26 on, while its annotation calls work; some of its
			// event calls fail, the others work; it lost 3 kernel records
			// at minute 20; its state writes start failing at minute 10.
			{daemon("autopilot_health_healthy", "up", ""), "1+0x40"},
			{daemon("autopilot_health_kmsg_reader_up", "up", ""), "1+0x40"},
			{daemon("process_start_time_seconds", "up", ""), "1000+0x40"},
			{daemon("autopilot_health_api_writes_total", "up", `,kind="status",result="forbidden"`), "0+1x25 25+0x15"},
			{daemon("autopilot_health_api_writes_total", "up", `,kind="status",result="ok"`), "5+0x25 6+1x14"},
			{daemon("autopilot_health_api_writes_total", "up", `,kind="event",result="error"`), "0+1x40"},
			{daemon("autopilot_health_api_writes_total", "up", `,kind="event",result="ok"`), "0+2x40"},
			{daemon("autopilot_health_api_writes_total", "up", `,kind="annotations",result="ok"`), "0+1x40"},
			{daemon("autopilot_health_api_writes_total", "up", `,kind="annotations",result="error"`), "2+0x40"},
			{daemon("autopilot_health_kmsg_lost_records_total", "up", ""), "0+0x20 3+0x20"},
			{daemon("autopilot_health_state_writes_total", "up", `,result="error"`), "0+0x10 1+0x30"},
			// A state write blocked in I/O from minute 29, its gauge
			// from minute 30 (10 s blocked and more), returned at 37.
			{daemon("autopilot_health_state_write_blocked_seconds", "up", ""), "0+0x29 50+60x6 0+0x4"},
			// Another writer changes a condition of "up"'s at every report
			// refresh (2 min) from minute 10 to 30, each put back and
			// counted, and stops; "edited" had one changed by hand at
			// minute 10.
			{daemon("autopilot_health_condition_overwrites_total", "up", ""), "0+0x10 0+0.5x20 10+0x30"},
			{daemon("autopilot_health_condition_overwrites_total", "edited", ""), "0+0x10 1+0x30"},
			// "up"'s disks document left out at every report refresh (2 min)
			// from minute 5 to 25, room made then; its storage document
			// fits throughout.
			{daemon("autopilot_health_report_documents_left_out_total", "up", `,domain="disks"`), "0+0x5 0+0.5x20 10+0x30"},
			{daemon("autopilot_health_report_documents_left_out_total", "up", `,domain="storage"`), "0+0x40"},
			// "outage": the daemon restarted (a reboot: no scrape at
			// minutes 10 and 11) into an API server it cannot reach: the
			// Node's read, made once per start and retried, fails from
			// minute 12 to 19 and works at minute 20; the status writes
			// start after it. The new process exports every kind's ok
			// series at 0 from its start, so the read that works is an
			// increase Prometheus sees. The earlier process had read the
			// Node once, after 2 failures.
			{daemon("process_start_time_seconds", "outage", ""), "0+0x9 _ _ 690+0x28"},
			{daemon("autopilot_health_api_writes_total", "outage", `,kind="read",result="ok"`), "1+0x9 _ _ 0+0x7 1+0x20"},
			{daemon("autopilot_health_api_writes_total", "outage", `,kind="read",result="error"`), "2+0x9 _ _ 1+1x7 8+0x20"},
			{daemon("autopilot_health_api_writes_total", "outage", `,kind="status",result="ok"`), "0+1x9 _ _ 0+0x8 1+1x19"},
			// "rebooted": a restart (minute 12) whose Node read failed once
			// and then worked, both before the new process's first
			// scrape; the earlier process's start had 2 failures: the
			// error count goes from 2 to 1 (a reset, an increase of 1 to
			// increase()), the ok count from 1 to 1. Every call works.
			{daemon("process_start_time_seconds", "rebooted", ""), "0+0x9 _ _ 690+0x28"},
			{daemon("autopilot_health_api_writes_total", "rebooted", `,kind="read",result="ok"`), "1+0x9 _ _ 1+0x28"},
			{daemon("autopilot_health_api_writes_total", "rebooted", `,kind="read",result="error"`), "2+0x9 _ _ 1+0x28"},
			{daemon("autopilot_health_api_writes_total", "rebooted", `,kind="status",result="ok"`), "0+1x9 _ _ 1+1x28"},
			// "denied": restarted at minute 12 into a status write that is
			// forbidden from then on (its Node read works): the earlier
			// process's status writes that worked are in the window until
			// minute 24, then every status call of the window failed.
			{daemon("process_start_time_seconds", "denied", ""), "0+0x9 _ _ 690+0x28"},
			{daemon("autopilot_health_api_writes_total", "denied", `,kind="read",result="ok"`), "1+0x9 _ _ 1+0x28"},
			{daemon("autopilot_health_api_writes_total", "denied", `,kind="status",result="ok"`), "0+1x9 _ _ 0+0x28"},
			// Every kind's series of every result is there at 0 from the
			// start (the earlier process's too).
			{daemon("autopilot_health_api_writes_total", "denied", `,kind="status",result="forbidden"`), "0+0x9 _ _ 1+1x28"},
			// "refused": an Event refused once (forbidden) at minute 5,
			// the only event call in the window; the earlier ones worked.
			// Its series is there at 0 from the start, so the one failure
			// is an increase: firing 5 minutes later, and no longer once
			// it is out of the 15-minute window. (Born at 1, as it was
			// before every result's series was made at the start, it was
			// never seen.)
			{daemon("autopilot_health_api_writes_total", "refused", `,kind="event",result="ok"`), "3+0x40"},
			{daemon("autopilot_health_api_writes_total", "refused", `,kind="event",result="forbidden"`), "0+0x4 1+0x35"},
			// A reload refused at minute 5, one that applies at minute 31.
			{daemon("autopilot_health_config_last_reload_successful", "up", ""), "1+0x4 0+0x25 1+0x10"},
			{daemon("autopilot_health_healthy", "flaky", ""), strings.Join(healthy, " ")},
			{daemon("process_start_time_seconds", "flaky", ""), strings.Join(started, " ")},
			{daemon("autopilot_health_healthy", "once", ""), strings.Join(once, " ")},
			{daemon("process_start_time_seconds", "once", ""), strings.Join(onceStarted, " ")},
			{daemon("autopilot_health_healthy", "wedged", ""), "1+0x2 0+0x37"},
			{daemon("autopilot_health_kmsg_reader_up", "blind", ""), "0+0x40"},
			{daemon("autopilot_health_kernel_hung_task_warnings", "blind", ""), "10+0x40"},
			// kernel.hung_task_warnings: "up" has reports left; "spent"
			// prints its last one at minute 5 (and an operator sets -1 at
			// minute 30); "flapped" is 0 for 9 minutes only.
			{daemon("autopilot_health_kernel_hung_task_warnings", "up", ""), "-1+0x40"},
			{daemon("autopilot_health_kernel_hung_task_warnings", "spent", ""), "2+0x4 0+0x24 -1+0x10"},
			{daemon("autopilot_health_kernel_hung_task_warnings", "flapped", ""), "1+0x2 0+0x8 -1+0x28"},
			// The gauge absent where the kernel log monitor runs: "nohung"
			// (a kernel without CONFIG_DETECT_HUNG_TASK) all along;
			// "departed" until its daemon went away at minute 20 (no
			// scrape since: AutopilotHealthDaemonGone's); "nokmsg" runs
			// the daemon without the kernel log monitor (kmsg.enabled =
			// false: no KernelDeadlock to miss).
			{daemon("autopilot_health_kmsg_reader_up", "nohung", ""), "1+0x40"},
			{daemon("up", "nohung", ""), "1+0x40"},
			{daemon("autopilot_health_kmsg_reader_up", "departed", ""), "1+0x20"},
			{daemon("up", "departed", ""), "1+0x20 0+0x20"},
			{daemon("up", "nokmsg", ""), "1+0x40"},
			// Ready: "lost" unreachable (Unknown), "ok" Ready.
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "lost", "status": "unknown"}), "1+0x40"},
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "lost", "status": "true"}), "0+0x40"},
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "ok", "status": "true"}), "1+0x40"},
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "ok", "status": "unknown"}), "0+0x40"},
			// "wavering": Ready False and Unknown in turn, 3 minutes each
			// (a kubelet that posts False now and then): not Ready all
			// along.
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "wavering", "status": "false"}), "1 1 1 0 0 0 1 1 1 0 0 0 1 1 1 0 0 0 1 1 1"},
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "wavering", "status": "unknown"}), "0 0 0 1 1 1 0 0 0 1 1 1 0 0 0 1 1 1 0 0 0"},
			{ksm("kube_node_status_condition", map[string]string{"condition": "Ready", "node": "wavering", "status": "true"}), "0+0x20"},
		},
		AlertTests: []promAlertTest{
			{EvalTime: "9m", Alertname: "AutopilotHealthDaemonGone"},
			{EvalTime: "10m", Alertname: "AutopilotHealthDaemonGone", ExpAlerts: []promAlert{
				exp("AutopilotHealthDaemonGone", map[string]string{"node": "down"}), exp("AutopilotHealthDaemonGone", map[string]string{"node": "gone"})}},
			// The first 0 at minute 4: every 15-minute window from then on
			// holds a 0; 15 minutes later it fires.
			// "once" never: one stuck loop, which the watchdog ended, is
			// not a loop that keeps getting stuck. "wedged" 15 minutes
			// after its loop got stuck.
			{EvalTime: "17m", Alertname: "AutopilotHealthDaemonUnhealthy"},
			{EvalTime: "18m", Alertname: "AutopilotHealthDaemonUnhealthy", ExpAlerts: []promAlert{exp("AutopilotHealthDaemonUnhealthy", daemonNode("wedged"))}},
			{EvalTime: "19m", Alertname: "AutopilotHealthDaemonUnhealthy", ExpAlerts: []promAlert{
				exp("AutopilotHealthDaemonUnhealthy", daemonNode("flaky")), exp("AutopilotHealthDaemonUnhealthy", daemonNode("wedged"))}},
			{EvalTime: "20m", Alertname: "AutopilotHealthDaemonUnhealthy", ExpAlerts: []promAlert{
				exp("AutopilotHealthDaemonUnhealthy", daemonNode("flaky")), exp("AutopilotHealthDaemonUnhealthy", daemonNode("wedged"))}},
			{EvalTime: "14m", Alertname: "AutopilotHealthDaemonRestarting"},
			{EvalTime: "15m", Alertname: "AutopilotHealthDaemonRestarting", ExpAlerts: []promAlert{exp("AutopilotHealthDaemonRestarting", daemonNode("flaky"))}},
			{EvalTime: "9m", Alertname: "AutopilotHealthKernelLogUnreadable"},
			{EvalTime: "10m", Alertname: "AutopilotHealthKernelLogUnreadable", ExpAlerts: []promAlert{exp("AutopilotHealthKernelLogUnreadable", daemonNode("blind"))}},
			{EvalTime: "14m", Alertname: "AutopilotHealthKernelHungTaskReportsExhausted"},
			{EvalTime: "15m", Alertname: "AutopilotHealthKernelHungTaskReportsExhausted", ExpAlerts: []promAlert{exp("AutopilotHealthKernelHungTaskReportsExhausted", daemonNode("spent"))}},
			{EvalTime: "30m", Alertname: "AutopilotHealthKernelHungTaskReportsExhausted"},
			// Where the daemon is scraped with its kernel log monitor and
			// without the gauge, for 30 minutes: "nohung" only, not
			// "blind" (the kernel log unreadable, the sysctl read), nor
			// "departed" (its daemon gone before 30 minutes), nor
			// "nokmsg", nor the nodes with the gauge at any value.
			{EvalTime: "29m", Alertname: "AutopilotHealthKernelDeadlockUndetectable"},
			{EvalTime: "30m", Alertname: "AutopilotHealthKernelDeadlockUndetectable", ExpAlerts: []promAlert{exp("AutopilotHealthKernelDeadlockUndetectable", daemonNode("nohung"))}},
			{EvalTime: "40m", Alertname: "AutopilotHealthKernelDeadlockUndetectable", ExpAlerts: []promAlert{exp("AutopilotHealthKernelDeadlockUndetectable", daemonNode("nohung"))}},
			{EvalTime: "19m", Alertname: "AutopilotHealthKernelLogLost"},
			{EvalTime: "21m", Alertname: "AutopilotHealthKernelLogLost", ExpAlerts: []promAlert{exp("AutopilotHealthKernelLogLost", daemonNode("up"))}},
			{EvalTime: "38m", Alertname: "AutopilotHealthKernelLogLost"},
			// Status calls refused from minute 1 on: firing after the 5m
			// for:; annotations keep working and some events go through,
			// so only kind="status" fires, until a status call works
			// again (minute 26).
			{EvalTime: "5m", Alertname: "AutopilotHealthAPIWritesFailing"},
			{EvalTime: "6m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"})}},
			// "refused": its one event call, at minute 5, failed; out of
			// the window at minute 20.
			{EvalTime: "9m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"})}},
			{EvalTime: "10m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"}),
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "refused", "kind": "event"})}},
			// "outage": its reads all fail from minute 12 on, for 5
			// minutes at 17; no longer once one works (minute 20).
			{EvalTime: "16m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"}),
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "refused", "kind": "event"})}},
			{EvalTime: "17m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"}),
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "outage", "kind": "read"}),
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "refused", "kind": "event"})}},
			{EvalTime: "19m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"}),
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "outage", "kind": "read"}),
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "refused", "kind": "event"})}},
			{EvalTime: "20m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"})}},
			{EvalTime: "25m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "up", "kind": "status"})}},
			{EvalTime: "26m", Alertname: "AutopilotHealthAPIWritesFailing"},
			// "denied": every status call failed in the window from minute
			// 24 on; firing 5 minutes later, the restart no excuse.
			{EvalTime: "28m", Alertname: "AutopilotHealthAPIWritesFailing"},
			{EvalTime: "29m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "denied", "kind": "status"})}},
			{EvalTime: "40m", Alertname: "AutopilotHealthAPIWritesFailing", ExpAlerts: []promAlert{
				exp("AutopilotHealthAPIWritesFailing", map[string]string{"node": "denied", "kind": "status"})}},
			{EvalTime: "15m", Alertname: "AutopilotHealthStateWritesFailing"},
			{EvalTime: "16m", Alertname: "AutopilotHealthStateWritesFailing", ExpAlerts: []promAlert{exp("AutopilotHealthStateWritesFailing", map[string]string{"node": "up", "job": Job, "instance": "up:20257", "result": "error"})}},
			{EvalTime: "34m", Alertname: "AutopilotHealthStateWriteBlocked"},
			{EvalTime: "35m", Alertname: "AutopilotHealthStateWriteBlocked", ExpAlerts: []promAlert{exp("AutopilotHealthStateWriteBlocked", daemonNode("up"))}},
			{EvalTime: "36m", Alertname: "AutopilotHealthStateWriteBlocked", ExpAlerts: []promAlert{exp("AutopilotHealthStateWriteBlocked", daemonNode("up"))}},
			{EvalTime: "37m", Alertname: "AutopilotHealthStateWriteBlocked"},
			{EvalTime: "20m", Alertname: "AutopilotHealthReportDocumentsLeftOut"},
			{EvalTime: "22m", Alertname: "AutopilotHealthReportDocumentsLeftOut", ExpAlerts: []promAlert{exp("AutopilotHealthReportDocumentsLeftOut", map[string]string{"node": "up", "job": Job, "instance": "up:20257", "domain": "disks"})}},
			{EvalTime: "45m", Alertname: "AutopilotHealthReportDocumentsLeftOut"},
			{EvalTime: "27m", Alertname: "AutopilotHealthConditionsOverwritten"},
			{EvalTime: "28m", Alertname: "AutopilotHealthConditionsOverwritten", ExpAlerts: []promAlert{exp("AutopilotHealthConditionsOverwritten", daemonNode("up"))}},
			{EvalTime: "40m", Alertname: "AutopilotHealthConditionsOverwritten", ExpAlerts: []promAlert{exp("AutopilotHealthConditionsOverwritten", daemonNode("up"))}},
			{EvalTime: "58m", Alertname: "AutopilotHealthConditionsOverwritten"},
			{EvalTime: "19m", Alertname: "AutopilotHealthConfigReloadRefused"},
			{EvalTime: "20m", Alertname: "AutopilotHealthConfigReloadRefused", ExpAlerts: []promAlert{exp("AutopilotHealthConfigReloadRefused", daemonNode("up"))}},
			{EvalTime: "31m", Alertname: "AutopilotHealthConfigReloadRefused"},
			{EvalTime: "9m", Alertname: "NodeNotReady"},
			{EvalTime: "10m", Alertname: "NodeNotReady", ExpAlerts: []promAlert{
				exp("NodeNotReady", map[string]string{"condition": "Ready", "node": "lost", "job": "kube-state-metrics", "instance": "10.0.0.9:8080"}),
				exp("NodeNotReady", map[string]string{"condition": "Ready", "node": "wavering", "job": "kube-state-metrics", "instance": "10.0.0.9:8080"})}},
		},
	}
}

// Every alert of the daemon's group (and NodeNotReady) is asserted to fire
// in daemonTests.
func TestEveryDaemonAlertIsTestedFiring(t *testing.T) {
	fired := map[string]bool{}
	for _, at := range daemonTests().AlertTests {
		if len(at.ExpAlerts) > 0 {
			fired[at.Alertname] = true
		}
	}
	for _, r := range append(daemonRules(), readyRule()) {
		if !fired[r.Alert] {
			t.Errorf("%s: no promtool test has it firing", r.Alert)
		}
	}
}

func TestPromtoolAlertsFireAfterTheirForAndNotBefore(t *testing.T) {
	promtoolTestRules(t, conditionTests(t), daemonTests())
}

// A condition with a part the kernel log sets from a window of errors
// (DisksFailure: io_error_threshold disk I/O errors within io_error_window)
// is True for at most the window after the errors stop: a burst of errors
// all at once holds it for the window exactly. Its alert fires within that
// time, for the node that had the burst, and not for a node where it
// stayed False.
func TestKernelWindowConditionAlertsWithinTheWindow(t *testing.T) {
	window := config.Default().Checks.DisksFailure.IOErrorWindow.Duration
	if window < 2*time.Minute {
		t.Fatalf("io_error_window %s: the scenario needs at least two evaluations", window)
	}
	pt := promTest{Interval: "1m"}
	tested := 0
	for _, r := range conditionRules() {
		d, _ := report.Lookup(r.Labels["condition"])
		kernel := false
		for _, p := range d.Parts {
			kernel = kernel || p.Source == report.SourceKmsg
		}
		if !kernel {
			continue
		}
		tested++
		held := int(window / time.Minute)
		// True from 0 to window-1m (held samples a minute apart), False
		// from the window on: the burst aged out.
		for node, status := range map[string]string{"burst": "true", "fine": "false"} {
			for _, s := range []string{"true", "false", "unknown"} {
				v := fmt.Sprintf("0x%d", 2*held)
				switch {
				case s == status && s == "true":
					v = fmt.Sprintf("1x%d 0x%d", held-1, held)
				case s == "false" && status == "true":
					v = fmt.Sprintf("0x%d 1x%d", held-1, held)
				case s == status:
					v = fmt.Sprintf("1x%d", 2*held)
				}
				pt.InputSerie = append(pt.InputSerie, promSeries{ksm("kube_node_status_condition", map[string]string{"condition": r.Alert, "node": node, "status": s}), v})
			}
		}
		labels := map[string]string{"condition": r.Alert, "node": "burst", "status": "true", "job": "kube-state-metrics", "instance": "10.0.0.9:8080"}
		for k, v := range r.Labels {
			labels[k] = v
		}
		ann := map[string]string{}
		for k, v := range r.Annotations {
			ann[k] = strings.ReplaceAll(v, "{{ $labels.node }}", "burst")
		}
		// The last evaluation at which the burst still holds it.
		pt.AlertTests = append(pt.AlertTests,
			promAlertTest{EvalTime: minutes(window - time.Minute), Alertname: r.Alert, ExpAlerts: []promAlert{{labels, ann}}})
	}
	if tested == 0 {
		t.Fatal("no condition of the catalog has a kernel log part")
	}
	dir := t.TempDir()
	rules, _ := Lookup("prometheus-rules")
	rf := writeRendered(t, dir, rules)
	b, err := yaml.Marshal(map[string]any{"rule_files": []string{rf}, "evaluation_interval": "1m", "tests": []promTest{pt}})
	if err != nil {
		t.Fatal(err)
	}
	tf := filepath.Join(dir, "rules_test.yaml")
	if err := os.WriteFile(tf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool(t), "test", "rules", tf)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}

// timestampGauge: a metric whose value is a Unix time (the daemon's
// *_timestamp_seconds, process_start_time_seconds).
var timestampGauge = regexp.MustCompile(`_(timestamp|time)_seconds$`)

// No shipped dashboard query or alert reads a timestamp gauge at 0 as a
// time: autopilot_health_api_last_success_timestamp_seconds is 0 until
// the first call that works (standalone, always), and time() - 0 is the
// time since 1970 (the dashboard showed 56 years). promtool evaluates every
// expression that reads one with each such gauge at 0 and nothing else:
// each shows nothing. And the API panel still shows the age of a success.
func TestTimestampGaugesAtZeroShowNothing(t *testing.T) {
	type shipped struct{ name, expr string }
	var exprs []shipped
	for _, g := range ruleGroups().Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, shipped{r.Alert, r.Expr})
		}
	}
	for _, p := range DashboardPanels() {
		for _, q := range p.Queries {
			exprs = append(exprs, shipped{"panel " + p.Title, strings.ReplaceAll(q, `"$node"`, `".*"`)})
		}
	}
	zero := promTest{Interval: "1m"}
	gauges := map[string]bool{}
	for _, e := range exprs {
		read := false
		for _, m := range metricNames(e.expr) {
			if !timestampGauge.MatchString(m) {
				continue
			}
			read = true
			if !gauges[m] {
				gauges[m] = true
				zero.InputSerie = append(zero.InputSerie, promSeries{
					fmt.Sprintf(`%s{job=%q,instance="never:20257",node="never"}`, m, Job), "0+0x10"})
			}
		}
		if read {
			t.Logf("%s: %s", e.name, e.expr)
			zero.ExprTests = append(zero.ExprTests, promExprTest{Expr: e.expr, EvalTime: "5m"})
		}
	}
	if !gauges["autopilot_health_api_last_success_timestamp_seconds"] {
		t.Fatalf("no shipped expression reads autopilot_health_api_last_success_timestamp_seconds (read: %v)", gauges)
	}
	// A node whose last call that worked was at minute 1: 240 s at minute 5.
	var panel string
	for _, p := range DashboardPanels() {
		if p.Title == "Seconds since the last successful API call" {
			panel = strings.ReplaceAll(p.Queries[0], `"$node"`, `".*"`)
		}
	}
	if panel == "" {
		t.Fatal("no panel of the seconds since the last successful API call")
	}
	works := promTest{
		Interval: "1m",
		InputSerie: []promSeries{{
			fmt.Sprintf(`autopilot_health_api_last_success_timestamp_seconds{job=%q,instance="works:20257",node="works"}`, Job), "0 60+0x10"}},
		ExprTests: []promExprTest{{Expr: panel, EvalTime: "5m", ExpSamples: []promSample{
			{fmt.Sprintf(`{job=%q,instance="works:20257",node="works"}`, Job), 240}}}},
	}
	promtoolTestRules(t, zero, works)
}
