package checks

import (
	"testing"

	"github.com/syself/autopilot-health/report"
)

// A reload (or a restart within the boot) that protects one more path or
// excludes one: the files under the new path were there all along and
// the excluded ones did not change, so nothing is a finding (it set
// NodeTampered, "/etc/containerd added", to stay until a clear). A change
// where both the baseline's paths and the new ones reach still is.
func TestNodeTamperedProtectedPathsChangedWithinTheBoot(t *testing.T) {
	h := newTamperHost(t)
	h.write("/etc/containerd/config.toml", "version = 2\n")
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "5 protected paths unchanged since this boot's baseline")
	h.protect = []string{"/etc/containerd"}
	c = h.start("boot-1", memos)
	h.probe(c, report.StatusFalse, report.ReasonNodeIntact, "")
	h.write("/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nauthentication: {anonymous: {enabled: true}}\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s): /var/lib/kubelet/config.yaml modified")
}
