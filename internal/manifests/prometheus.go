package manifests

import (
	"fmt"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// Job is the scrape job name the daemon's own alerts and the shipped scrape
// configuration use.
const Job = "autopilot-health"

// The daemon-gone window: a node whose daemon has not been scraped
// successfully for this long alerts (the spec's "alert on the report's
// updatedAt for daemon gone", measured where Prometheus can measure it).
const daemonGoneFor = 10 * time.Minute

// Severity maps a disposition to the alert's severity label: security is
// critical (a human investigates an integrity signal at once), alert is
// warning (meant to reach a human), operability and repair are info (a Syself
// service is down or the daemon repairs in place; ServiceNotRecovering, an
// alert, escalates a repair that does not help).
func Severity(d report.Disposition) string {
	switch d {
	case report.Security:
		return "critical"
	case report.Alert:
		return "warning"
	}
	return "info"
}

// For is how long a condition must be True before its alert fires.
// Conditions from the kernel log and the tamper checks are held (until reboot,
// or for good): they cannot blink, so one minute, time for kube-state-metrics
// to be scraped, is enough. A check's condition is re-evaluated every
// interval; it must be True for two evaluations (at least 1 minute, at most
// 10) so that one transient probe does not page anyone. A check's condition
// with a part the kernel log sets (DisksFailure's disk I/O errors within
// io_error_window) gets one minute too: that part lowers itself once the
// errors age out of the window, so a burst holds the condition for the
// window (10 min) at most, which two check intervals would outlast; its
// threshold, not the for:, keeps one error from paging.
func For(c report.ConditionDesc) time.Duration {
	if c.Source != report.SourceCheck || c.Interval == 0 {
		return time.Minute
	}
	for _, p := range c.Parts {
		if p.Source == report.SourceKmsg {
			return time.Minute
		}
	}
	return min(max(2*c.Interval, time.Minute), 10*time.Minute)
}

// promDuration writes d the way Prometheus does (1m, 1h30m, 90s).
func promDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	var s string
	if h := d / time.Hour; h > 0 {
		s += fmt.Sprintf("%dh", h)
		d -= h * time.Hour
	}
	if m := d / time.Minute; m > 0 {
		s += fmt.Sprintf("%dm", m)
		d -= m * time.Minute
	}
	if sec := d / time.Second; sec > 0 {
		s += fmt.Sprintf("%ds", sec)
	}
	return s
}

