package checks

import (
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// A reload (or a restart within the boot) that protects one more path or
// excludes one: the files under the new path were there all along and
// the excluded ones did not change, so nothing is a finding (it set
// NodeTampered, "/etc/containerd added", to stay until a clear). That the
// paths differ from the baseline's is logged once at warning priority (by
// each check the reload or restart builds, however often it runs). A change
// where both the baseline's paths and the new ones reach still is a finding.
func TestNodeTamperedProtectedPathsChangedWithinTheBoot(t *testing.T) {
	const differ = "the protected paths differ from those of this boot's baseline"
	// logged checks that the lines so far say the paths differ n times,
	// each at warning priority.
	logged := func(logs *testenv.SyncBuffer, n int) {
		t.Helper()
		var lines []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, differ) {
				lines = append(lines, l)
			}
		}
		if len(lines) != n {
			t.Fatalf("%d lines say the protected paths differ, want %d:\n%s", len(lines), n, logs.String())
		}
		for _, l := range lines {
			if !strings.Contains(l, "level=WARN ") {
				t.Errorf("not at warning priority: %s", l)
			}
		}
	}
	h := newTamperHost(t)
	h.logs = new(testenv.SyncBuffer)
	h.write("/etc/containerd/config.toml", "version = 2\n")
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline")
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline")
	logged(h.logs, 0)

	// One more protected path.
	h.protect = []string{"/etc/containerd"}
	c = h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	logged(h.logs, 1)

	// A protected file excluded (and the added path protected no more): the
	// baseline has it, this scan does not read it, and it is not "removed".
	h.protect, h.exclude = nil, []string{"/etc/cni/net.d/05-cilium.conflist"}
	c = h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	logged(h.logs, 2)

	h.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}}\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /var/lib/kubelet/config.yaml modified")
	logged(h.logs, 2)
}
