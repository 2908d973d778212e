package kube

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Every kind's ok series is on /metrics at 0 from the start, before any
// call: the alert on failing calls (AutopilotHealthAPIWritesFailing) takes a
// kind whose ok count rose in the last 15 minutes as working, and
// Prometheus' increase() does not see a series that first appears at 1. A
// kind whose first success comes after failures (the Node's read at a start
// while the API server cannot be reached, retried until it answers; it is
// made once per start) would otherwise count as failing for 15 minutes
// more, and the alert fire, or not clear, though the call works.
func TestEveryKindsOkSeriesIsExportedAtZeroFromTheStart(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_api_writes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			got[l["kind"]+"/"+l["result"]] = m.GetCounter().GetValue()
		}
	}
	for _, kind := range []string{KindStatus, KindEvent, KindEventCount, KindAnnotations, KindRead} {
		v, ok := got[kind+"/ok"]
		if !ok {
			t.Errorf("api_writes_total{kind=%q,result=\"ok\"} is not exported before the first call (series: %v)", kind, got)
		} else if v != 0 {
			t.Errorf("api_writes_total{kind=%q,result=\"ok\"} = %v before any call", kind, v)
		}
	}
	// Only the ok series: a failure's series still appears with the
	// failure (the alert's sensitivity to one failed call is unchanged).
	for k := range got {
		if !strings.HasSuffix(k, "/ok") {
			t.Errorf("series %s exported before any call", k)
		}
	}
}
