package checks

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/report"
)

// A DiskUsageHigh run where no filesystem could be measured (every statfs
// failed: EIO here; or hung) but LVM answered decides on the volume groups,
// and names the filesystems not checked: its storage document has no
// "filesystems" (not collected), not `[]`, which says "no filesystems", an
// answer (README: a list collected empty is [], never for a list not
// collected). Before, the run's empty list was written `"filesystems":[]`
// under a fresh updatedAt.
func TestDiskUsageNoFilesystemMeasuredIsNoList(t *testing.T) {
	half, pool := readFixture(t, "vgs-half.json"), readFixture(t, "lvs-thinpool.json")
	env := lvmEnv(t, &fakeLVM{vgs: half, lvs: pool}, nil)
	env.Config.Checks.DiskUsageHigh.ThinPoolDataPct = 94
	det := report.NewDetails()
	store := report.NewStore("b")
	r, err := NewRunner(env, Options{Store: store, Details: det, Only: []string{"DiskUsageHigh"}})
	if err != nil {
		t.Fatal(err)
	}
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
	if strings.Contains(d, `"filesystems"`) || !strings.Contains(d, `"volumeGroups":[{`) {
		t.Errorf("storage document after a run that measured no filesystem: %s; want no filesystems field, the volume groups", d)
	}
}
