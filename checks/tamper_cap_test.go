package checks

import (
	"fmt"
	"testing"
	"time"

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
