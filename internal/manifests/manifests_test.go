package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
)

var update = flag.Bool("update", false, "rewrite the committed manifests under packaging/manifests")

const shipped = "../../packaging/manifests"

// The files under packaging/manifests are what the catalog renders today.
func TestCommittedManifestsAreCurrent(t *testing.T) {
	for _, m := range All {
		got, err := m.Render()
		if err != nil {
			t.Fatalf("%s: %v", m.Kind, err)
		}
		path := filepath.Join(shipped, m.File)
		if *update {
			if err := os.MkdirAll(shipped, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v (run `make docs`)", m.Kind, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: the catalog renders something else; run `make docs` and commit it", path)
		}
	}
	entries, err := os.ReadDir(shipped)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !slices.ContainsFunc(All, func(m Manifest) bool { return m.File == e.Name() }) && e.Name() != "README.md" {
			t.Errorf("%s/%s is not rendered by any manifest: remove it", shipped, e.Name())
		}
	}
}

func TestEveryConditionHasOneAlert(t *testing.T) {
	var rf ruleFile
	b, err := renderRuleFile()
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]rule{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if _, dup := alerts[r.Alert]; dup {
				t.Errorf("alert %s twice", r.Alert)
			}
			alerts[r.Alert] = r
		}
	}
	for _, c := range report.Conditions {
		r, ok := alerts[c.Type]
		if !ok {
			t.Errorf("%s: no alert", c.Type)
			continue
		}
		if !strings.Contains(r.Expr, `condition="`+c.Type+`"`) || !strings.Contains(r.Expr, `status="true"`) {
			t.Errorf("%s: expr %q does not select the condition's True series", c.Type, r.Expr)
		}
		if r.Labels["disposition"] != string(c.Disposition) || r.Labels["severity"] != Severity(c.Disposition) {
			t.Errorf("%s: labels %v", c.Type, r.Labels)
		}
	}
}

func TestSeverityAndFor(t *testing.T) {
	for d, want := range map[report.Disposition]string{report.Security: "critical", report.Alert: "warning", report.Operability: "info", report.Repair: "info"} {
		if got := Severity(d); got != want {
			t.Errorf("Severity(%s) = %s, want %s", d, got, want)
		}
	}
	for _, tc := range []struct {
		c    report.ConditionDesc
		want time.Duration
	}{
		{report.ConditionDesc{Source: report.SourceKmsg}, time.Minute},
		{report.ConditionDesc{Source: report.SourceTamper, Interval: time.Minute}, time.Minute},
		{report.ConditionDesc{Source: report.SourceCheck, Interval: 10 * time.Second}, time.Minute},
		{report.ConditionDesc{Source: report.SourceCheck, Interval: 5 * time.Minute}, 10 * time.Minute},
		{report.ConditionDesc{Source: report.SourceCheck, Interval: time.Hour}, 10 * time.Minute},
		{report.ConditionDesc{Source: report.SourceCheck, Interval: 2 * time.Minute}, 4 * time.Minute},
		{report.ConditionDesc{Source: report.SourceCheck, Interval: 5 * time.Minute, Parts: []report.Part{{Source: report.SourceKmsg}, {Source: report.SourceCheck}}}, time.Minute},
	} {
		if got := For(tc.c); got != tc.want {
			t.Errorf("For(%+v) = %s, want %s", tc.c, got, tc.want)
		}
	}
	for d, want := range map[time.Duration]string{time.Minute: "1m", 90 * time.Second: "1m30s", 10 * time.Minute: "10m", 2 * time.Hour: "2h", 0: "0s"} {
		if got := promDuration(d); got != want {
			t.Errorf("promDuration(%s) = %s, want %s", d, got, want)
		}
	}
}

