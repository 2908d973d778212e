package checks

import (
	"testing"

	"github.com/syself/autopilot-health/report"
)

// A protected file whose name is not valid UTF-8 (a byte of another
// encoding, as a Latin-1 backup name) is part of the baseline like any
// other: a daemon restart within the boot reuses the baseline and finds
// nothing changed, and a finding of such a name is still one finding after
// the restart. Before, tamper.json held the name as U+FFFD: the baseline
// read back failed its digest, and a restart set NodeTampered
// (BaselineCorrupt) on a node nobody touched.
func TestNodeTamperedFileNamedInAnotherEncodingSurvivesARestart(t *testing.T) {
	h := newTamperHost(t)
	h.write("/etc/cni/net.d/caf\xe9.conflist.bak", "{}")
	h.write("/etc/cni/net.d/caf\xc3\xa9.conflist", "{}")
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "7 protected paths unchanged since this boot's baseline")
	c = h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "7 protected paths unchanged since this boot's baseline")

	h.write("/etc/cni/net.d/\xa0evil.conflist", "{}")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/cni/net.d/\xa0evil.conflist added")
	c = h.start("boot-1", memos)
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /etc/cni/net.d/\xa0evil.conflist added")
}
