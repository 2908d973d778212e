package daemon

import (
	"slices"
	"testing"

	"github.com/syself/autopilot-health/checks"
)

// The daemon serves autopilot_health_journal_fallbacks_total, every reason
// at 0 from the start (so increase() sees a node's first fallback), and
// gives its checks the counter it serves.
func TestDaemonServesJournalFallbacks(t *testing.T) {
	d := identityDaemon(t, false)
	mfs, err := d.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, mf := range mfs {
		if mf.GetName() != "autopilot_health_journal_fallbacks_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("reason %s: %v at the start", label(m, "reason"), v)
			}
			reasons = append(reasons, label(m, "reason"))
		}
	}
	var want []string
	for _, r := range checks.JournalFallbackReasons {
		want = append(want, string(r))
	}
	slices.Sort(want)
	if !slices.Equal(reasons, want) {
		t.Errorf("autopilot_health_journal_fallbacks_total reasons %v, want %v", reasons, want)
	}
	if d.env.JournalFallbacks == nil {
		t.Error("the checks' Env has no JournalFallbacks: their fallbacks are not counted")
	}
}