// The conditions the MachineHealthChecks watch are the daemon's (or Ready).
func TestWatchedConditionsExist(t *testing.T) {
	for _, p := range Pools {
		for _, c := range p.Conditions {
			if c.Type == "Ready" {
				continue
			}
			d, ok := report.Lookup(c.Type)
			if !ok {
				t.Errorf("pool %s watches %s, which is not in the catalog", p.Name, c.Type)
				continue
			}
			if d.Hold == report.HoldWhileTrue && d.Source != report.SourceCheck {
				t.Errorf("%s: unexpected hold %s", c.Type, d.Hold)
			}
		}
	}
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// daemonMetrics is every metric family the daemon registers, read from the
// collectors' descriptors (a vector with no series yet is included).
func daemonMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := report.NewMetrics("test")
	kube.NewMetrics(reg)
	kmsg.NewMetrics(reg)
	checks.NewRepairer(nil, nil, time.Now, reg)
	checks.NewUnitWatch(nil, reg)
	checks.NewJournalFallbacks(reg)
	names := map[string]bool{}
	for _, r := range []interface{ Describe(chan<- *prometheus.Desc) }{reg, m} {
		ch := make(chan *prometheus.Desc, 1024)
		r.Describe(ch)
		close(ch)
		for d := range ch {
			if sm := fqName.FindStringSubmatch(d.String()); sm != nil {
				names[sm[1]] = true
			}
		}
	}
	if len(names) < 20 || !names["problem_counter"] || !names["syself_node_unit_restarts"] {
		t.Fatalf("reading the daemon's metrics failed: %v", names)
	}
	return names
}

// kube-state-metrics' series the rules and the dashboard read (its
// documented node metrics), and Prometheus' own up.
var external = map[string]bool{"kube_node_status_condition": true, "kube_node_info": true, "up": true}

var (
	promqlStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlBraces  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promqlGroup   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promqlWords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true}
)

// metricNames returns the metric names a PromQL expression reads: the
// identifiers that are neither functions, aggregations, keywords nor labels.
func metricNames(expr string) []string {
	e := promqlStrings.ReplaceAllString(expr, `""`)
	e = promqlGroup.ReplaceAllString(e, " ")
	e = promqlBraces.ReplaceAllString(e, " ")
	var out []string
	for _, m := range promqlIdent.FindAllStringSubmatch(e, -1) {
		if m[1] != "" || promqlWords[m[0]] {
			continue
		}
		out = append(out, m[0])
	}
	return out
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le, check) (rate(autopilot_health_check_duration_seconds_bucket{node=~"$node"}[5m]))) and on (node) up{job="a"} == 1 unless kube_node_info`)
	want := []string{"autopilot_health_check_duration_seconds_bucket", "up", "kube_node_info"}
	if !slices.Equal(got, want) {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
}

// Every metric a shipped alert or dashboard panel reads exists: on the
// daemon's /metrics, or in kube-state-metrics' documented node metrics.
func TestEveryQueriedMetricExists(t *testing.T) {
	have := daemonMetrics(t)
	check := func(where, expr string) {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if s, ok := strings.CutSuffix(n, suf); ok && have[s] {
					base = s
				}
			}
			if !have[base] && !external[base] {
				t.Errorf("%s reads %s, which neither the daemon nor kube-state-metrics exports", where, n)
			}
		}
	}
	for _, g := range ruleGroups().Groups {
		for _, r := range g.Rules {
			check("alert "+r.Alert, r.Expr)
		}
	}
	// The dashboard as Grafana reads it: the JSON file's panels' targets.
	b, err := renderDashboard()
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if len(dash.Panels) != len(DashboardPanels()) {
		t.Fatalf("%d panels in the JSON, %d defined", len(dash.Panels), len(DashboardPanels()))
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			check("panel "+p.Title, q.Expr)
		}
	}
}

// The scrape job's address rewrite, applied the way Prometheus applies a
// relabel rule (the regex anchored at both ends, ${1} expanded), turns the
// node's kubelet address into the daemon's port.
func TestScrapeConfigTargetsTheDaemonPort(t *testing.T) {
	b, err := renderScrapeConfig()
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
			SD      []struct {
				Role string `yaml:"role"`
			} `yaml:"kubernetes_sd_configs"`
			Relabel []struct {
				SourceLabels []string `yaml:"source_labels"`
				Regex        string   `yaml:"regex"`
				Replacement  string   `yaml:"replacement"`
				TargetLabel  string   `yaml:"target_label"`
			} `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.ScrapeConfigs) != 1 || cfg.ScrapeConfigs[0].JobName != Job || cfg.ScrapeConfigs[0].SD[0].Role != "node" {
		t.Fatalf("scrape config: %+v", cfg)
	}
	var addr, node bool
	for _, r := range cfg.ScrapeConfigs[0].Relabel {
		switch r.TargetLabel {
		case "__address__":
			re := regexp.MustCompile("^(?:" + r.Regex + ")$")
			for in, want := range map[string]string{"10.0.0.5:10250": "10.0.0.5:20257", "[2001:db8::1]:10250": "[2001:db8::1]:20257", "node-1": "node-1:20257"} {
				if got := re.ReplaceAllString(in, r.Replacement); got != want {
					t.Errorf("address %s -> %s, want %s", in, got, want)
				}
			}
			addr = true
		case "node":
			node = slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_node_name"})
		}
	}
	if !addr || !node {
		t.Errorf("the job must rewrite __address__ and set node from the node's name: %+v", cfg.ScrapeConfigs[0].Relabel)
	}
}

