package manifests

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/syself/autopilot-health/report"
)

// Panel is one panel of the dashboard: a title, its PromQL queries, and how
// it draws them.
type Panel struct {
	Title   string
	Kind    string // "timeseries" or "table"
	Queries []string
	Unit    string
}

// conditionTypes is a regex alternation of every condition of the catalog.
func conditionTypes() string {
	var t []string
	for _, c := range report.Conditions {
		t = append(t, c.Type)
	}
	return strings.Join(t, "|")
}

// DashboardPanels are the dashboard's panels; DashboardQueries lists their
// queries for the test that checks every metric they read exists.
func DashboardPanels() []Panel {
	sel := `node=~"$node"`
	return []Panel{
		{Title: "Conditions True, by node", Kind: "table", Queries: []string{
			fmt.Sprintf(`kube_node_status_condition{%s,status="true",condition=~"%s"} == 1`, sel, conditionTypes())}},
		{Title: "Nodes without a running daemon", Kind: "table", Queries: []string{
			fmt.Sprintf(`kube_node_info{%s} unless on (node) (up{job=%q} == 1)`, sel, Job)}},
		{Title: "Unit restarts (systemd NRestarts), per hour", Kind: "timeseries", Queries: []string{
			fmt.Sprintf(`sum by (node, unit) (increase(syself_node_unit_restarts{%s}[1h]))`, sel)}},
		{Title: "Repairs by the daemon, per hour", Kind: "timeseries", Queries: []string{
			fmt.Sprintf(`sum by (node, unit, result) (increase(autopilot_health_repairs_total{%s}[1h]))`, sel)}},
		{Title: "Problems (events and conditions turning True), per hour", Kind: "timeseries", Queries: []string{
			fmt.Sprintf(`sum by (node, reason) (increase(problem_counter{%s}[1h]))`, sel)}},
		{Title: "Kernel log records read and lost", Kind: "timeseries", Unit: "ops", Queries: []string{
			fmt.Sprintf(`sum by (node) (rate(autopilot_health_kmsg_records_total{%s}[5m]))`, sel),
			fmt.Sprintf(`sum by (node) (rate(autopilot_health_kmsg_lost_records_total{%s}[5m]))`, sel)}},
		{Title: "Kernel log reader up", Kind: "timeseries", Queries: []string{
			fmt.Sprintf(`autopilot_health_kmsg_reader_up{%s}`, sel)}},
		{Title: "Check duration, p99", Kind: "timeseries", Unit: "s", Queries: []string{
			fmt.Sprintf(`histogram_quantile(0.99, sum by (le, check) (rate(autopilot_health_check_duration_seconds_bucket{%s}[5m])))`, sel)}},
		{Title: "Check runs by result", Kind: "timeseries", Unit: "ops", Queries: []string{
			fmt.Sprintf(`sum by (check, result) (rate(autopilot_health_check_runs_total{%s}[5m]))`, sel)}},
		{Title: "Kubernetes API calls by kind and result", Kind: "timeseries", Unit: "ops", Queries: []string{
			fmt.Sprintf(`sum by (kind, result) (rate(autopilot_health_api_writes_total{%s}[5m]))`, sel)}},
		// The gauge is 0 until the first call that works (standalone:
		// always): time() - 0 is the time since 1970, not since a call;
		// such a node shows nothing.
		{Title: "Seconds since the last successful API call", Kind: "timeseries", Unit: "s", Queries: []string{
			fmt.Sprintf(`time() - (autopilot_health_api_last_success_timestamp_seconds{%s} > 0)`, sel)}},
		{Title: "Daemon healthy (every loop makes progress)", Kind: "timeseries", Queries: []string{
			fmt.Sprintf(`autopilot_health_healthy{%s}`, sel)}},
		{Title: "Daemon memory (RSS)", Kind: "timeseries", Unit: "bytes", Queries: []string{
			fmt.Sprintf(`process_resident_memory_bytes{job=%q,%s}`, Job, sel)}},
	}
}

func renderDashboard() ([]byte, error) {
	type target struct {
		Expr         string `json:"expr"`
		RefID        string `json:"refId"`
		LegendFormat string `json:"legendFormat,omitempty"`
		Format       string `json:"format,omitempty"`
		Instant      bool   `json:"instant,omitempty"`
	}
	type gridPos struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	}
	type panel struct {
		ID          int            `json:"id"`
		Type        string         `json:"type"`
		Title       string         `json:"title"`
		Datasource  map[string]any `json:"datasource"`
		GridPos     gridPos        `json:"gridPos"`
		Targets     []target       `json:"targets"`
		FieldConfig map[string]any `json:"fieldConfig"`
	}
	ds := map[string]any{"type": "prometheus", "uid": "${datasource}"}
	var panels []panel
	for i, p := range DashboardPanels() {
		pn := panel{ID: i + 1, Type: p.Kind, Title: p.Title, Datasource: ds,
			GridPos:     gridPos{H: 8, W: 12, X: (i % 2) * 12, Y: (i / 2) * 8},
			FieldConfig: map[string]any{"defaults": map[string]any{"unit": p.Unit}, "overrides": []any{}}}
		for j, q := range p.Queries {
			t := target{Expr: q, RefID: string(rune('A' + j))}
			if p.Kind == "table" {
				t.Format, t.Instant = "table", true
			}
			pn.Targets = append(pn.Targets, t)
		}
		panels = append(panels, pn)
	}
	dash := map[string]any{
		"title":         "autopilot-health: node health",
		"uid":           "autopilot-health",
		"tags":          []string{"autopilot-health", "nodes"},
		"schemaVersion": 39,
		"editable":      true,
		"time":          map[string]string{"from": "now-6h", "to": "now"},
		"refresh":       "1m",
		"description":   "Generated by `autopilot-health manifests grafana-dashboard` from the daemon's condition catalog; do not edit.",
		"templating": map[string]any{"list": []any{
			map[string]any{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
			map[string]any{"name": "node", "type": "query", "label": "Node", "datasource": ds,
				"query":   map[string]any{"query": "label_values(kube_node_info, node)", "refId": "node"},
				"refresh": 2, "includeAll": true, "multi": true, "allValue": ".*",
				"current": map[string]any{"text": "All", "value": "$__all"}},
		}},
		"panels": panels,
	}
	b, err := json.MarshalIndent(dash, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
