package checks

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A DiskUsageHigh run where no filesystem could be measured (every statfs
// failed: EIO here; or hung) but LVM answered decides on the volume groups,
// and names the filesystems not checked: its storage document lists each
// with its error and no figures, never `[]`, which says "no filesystems",
// an answer (README: a list collected empty is [], never for a list not
// collected). Before, the run's empty list was written `"filesystems":[]`
// under a fresh updatedAt; then, the field was left out, as if the
// filesystems were gone.
func TestDiskUsageNoFilesystemMeasuredListsTheirErrors(t *testing.T) {
	half, pool := readFixture(t, "vgs-half.json"), readFixture(t, "lvs-thinpool.json")
	env := lvmEnv(t, &fakeLVM{vgs: half, lvs: pool}, nil)
	env.Config.Checks.DiskUsageHigh.ThinPoolDataPct = 94
	r, store, det := diskUsageRunner(t, env)
	r.RunOnce(context.Background())
	if d := docOf(t, det, "storage"); !strings.Contains(d, `"mountPoint":"/var"`) || !strings.Contains(d, `"volumeGroups":[{`) {
		t.Fatalf("storage document after a run that measured the filesystems: %s", d)
	}
	sys := env.Sys.(*fakeSys)
	sys.statErr = map[string]error{}
	for p := range sys.statfs {
		sys.statErr[p] = unix.EIO
	}
	r.RunOnce(context.Background())
	c, _ := store.Get("DiskUsageHigh")
	if !strings.Contains(c.Message, "not checked: statfs") {
		t.Fatalf("DiskUsageHigh after every statfs failed: %+v", c)
	}
	d := docOf(t, det, "storage")
	fss := storageFilesystems(t, d)
	if len(fss) != len(sys.statErr) || !strings.Contains(d, `"volumeGroups":[{`) {
		t.Fatalf("storage document after a run that measured no filesystem: %s; want its %d filesystems with their errors, the volume groups", d, len(sys.statErr))
	}
	for _, e := range fss {
		if string(e["error"]) != `"statfs: input/output error"` || e["usedPercent"] != nil {
			t.Errorf("entry %v: want its error, no figures", e)
		}
	}
}
