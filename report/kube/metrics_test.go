package kube

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/prometheus/client_golang/prometheus"
)

// Every kind's series of every result is on /metrics at 0 from the start,
// before any call: Prometheus' increase() and rate() do not see a series
// that first appears at 1. The alert on failing calls
// (AutopilotHealthAPIWritesFailing) takes a kind whose ok count rose in the
// last 15 minutes as working: a kind whose first success comes after
// failures (the Node's read at a start while the API server cannot be
// reached, retried until it answers; it is made once per start) would
// otherwise count as failing for 15 minutes more. And it takes a kind whose
// failures rose as failing: a failure series born at 1 hid the first
// failure of each kind and result from the alert and the dashboard (an
// Event refused once was never seen; a kind failing every call was seen a
// call late).
func TestEveryKindAndResultSeriesIsExportedAtZeroFromTheStart(t *testing.T) {
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
	// Every result a call can end with, from resultOf itself.
	gr := schema.GroupResource{Resource: "nodes"}
	want := map[string]bool{}
	for _, err := range []error{
		nil,
		apierrors.NewForbidden(gr, "n", errors.New("no")),
		apierrors.NewNotFound(gr, "n"),
		apierrors.NewConflict(gr, "n", errors.New("changed")),
		apierrors.NewServiceUnavailable("down"),
		fmt.Errorf("dial: %w", errors.New("connection refused")),
		ErrFilesHung,
	} {
		want[resultOf(err)] = true
	}
	for _, kind := range []string{KindStatus, KindEvent, KindEventCount, KindAnnotations, KindRead} {
		for res := range want {
			v, ok := got[kind+"/"+res]
			if !ok {
				t.Errorf("api_writes_total{kind=%q,result=%q} is not exported before the first call (series: %v)", kind, res, got)
			} else if v != 0 {
				t.Errorf("api_writes_total{kind=%q,result=%q} = %v before any call", kind, res, v)
			}
		}
	}
	// No other series: 5 kinds, 4 results.
	if len(got) != 20 {
		t.Errorf("%d series before any call, want 20 (5 kinds, 4 results): %v", len(got), got)
	}
}
