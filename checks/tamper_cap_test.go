package checks

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// The findings list is capped (tamper.MaxFindings) and shared by the two
// tamper checks: once it is full of NodeTampered findings (64 files added
// under /etc/cni/net.d, which a pod with a hostPath mount can write), a
// swapped sealed layer still sets SealedOSTampered, the report's changes
// end with it, and the same mismatch seen again is not counted again.
func TestSealedLayerSwapAfterTheFindingsAreFull(t *testing.T) {
	const rec = "/var/lib/syself/sealed-os/root-hashes"
	h := newTamperHost(t)
	h.write(rec, "root "+hashA+"\n")
	nc := h.start("boot-1", report.NewStore("boot-1"))
	keeper := nc.keeper
	dm := &fakeDM{targets: []tamper.VerityTarget{verity("root", hashA)}}
	env := testEnv(t, func(c *config.Config) { c.HostRoot, c.StateDir = h.root, h.stateDir })
	env.Now = func() time.Time { return h.now }
	env.BootID = "boot-1"
	env.Tamper = keeper
	env.DM = dm
	sc, _ := newSealedOSCheck(env)
	h.probe(nc, report.StatusFalse, report.ReasonNodeIntact, "")
	h.probe(sc, report.StatusFalse, report.ReasonSealedOSIntact, "")
	for i := range tamper.MaxFindings {
		h.write(fmt.Sprintf("/etc/cni/net.d/x%02d", i), "x")
	}
	h.probe(nc, report.StatusTrue, report.ReasonProtectedFileChanged, fmt.Sprintf("%d finding(s)", tamper.MaxFindings))
	dm.targets = []tamper.VerityTarget{verity("root", hashB)}
	h.probe(sc, report.StatusTrue, report.ReasonRootHashMismatch, "1 finding(s)")
	rep := keeper.Report()
	if last := rep.Changes[len(rep.Changes)-1]; last.Condition != tamper.CondSealed {
		t.Errorf("the report's most recent change: %+v", last)
	}
	dropped := keeper.State().FindingsDropped
	h.probe(sc, report.StatusTrue, report.ReasonRootHashMismatch, "1 finding(s)")
	if d := keeper.State().FindingsDropped; d != dropped || dropped != 1 {
		t.Errorf("findings dropped: %d, then %d after the same mismatch again; want 1 and 1", dropped, d)
	}
	// NodeTampered keeps its latest findings.
	h.probe(nc, report.StatusTrue, report.ReasonProtectedFileChanged, fmt.Sprintf("%d finding(s)", tamper.MaxFindings-1))
}

// longNames writes n files under /etc/cni/net.d in a directory tree nested
// to a path of about 3,700 bytes, each named with 200 bytes: every entry
// of the baseline is about 4 KiB of JSON.
func (h *tamperHost) longNames(n int) {
	h.t.Helper()
	dir := "/etc/cni/net.d"
	for i := range 15 {
		dir += fmt.Sprintf("/%02d%s", i, strings.Repeat("d", 240))
	}
	if err := os.MkdirAll(h.path(dir), 0o755); err != nil {
		h.t.Fatal(err)
	}
	// A directory's file descriptor: the full path is near PATH_MAX.
	d, err := os.Open(h.path(dir))
	if err != nil {
		h.t.Fatal(err)
	}
	defer d.Close()
	for i := range n {
		name := fmt.Sprintf("%05d%s", i, strings.Repeat("f", 195))
		fd, err := unix.Openat(int(d.Fd()), name, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			h.t.Fatal(err)
		}
		unix.Close(fd)
	}
}

// Protected paths whose baseline is larger than the tamper state file may
// be (within the 10,000-path cap: 4,300 paths of about 3,900 bytes, some
// 17 MB of JSON) are handled as the cap is: the baseline is of the paths
// that fit, read in the scan's order, and the over-limit is a finding at
// once, naming where the cut fell; a change within it is still seen. The
// file the daemon wrote is read back at a restart: no BaselineCorrupt, no
// new finding. Before, the whole baseline was written, and the next start
// refused it ("larger than any state the daemon writes"), moved it aside
// and set NodeTampered True, BaselineCorrupt, on a node nobody touched.
func TestNodeTamperedBaselineOverTheStateFileSize(t *testing.T) {
	h := newTamperHost(t)
	h.longNames(4300)
	memos := report.NewStore("boot-1")
	c := h.start("boot-1", memos)
	res := h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "over-limit")
	if !strings.Contains(res.Message, "1 finding(s)") {
		t.Errorf("message %q: want the over-limit finding alone", res.Message)
	}
	st := c.keeper.State()
	if d := st.Findings[0].Detail; !strings.Contains(d, "baseline is larger than 8388608 bytes") {
		t.Errorf("the over-limit finding says %q", d)
	}
	if st.Baseline == nil || len(st.Baseline.Entries) < 1000 || len(st.Baseline.Entries) >= 4300 {
		t.Fatalf("baseline of %d entries, want the paths that fit (more than 1,000, fewer than all)", len(st.Baseline.Entries))
	}
	if err := c.keeper.Flush(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(h.stateDir, tamper.StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > tamper.MaxStateFileSize {
		t.Errorf("tamper.json is %d bytes, over the %d the daemon reads", fi.Size(), tamper.MaxStateFileSize)
	}

	// A restart within the boot reads it back: the same finding, nothing
	// moved aside, nothing added.
	c = h.start("boot-1", memos)
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "1 finding(s)")
	if m, _ := filepath.Glob(filepath.Join(h.stateDir, tamper.StateFileName+".corrupt*")); len(m) > 0 {
		t.Errorf("the daemon's own tamper.json was moved aside: %v", m)
	}
	if got := c.keeper.State(); got.Baseline == nil || got.Baseline.Digest != st.Baseline.Digest {
		t.Errorf("the baseline after a restart is %+v, want %s", got.Baseline, st.Baseline.Digest)
	}
	// Within the cut, a change is still a finding.
	h.write("/var/lib/kubelet/config.yaml", "changed\n")
	h.probe(c, report.StatusTrue, report.ReasonProtectedFileChanged, "/var/lib/kubelet/config.yaml modified")
}
