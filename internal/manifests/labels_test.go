package manifests

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
)

// scrapeLabels are the labels every series of the daemon has once the
// shipped scrape job took it (job and instance from Prometheus, node from
// the job's relabelling).
var scrapeLabels = []string{"job", "instance", "node"}

// externalLabels are the labels of the series the rules read from
// kube-state-metrics (its documented node metrics, scraped as they are
// in the promtool tests) and Prometheus' up.
var externalLabels = map[string][]string{
	"kube_node_status_condition": {"node", "condition", "status"},
	"kube_node_info":             {"node", "kernel_version", "os_image", "container_runtime_version", "kubelet_version", "kubeproxy_version", "provider_id", "pod_cidr", "system_uuid", "internal_ip"},
	"up":                         nil,
}

var (
	promSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
)

// daemonSeries is every label of each metric family the daemon exports,
// from its descriptors, and the values of each label among the series
// that exist from the daemon's start (created at 0 so that alerts see
// the first change).
func daemonSeries(t *testing.T) (labels map[string][]string, values map[string]map[string][]string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := report.NewMetrics("test")
	m.InitConditions([]string{"DisksFailure"})
	kube.NewMetrics(reg)
	kmsg.NewMetrics(reg)
	checks.NewRepairer(nil, nil, time.Now, reg)
	checks.NewUnitWatch(nil, reg)
	checks.NewJournalFallbacks(reg)
	variable := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	labels = map[string][]string{}
	for _, r := range []interface{ Describe(chan<- *prometheus.Desc) }{reg, m} {
		ch := make(chan *prometheus.Desc, 1024)
		r.Describe(ch)
		close(ch)
		for d := range ch {
			s := d.String()
			name := fqName.FindStringSubmatch(s)
			if name == nil {
				continue
			}
			var ls []string
			if v := variable.FindStringSubmatch(s); v != nil && v[1] != "" {
				for _, l := range strings.Split(v[1], ",") {
					ls = append(ls, strings.TrimSpace(l))
				}
			}
			labels[name[1]] = ls
		}
	}
	values = map[string]map[string][]string{}
	for _, g := range []prometheus.Gatherer{reg, m.Gatherer()} {
		mfs, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				for _, lp := range s.GetLabel() {
					if values[mf.GetName()] == nil {
						values[mf.GetName()] = map[string][]string{}
					}
					values[mf.GetName()][lp.GetName()] = append(values[mf.GetName()][lp.GetName()], lp.GetValue())
				}
			}
		}
	}
	return labels, values
}

// Every label a rule selects on, groups by or joins on is one the series
// it reads have: the daemon's own labels (from its code), the scrape
// job's, or kube-state-metrics'. A label matcher the daemon's series do not
// have never matches, and its alert stays silent. Where the daemon creates
// a label's series at its start (result="ok" and "error" of the writes),
// a value a rule asks for by equality is one of them.
func TestRuleLabelsAreTheSeries(t *testing.T) {
	labels, values := daemonSeries(t)
	checked := 0
	for _, g := range ruleGroups().Groups {
		for _, r := range g.Rules {
			exprLabels := slices.Clone(scrapeLabels)
			for _, sel := range promSelector.FindAllStringSubmatch(r.Expr, -1) {
				metric, matchers := sel[1], sel[2]
				have, daemon := labels[metric]
				if !daemon {
					ext, ok := externalLabels[metric]
					if !ok {
						t.Errorf("%s: reads %s, neither the daemon's nor kube-state-metrics'", r.Alert, metric)
						continue
					}
					have = ext
				}
				have = append(slices.Clone(have), scrapeLabels...)
				exprLabels = append(exprLabels, have...)
				for _, mt := range promMatcher.FindAllStringSubmatch(matchers, -1) {
					label, op, value := mt[1], mt[2], mt[3]
					checked++
					if !slices.Contains(have, label) {
						t.Errorf("%s: %s{%s%s%q}: %s has no label %s (it has %v)", r.Alert, metric, label, op, value, metric, label, have)
						continue
					}
					if !daemon || op != "=" {
						continue
					}
					if got := values[metric][label]; len(got) > 0 && !slices.Contains(got, value) {
						t.Errorf("%s: %s{%s=%q}: the daemon's series of %s have %s %v", r.Alert, metric, label, value, metric, label, got)
					}
				}
			}
			for _, metric := range metricNames(r.Expr) {
				if ls, ok := labels[metric]; ok {
					exprLabels = append(exprLabels, ls...)
				} else {
					exprLabels = append(exprLabels, externalLabels[metric]...)
				}
			}
			for _, grp := range promGrouping.FindAllStringSubmatch(r.Expr, -1) {
				for _, l := range strings.Split(grp[1], ",") {
					l = strings.TrimSpace(l)
					checked++
					if l != "" && !slices.Contains(exprLabels, l) {
						t.Errorf("%s: groups or joins on %s, a label none of its series has: %s", r.Alert, l, r.Expr)
					}
				}
			}
		}
	}
	if checked < 30 {
		t.Errorf("checked %d labels: the rules' selectors were not read", checked)
	}
}
