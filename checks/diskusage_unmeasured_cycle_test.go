package checks

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A filesystem measured, then not (its statfs fails: EIO), then measured
// again: its entry keeps its place, has README's schema each time
// (figures, or mountPoint, fsType, source and error alone, byte for byte
// as README's example writes it), its mount point's bytes that are not
// UTF-8 written \xNN in both, and no run leaves anything "stale" (each
// decided: the other filesystem was measured).
func TestDiskUsageFilesystemMeasuredUnmeasuredAndBack(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root+"/proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"+
		"30 22 8:17 / /srv/caf\xe9 rw,relatime shared:9 - xfs /dev/sdb1 rw\n")
	odd := root + "/srv/caf\xe9"
	sys := &fakeSys{statfs: map[string]unix.Statfs_t{root: st(1000, 20, 100, 5), odd: st(1000, 20, 100, 5)}}
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.Sys = sys
	r, _, det := diskUsageRunner(t, env)
	measuredEntry := `{"mountPoint":"/srv/caf\\xe9","fsType":"xfs","source":"/dev/sdb1","sizeBytes":`
	unmeasuredEntry := `{"mountPoint":"/srv/caf\\xe9","fsType":"xfs","source":"/dev/sdb1","error":"statfs: input/output error"}`
	for i, step := range []struct {
		err   error
		entry string
	}{{nil, measuredEntry}, {unix.EIO, unmeasuredEntry}, {nil, measuredEntry}} {
		sys.statErr = map[string]error{}
		if step.err != nil {
			sys.statErr[odd] = step.err
		}
		c := r.RunOnce(t.Context())[0]
		if c.Status != report.StatusFalse {
			t.Errorf("run %d: DiskUsageHigh = %s/%s %q, want False", i, c.Status, c.Reason, c.Message)
		}
		doc := docOf(t, det, "storage")
		fss := storageFilesystems(t, doc)
		if len(fss) != 2 || string(fss[0]["mountPoint"]) != `"/"` || !strings.Contains(doc, step.entry) || strings.Contains(doc, `"stale"`) {
			t.Errorf("run %d: storage document %s, want / then %s, nothing stale", i, doc, step.entry)
		}
	}
}