// The MachineHealthChecks as rendered, in both API versions, say what the
// spec's "Automatic replacement" tables say, written out here again rather
// than read from Pools: cloud pools act on Ready and the four daemon
// conditions, bare-metal pools on Ready=False alone; no other condition of
// the catalog (report-only, alert, operability, repair) replaces a machine.
func TestMachineHealthChecksFollowTheSpec(t *testing.T) {
	type cond struct {
		Type    string
		Status  string
		Seconds int
	}
	type want struct {
		conds            []cond
		max              int
		rangeGate        string
		startup          int
		remediationKind  string
		selectsCP        bool
		deploymentVarSel string
	}
	cloud := []cond{
		{"Ready", "Unknown", 600}, {"Ready", "False", 300},
		{"ReadonlyFilesystem", "True", 120}, {"KernelDeadlock", "True", 120},
		{"ServiceNotRecovering", "True", 60}, {"VerityCorruption", "True", 60},
	}
	bareMetal := []cond{{"Ready", "False", 300}}
	spec := map[string]want{
		"${CLUSTER_NAME}-hcloud-control-plane":    {cloud, 1, "", 1800, "HCloudRemediationTemplate", true, ""},
		"${CLUSTER_NAME}-hcloud-workers":          {cloud, 0, "[0-2]", 600, "HCloudRemediationTemplate", false, "${HCLOUD_WORKER_DEPLOYMENT}"},
		"${CLUSTER_NAME}-baremetal-control-plane": {bareMetal, 1, "", 1800, "HetznerBareMetalRemediationTemplate", true, ""},
		"${CLUSTER_NAME}-baremetal-workers":       {bareMetal, 1, "", 1800, "HetznerBareMetalRemediationTemplate", false, "${BAREMETAL_WORKER_DEPLOYMENT}"},
	}
	replaces := map[string]bool{"Ready": true, "ReadonlyFilesystem": true, "KernelDeadlock": true, "ServiceNotRecovering": true, "VerityCorruption": true}
	secs := func(t *testing.T, s string) int {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("duration %q: %v", s, err)
		}
		return int(d / time.Second)
	}
	type got struct {
		want
		selector map[string]string
	}
	check := func(t *testing.T, remaining map[string]want, name string, g got) {
		t.Helper()
		w, ok := remaining[name]
		if !ok {
			t.Errorf("MachineHealthCheck %s is not one of the spec's pools, or twice", name)
			return
		}
		delete(remaining, name)
		if !slices.Equal(g.conds, w.conds) {
			t.Errorf("%s: unhealthy conditions %v, the spec's are %v", name, g.conds, w.conds)
		}
		for _, c := range g.conds {
			if !replaces[c.Type] {
				t.Errorf("%s: %s replaces machines; the spec does not let it", name, c.Type)
			}
		}
		if g.max != w.max || g.rangeGate != w.rangeGate || g.startup != w.startup || g.remediationKind != w.remediationKind {
			t.Errorf("%s: gate %d %q, startup %ds, remediation %s; the spec's: %d %q, %ds, %s",
				name, g.max, g.rangeGate, g.startup, g.remediationKind, w.max, w.rangeGate, w.startup, w.remediationKind)
		}
		if g.selector["cluster.x-k8s.io/cluster-name"] != "${CLUSTER_NAME}" {
			t.Errorf("%s: selector %v does not select the cluster", name, g.selector)
		}
		if _, cp := g.selector["cluster.x-k8s.io/control-plane"]; cp != w.selectsCP || g.selector["cluster.x-k8s.io/deployment-name"] != w.deploymentVarSel {
			t.Errorf("%s: selector %v", name, g.selector)
		}
	}
	type ref struct {
		Kind string `yaml:"kind"`
	}
	t.Run("v1beta2", func(t *testing.T) {
		remaining := maps.Clone(spec)
		defer func() {
			for name := range remaining {
				t.Errorf("no MachineHealthCheck %s", name)
			}
		}()
		dec := renderedDecoder(t, "machinehealthchecks")
		for {
			var o struct {
				Metadata struct{ Name string } `yaml:"metadata"`
				Spec     struct {
					Selector struct {
						MatchLabels map[string]string `yaml:"matchLabels"`
					} `yaml:"selector"`
					Checks struct {
						NodeStartupTimeoutSeconds int `yaml:"nodeStartupTimeoutSeconds"`
						UnhealthyNodeConditions   []struct {
							Type           string `yaml:"type"`
							Status         string `yaml:"status"`
							TimeoutSeconds int    `yaml:"timeoutSeconds"`
						} `yaml:"unhealthyNodeConditions"`
					} `yaml:"checks"`
					Remediation struct {
						TriggerIf struct {
							UnhealthyLessThanOrEqualTo int    `yaml:"unhealthyLessThanOrEqualTo"`
							UnhealthyInRange           string `yaml:"unhealthyInRange"`
						} `yaml:"triggerIf"`
						TemplateRef ref `yaml:"templateRef"`
					} `yaml:"remediation"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			var g got
			for _, c := range o.Spec.Checks.UnhealthyNodeConditions {
				g.conds = append(g.conds, cond{c.Type, c.Status, c.TimeoutSeconds})
			}
			g.max, g.rangeGate = o.Spec.Remediation.TriggerIf.UnhealthyLessThanOrEqualTo, o.Spec.Remediation.TriggerIf.UnhealthyInRange
			g.startup, g.remediationKind = o.Spec.Checks.NodeStartupTimeoutSeconds, o.Spec.Remediation.TemplateRef.Kind
			g.selector = o.Spec.Selector.MatchLabels
			check(t, remaining, o.Metadata.Name, g)
		}
	})
	t.Run("v1beta1", func(t *testing.T) {
		remaining := maps.Clone(spec)
		defer func() {
			for name := range remaining {
				t.Errorf("no MachineHealthCheck %s", name)
			}
		}()
		dec := renderedDecoder(t, "machinehealthchecks-v1beta1")
		for {
			var o struct {
				Metadata struct{ Name string } `yaml:"metadata"`
				Spec     struct {
					Selector struct {
						MatchLabels map[string]string `yaml:"matchLabels"`
					} `yaml:"selector"`
					UnhealthyConditions []struct {
						Type    string `yaml:"type"`
						Status  string `yaml:"status"`
						Timeout string `yaml:"timeout"`
					} `yaml:"unhealthyConditions"`
					MaxUnhealthy        int    `yaml:"maxUnhealthy"`
					UnhealthyRange      string `yaml:"unhealthyRange"`
					NodeStartupTimeout  string `yaml:"nodeStartupTimeout"`
					RemediationTemplate ref    `yaml:"remediationTemplate"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			var g got
			for _, c := range o.Spec.UnhealthyConditions {
				g.conds = append(g.conds, cond{c.Type, c.Status, secs(t, c.Timeout)})
			}
			g.max, g.rangeGate = o.Spec.MaxUnhealthy, o.Spec.UnhealthyRange
			g.startup, g.remediationKind = secs(t, o.Spec.NodeStartupTimeout), o.Spec.RemediationTemplate.Kind
			g.selector = o.Spec.Selector.MatchLabels
			check(t, remaining, o.Metadata.Name, g)
		}
	})
}

// The two shipped forms of the rules, the rule file and the Prometheus
// Operator's PrometheusRule, hold the same groups and rules.
func TestPrometheusRuleHoldsTheRuleFilesRules(t *testing.T) {
	read := func(file string, into any) {
		b, err := os.ReadFile(filepath.Join(shipped, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	var rf ruleFile
	read("prometheus-rules.yaml", &rf)
	var cr struct {
		Kind string   `yaml:"kind"`
		Spec ruleFile `yaml:"spec"`
	}
	read("prometheusrule.yaml", &cr)
	if len(rf.Groups) == 0 || cr.Kind != "PrometheusRule" {
		t.Fatalf("rule file %d groups, custom resource kind %q", len(rf.Groups), cr.Kind)
	}
	if !reflect.DeepEqual(rf, cr.Spec) {
		t.Errorf("prometheusrule.yaml's spec is not prometheus-rules.yaml:\n%+v\n%+v", cr.Spec, rf)
	}
}

// A report document left out for room is one of three things (report/kube
// fitReport): a stub saying it was left out; where not even the stubs fit,
// taken off the Node (but tamper); and the tamper annotation, where not
// even its stub fits, left as it was (its updatedAt then stands still). The
// alert's description must not tell the operator every one is a stub.
func TestReportDocumentsLeftOutAlertSaysEachFate(t *testing.T) {
	var desc string
	for _, r := range daemonRules() {
		if r.Alert == "AutopilotHealthReportDocumentsLeftOut" {
			desc = r.Annotations["description"]
		}
	}
	if desc == "" {
		t.Fatal("no AutopilotHealthReportDocumentsLeftOut alert with a description")
	}
	for _, fate := range []string{"small one saying it was left out", "taken off the Node", "tamper annotation is left as it was", "updatedAt"} {
		if !strings.Contains(desc, fate) {
			t.Errorf("the description does not say %q:\n%s", fate, desc)
		}
	}
}

// While /dev/kmsg cannot be read the kernel monitor makes the kernel
// conditions that are not True Unknown (CheckFailed), and DisksFailure with
// them unless its SMART part says True, while a True one stays True, held
// for the boot (kmsg.Monitor.Blind, TestNotReadIsNotHealthy; the shipped
// binary with kmsg.device unreadable and a state file of this boot holding
// ReadonlyFilesystem True serves it True). The alert's description says
// so: before, it said "the kernel conditions are Unknown (CheckFailed)
// meanwhile", and an operator paged with a True ReadonlyFilesystem on the
// Node read it as stale.
func TestKernelLogUnreadableAlertSaysATrueConditionStays(t *testing.T) {
	var desc string
	for _, r := range daemonRules() {
		if r.Alert == "AutopilotHealthKernelLogUnreadable" {
			desc = r.Annotations["description"]
		}
	}
	if desc == "" {
		t.Fatal("no AutopilotHealthKernelLogUnreadable alert with a description")
	}
	for _, says := range []string{"not True are Unknown (CheckFailed)", "DisksFailure unless its SMART part", "True stays True"} {
		if !strings.Contains(desc, says) {
			t.Errorf("the description does not say %q:\n%s", says, desc)
		}
	}
	if strings.Contains(desc, "the kernel conditions are Unknown") {
		t.Errorf("the description says every kernel condition is Unknown, a True one is not:\n%s", desc)
	}
}
