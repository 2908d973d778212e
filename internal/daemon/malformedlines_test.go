package daemon

import (
	"slices"
	"testing"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/report"
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
	// The kernel log monitor's pod volume lookup counts into the same
	// family, under its own reader.
	ko, err := KmsgOptions(d.cfg, d.env, report.NewStore("b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ko.MalformedMountinfo == nil {
		t.Fatal("kmsg.Options.MalformedMountinfo not wired: the pod volume lookup's malformed lines are not counted")
	}
	ko.MalformedMountinfo.Add(3)
	if n := d.env.Malformed.Value(checks.MalformedMountKmsg); n != 3 {
		t.Errorf(`autopilot_health_malformed_lines_total{reader="mountinfo-kmsg"} = %v after the monitor's 3, want 3`, n)
	}
}
