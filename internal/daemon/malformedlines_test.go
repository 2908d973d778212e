package daemon

import (
	"slices"
	"testing"

	"github.com/syself/autopilot-health/checks"
)

// The daemon serves autopilot_health_malformed_lines_total, every reader
// at 0 from the start (so increase() sees a node's first malformed line),
// and gives its checks the counter it serves.
func TestDaemonServesMalformedLines(t *testing.T) {
	d := identityDaemon(t, false)
	mfs, err := d.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var readers []string
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_malformed_lines_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("reader %s: %v at the start", label(m, "reader"), v)
			}
			readers = append(readers, label(m, "reader"))
		}
	}
	var want []string
	for _, r := range checks.MalformedReaders {
		want = append(want, string(r))
	}
	slices.Sort(want)
	if !slices.Equal(readers, want) {
		t.Errorf("autopilot_health_malformed_lines_total readers %v, want %v", readers, want)
	}
	if d.env.Malformed == nil {
		t.Error("the checks' Env has no Malformed: their skipped lines are not counted")
	}
}