type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name  string `yaml:"name"`
	Rules []rule `yaml:"rules"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// ConditionExpr is the alert expression of a condition: kube-state-metrics'
// series for the condition being True.
func ConditionExpr(condType string) string {
	return fmt.Sprintf(`kube_node_status_condition{condition=%q,status="true"} == 1`, condType)
}

// replacedOnCloud names the conditions the cloud pools' MachineHealthCheck
// acts on, and after how long (spec "Cloud pools").
func replacedOnCloud(condType string) (time.Duration, bool) {
	for _, u := range cloudConditions {
		if u.Type == condType {
			return u.Timeout, true
		}
	}
	return 0, false
}

func conditionRules() []rule {
	var out []rule
	for _, c := range report.Conditions {
		desc := fmt.Sprintf("%s is True on node {{ $labels.node }}: %s. Usual cause: %s.", c.Type, c.Trigger, c.Cause)
		switch c.Disposition {
		case report.Repair:
			desc += " The daemon restarts the unit in place; ServiceNotRecovering alerts when that stops helping."
		case report.Security:
			desc += " Report-only integrity signal: investigate the node."
		case report.Operability:
			desc += " A Syself service is affected; the node itself is healthy."
		}
		if t, ok := replacedOnCloud(c.Type); ok {
			desc += fmt.Sprintf(" On cloud pools the MachineHealthCheck reboots, then replaces the machine once it has held for %s.", config.ShortDuration(t))
		}
		desc += ` Details: kubectl get node {{ $labels.node }} -o jsonpath='{.status.conditions[?(@.type=="` + c.Type + `")].message}'`
		out = append(out, rule{
			Alert: c.Type,
			Expr:  ConditionExpr(c.Type),
			For:   promDuration(For(c)),
			Labels: map[string]string{
				"severity":    Severity(c.Disposition),
				"disposition": string(c.Disposition),
				"condition":   c.Type,
			},
			Annotations: map[string]string{
				"summary":     fmt.Sprintf("%s on node {{ $labels.node }} (%s)", c.Type, c.Disposition),
				"description": desc,
			},
		})
	}
	return out
}

// DaemonRules are the alerts on the daemon itself.
func daemonRules() []rule {
	lbl := func(sev string) map[string]string {
		return map[string]string{"severity": sev, "component": Job}
	}
	return []rule{
		{
			Alert: "AutopilotHealthDaemonGone",
			// Every node kube-state-metrics knows that has no successful
			// scrape of the daemon: target down, or absent altogether.
			// One series per node (kube_node_info's other labels, such as
			// the kubelet version, change on upgrades and would restart
			// the for:).
			Expr:   fmt.Sprintf(`max by (node) (kube_node_info) unless on (node) (up{job=%q} == 1)`, Job),
			For:    promDuration(daemonGoneFor),
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health is not running on node {{ $labels.node }}",
				"description": "No successful scrape of the node health daemon on {{ $labels.node }} for 10 minutes. Either it is not running, and its conditions on the Node are stale (they keep their last value), or it runs without its metrics port (taken by another program, or an address not on the node): its status line then starts with \"metrics not served\". On the node: systemctl status autopilot-health; journalctl -u autopilot-health.",
			},
		},
		{
			Alert: "AutopilotHealthDaemonUnhealthy",
			// A stuck loop withholds the systemd watchdog ping, so systemd
			// restarts the daemon within WatchdogSec (2 min) and healthy is
			// 1 again: a loop that keeps getting stuck shows as 0 now and
			// then, never for long. Fire when it went from 1 to 0 in every
			// 15-minute window for 15 minutes (stuck again within 15
			// minutes of the last time), or stayed 0 (no watchdog). A
			// window that held a 0 alone would be true for 15 minutes
			// after a single stuck loop's last 0, longer than the for:.
			// resets() counts the drops from 1 to 0; one drop is in the
			// windows that hold the 1 before it, less than 15 minutes.
			Expr:   "resets(autopilot_health_healthy[15m]) > 0 or autopilot_health_healthy == 0",
			For:    "15m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "a loop of autopilot-health keeps getting stuck on node {{ $labels.node }}",
				"description": "autopilot_health_healthy dropped from 1 to 0 in every 15-minute window for 15 minutes, or stayed 0 for 15 minutes: one of the daemon's loops (autopilot_health_loop_last_progress_timestamp_seconds) stops making progress again and again and systemd's watchdog restarts the daemon each time, or a loop is stuck and nothing restarts the daemon. journalctl -u autopilot-health says which loop.",
			},
		},
		{
			Alert: "AutopilotHealthDaemonRestarting",
			// process_start_time_seconds changes at every start.
			Expr:   fmt.Sprintf(`changes(process_start_time_seconds{job=%q}[30m]) >= 3`, Job),
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health restarted 3 times or more in 30 minutes on node {{ $labels.node }}",
				"description": "The daemon keeps restarting (a crash, a failing start, or the systemd watchdog). While it restarts, its checks run late and its conditions may go stale. systemctl status autopilot-health; journalctl -u autopilot-health -b.",
			},
		},
		{
			Alert:  "AutopilotHealthKernelLogUnreadable",
			Expr:   "autopilot_health_kmsg_reader_up == 0",
			For:    "10m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health cannot read the kernel log on node {{ $labels.node }}",
				"description": "/dev/kmsg has not been readable for 10 minutes: no kernel problem is seen meanwhile. The kernel conditions that are not True are Unknown (CheckFailed), and so is DisksFailure unless its SMART part finds a problem; one that is True stays True (held until the reboot): a True kernel condition on the Node is still what the kernel logged. journalctl -u autopilot-health says why the log cannot be read.",
			},
		},
		{
			// kernel.hung_task_warnings at 0: the kernel prints no more
			// hung-task reports this boot, so KernelDeadlock cannot turn
			// True. Absent (not readable) is not 0.
			Alert:  "AutopilotHealthKernelHungTaskReportsExhausted",
			Expr:   "autopilot_health_kernel_hung_task_warnings == 0",
			For:    "10m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "the kernel prints no more hung-task reports on node {{ $labels.node }}",
				"description": "kernel.hung_task_warnings has been 0 for 10 minutes: the kernel has printed as many hung-task reports as it allows in this boot (10 by default) and prints no more, so a hung kubelet, containerd or runc is not logged and KernelDeadlock stays False until the next boot. Set kernel.hung_task_warnings=-1 (unlimited) in the node image's sysctl.d; on this node: sysctl -w kernel.hung_task_warnings=-1. dmesg shows the hung tasks reported so far.",
			},
		},
		{
			// The gauge absent where the kernel log monitor runs (its
			// reader_up series is exported from its start, whether the
			// log can be read or not): the sysctl cannot be read, a
			// kernel without CONFIG_DETECT_HUNG_TASK, which prints no
			// hung-task reports at all. Not where the daemon is not
			// scraped (no reader_up: AutopilotHealthDaemonGone's) or
			// runs without the monitor (kmsg.enabled = false).
			Alert:  "AutopilotHealthKernelDeadlockUndetectable",
			Expr:   "autopilot_health_kmsg_reader_up unless on (node) autopilot_health_kernel_hung_task_warnings",
			For:    "30m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "KernelDeadlock cannot be detected on this kernel on node {{ $labels.node }}",
				"description": "autopilot-health has run its kernel log monitor for 30 minutes without reading /proc/sys/kernel/hung_task_warnings (autopilot_health_kernel_hung_task_warnings is absent): most likely a kernel built without CONFIG_DETECT_HUNG_TASK, which never reports a hung task, so a hung kubelet, containerd or runc is not logged and KernelDeadlock can never turn True on this node. journalctl -u autopilot-health says why the file could not be read. Use a node image whose kernel has CONFIG_DETECT_HUNG_TASK=y (ls /proc/sys/kernel/hung_task_timeout_secs on the node), or silence this alert for nodes where that is accepted.",
			},
		},
		{
			Alert:  "AutopilotHealthKernelLogLost",
			Expr:   "increase(autopilot_health_kmsg_lost_records_total[10m]) > 0",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "kernel log records were lost before autopilot-health read them on node {{ $labels.node }}",
				"description": "The kernel's ring buffer overwrote records the daemon had not read (a flood); a kernel problem in those records may have been missed. Read the node's kernel log (dmesg) for the period.",
			},
		},
		{
			Alert: "AutopilotHealthAPIWritesFailing",
			// Per kind of call (status, annotations, event, ...): a kind
			// whose every call failed in the last 15 minutes, however often
			// it is made (report_interval, heartbeat_period). A kind that is
			// forbidden (NodeRestriction, RBAC) while others work is caught.
			// A kind works when its ok count rose in the window (its
			// series is there at 0 from the start, so a first success
			// counts), or when the daemon restarted in the window and the
			// new process's ok count is above 0: a success before the new
			// process's first scrape does not show as a rise where the
			// count starts where the earlier process's ended (the Node's
			// read, made once per start: 1 and 1), while failures before
			// it do (a count of 1 after the earlier start's 2 is a reset,
			// an increase of 1).
			Expr: fmt.Sprintf(`sum by (node, kind) (increase(autopilot_health_api_writes_total{result!="ok"}[15m])) > 0 `+
				`unless on (node, kind) (sum by (node, kind) (increase(autopilot_health_api_writes_total{result="ok"}[15m])) > 0 `+
				`or sum by (node, kind) (autopilot_health_api_writes_total{result="ok"}) > 0 and on (node) changes(process_start_time_seconds{job=%q}[15m]) > 0)`, Job),
			For:    "5m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health's {{ $labels.kind }} calls to the Kubernetes API all fail from node {{ $labels.node }}",
				"description": "Every {{ $labels.kind }} call in the last 15 minutes failed: what the daemon reports that way (conditions: status; the health report: annotations; events) is stale on the Node. autopilot_health_api_writes_total{kind=\"{{ $labels.kind }}\"} has the result (forbidden: the node's credentials, NodeRestriction or RBAC); `sudo autopilot-health status` shows the last error.",
			},
		},
		{
			Alert: "AutopilotHealthStateWritesFailing",
			// The error series exists at 0 from the start, so increase()
			// sees the first error.
			Expr:   `increase(autopilot_health_state_writes_total{result="error"}[15m]) > 0`,
			For:    "5m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health cannot save its state on node {{ $labels.node }}",
				"description": "Writes of /var/lib/autopilot-health/state.json keep failing (disk full or read-only?): a restart of the daemon would lose the kernel log cursor and held conditions' local copy.",
			},
		},
		{
			Alert: "AutopilotHealthStateWriteBlocked",
			// A write that blocks in I/O does not fail, and no other
			// write starts until it returns: the gauge is 0 until it has
			// been blocked 10 s, then its age.
			Expr:   `autopilot_health_state_write_blocked_seconds > 0`,
			For:    "5m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health's write of its state hangs on node {{ $labels.node }}",
				"description": "A write of /var/lib/autopilot-health/state.json has not returned (the disk or filesystem under it hangs in I/O): no other save starts until it does, so the conditions' local copy and the kernel log cursor are not saved, and a restart of the daemon now would start from the last saved state. The kernel log (dmesg) and `sudo autopilot-health status` say more.",
			},
		},
		{
			Alert: "AutopilotHealthConditionsOverwritten",
			// The daemon puts its conditions back at each report refresh
			// (2 min) when another writer changed their status, reason or
			// transition time, removed one, added one it does not evaluate
			// on the node, or appended a second entry of one: one
			// correction is someone's kubectl, one
			// at every refresh is a second writer fighting it, and the
			// Node shows the other writer's word between refreshes.
			Expr:   `increase(autopilot_health_condition_overwrites_total[30m]) > 3`,
			For:    "10m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "another writer keeps changing autopilot-health's conditions on node {{ $labels.node }}",
				"description": "autopilot-health found its conditions on the Node changed by another writer (status, reason or lastTransitionTime; one removed, one it does not evaluate on this node added, or a second entry of one appended) more than 3 times in 30 minutes, and put them right each time: between its report refreshes the Node shows the other writer's word to Cluster API and the alerts. journalctl -u autopilot-health names the condition and what the Node showed; kubectl get node {{ $labels.node }} --show-managed-fields -o yaml names the writer (a manager of status.conditions other than autopilot-health and the kubelet).",
			},
		},
		{
			Alert: "AutopilotHealthReportDocumentsLeftOut",
			// A report document left out at each refresh of the last 15
			// minutes (written as a stub; where not even the stubs fit,
			// taken off the Node, or, tamper, left as it was): the Node's
			// other annotations leave it no room (256 KiB together), and
			// the report shows none of its data until room is made.
			Expr:   `increase(autopilot_health_report_documents_left_out_total[15m]) > 0`,
			For:    "15m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health's {{ $labels.domain }} report does not fit on node {{ $labels.node }}",
				"description": "The Node's annotations leave no room (256 KiB together) for autopilot-health's autopilot.syself.com/{{ $labels.domain }} document, which shows none of its data: it is written as a small one saying it was left out; where not even those fit, it is taken off the Node; and the tamper annotation is left as it was (its updatedAt then stands still though the daemon runs, so a stale one there is not the daemon gone: `sudo autopilot-health status` says so). kubectl get node {{ $labels.node }} -o json | jq '.metadata.annotations | map_values(length)' shows which annotations take the room; journalctl -u autopilot-health says which documents are left out (report documents left out).",
			},
		},
		{
			Alert: "AutopilotHealthConfigReloadRefused",
			// 0 after a refused reload until one applies (or a start,
			// which loads the file: a bad one refuses to start, and
			// AutopilotHealthDaemonGone fires instead).
			Expr:   `autopilot_health_config_last_reload_successful == 0`,
			For:    "15m",
			Labels: lbl("warning"),
			Annotations: map[string]string{
				"summary":     "autopilot-health refused to reload its configuration on node {{ $labels.node }}",
				"description": "The last systemctl reload of autopilot-health was refused: the daemon runs on its previous configuration, not on /etc/autopilot-health/config.toml as it is now. journalctl -u autopilot-health says why: a file that does not load (named by file, line and key; it would also stop the daemon from starting again after a crash or a reboot; `autopilot-health config validate --privileged-helper=/run/autopilot-health-privileged/helper.sock /etc/autopilot-health/config.toml` checks it as the unit's run loads it), or keys that change only with a restart (systemctl restart autopilot-health applies them).",
			},
		},
	}
}

// readyRule: the kubelet's Ready, which the daemon does not own. The spec:
// on bare metal Ready=Unknown alerts a human instead of triggering
// remediation, and "alert on Ready for node gone". 10 minutes: past the
// cloud pools' MachineHealthCheck (Unknown 600 s, False 300 s). False and
// Unknown are one state here (max without the status label; the series'
// other labels, a cluster label among them, stay for routing): with the
// status among the alert's labels, a node that went from False to Unknown
// (the kubelet stopped posting) started its 10 minutes again, and one that
// moved between the two every few minutes never alerted.
func readyRule() rule {
	return rule{
		Alert:  "NodeNotReady",
		Expr:   `max without (status) (kube_node_status_condition{condition="Ready",status=~"false|unknown"}) == 1`,
		For:    "10m",
		Labels: map[string]string{"severity": "warning", "condition": "Ready"},
		Annotations: map[string]string{
			"summary":     "node {{ $labels.node }} is not Ready",
			"description": "The kubelet's Ready condition has been False or Unknown for 10 minutes. On cloud pools the MachineHealthCheck reboots, then replaces the machine; on bare metal only Ready=False is remediated, so Unknown (the node unreachable) waits for a human. kubectl describe node {{ $labels.node }}.",
		},
	}
}

func ruleGroups() ruleFile {
	return ruleFile{Groups: []ruleGroup{
		{Name: "autopilot-health-conditions", Rules: append(conditionRules(), readyRule())},
		{Name: "autopilot-health-daemon", Rules: daemonRules()},
	}}
}

func renderRuleFile() ([]byte, error) { return yamlDocs("prometheus-rules", ruleGroups()) }

type objectMeta struct {
	Name      string            `yaml:"name"`
	Namespace string            `yaml:"namespace,omitempty"`
	Labels    map[string]string `yaml:"labels,omitempty"`
}

func renderPrometheusRule() ([]byte, error) {
	return yamlDocs("prometheusrule", struct {
		APIVersion string     `yaml:"apiVersion"`
		Kind       string     `yaml:"kind"`
		Metadata   objectMeta `yaml:"metadata"`
		Spec       ruleFile   `yaml:"spec"`
	}{"monitoring.coreos.com/v1", "PrometheusRule",
		objectMeta{Name: "autopilot-health", Labels: map[string]string{"app.kubernetes.io/name": "autopilot-health"}},
		ruleGroups()})
}

// The scrape job: Kubernetes node discovery, the node's address with the
// daemon's port, and the node's name as the node label (what
// kube-state-metrics' series carry, so the rules can join on it).
const (
	scrapeInterval = "30s"
	addressRegex   = `(.+?)(?::\d+)?`
	addressRepl    = "${1}:20257"
)

func renderScrapeConfig() ([]byte, error) {
	type relabel struct {
		SourceLabels []string `yaml:"source_labels,flow"`
		Regex        string   `yaml:"regex,omitempty"`
		Replacement  string   `yaml:"replacement,omitempty"`
		TargetLabel  string   `yaml:"target_label"`
	}
	type sd struct {
		Role string `yaml:"role"`
	}
	type job struct {
		JobName        string    `yaml:"job_name"`
		ScrapeInterval string    `yaml:"scrape_interval"`
		KubernetesSD   []sd      `yaml:"kubernetes_sd_configs"`
		Relabel        []relabel `yaml:"relabel_configs"`
	}
	return yamlDocs("scrape-config", struct {
		ScrapeConfigs []job `yaml:"scrape_configs"`
	}{[]job{{
		JobName:        Job,
		ScrapeInterval: scrapeInterval,
		KubernetesSD:   []sd{{Role: "node"}},
		Relabel: []relabel{
			{SourceLabels: []string{"__address__"}, Regex: addressRegex, Replacement: addressRepl, TargetLabel: "__address__"},
			{SourceLabels: []string{"__meta_kubernetes_node_name"}, TargetLabel: "node"},
		},
	}}})
}

// The same job as a Prometheus Operator ScrapeConfig. jobName is set: the
// Operator would otherwise name the job scrapeConfig/<namespace>/<name>, and
// the rules select job="autopilot-health".
func renderScrapeConfigCR() ([]byte, error) {
	type relabel struct {
		SourceLabels []string `yaml:"sourceLabels,flow"`
		Regex        string   `yaml:"regex,omitempty"`
		Replacement  string   `yaml:"replacement,omitempty"`
		TargetLabel  string   `yaml:"targetLabel"`
		Action       string   `yaml:"action"`
	}
	type sd struct {
		Role string `yaml:"role"`
	}
	type spec struct {
		JobName        string    `yaml:"jobName"`
		ScrapeInterval string    `yaml:"scrapeInterval"`
		KubernetesSD   []sd      `yaml:"kubernetesSDConfigs"`
		Relabelings    []relabel `yaml:"relabelings"`
	}
	return yamlDocs("scrapeconfig", struct {
		APIVersion string     `yaml:"apiVersion"`
		Kind       string     `yaml:"kind"`
		Metadata   objectMeta `yaml:"metadata"`
		Spec       spec       `yaml:"spec"`
	}{"monitoring.coreos.com/v1alpha1", "ScrapeConfig",
		objectMeta{Name: Job, Labels: map[string]string{"app.kubernetes.io/name": Job}},
		spec{JobName: Job, ScrapeInterval: scrapeInterval, KubernetesSD: []sd{{Role: "Node"}},
			Relabelings: []relabel{
				{SourceLabels: []string{"__address__"}, Regex: addressRegex, Replacement: addressRepl, TargetLabel: "__address__", Action: "replace"},
				{SourceLabels: []string{"__meta_kubernetes_node_name"}, TargetLabel: "node", Action: "replace"},
			}}})
}
