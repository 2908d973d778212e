package daemon

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
)

// A file whose mount_points_exclude is an earlier version's stock
// expression (with pods($|/)) gets today's default, not what it wrote
// (config.TestStockMountPointsExcludeTakenIsNoted): the journal says so,
// with the file, the line, the value taken and why, once at the start and
// once at a reload that brings it back, not at each reload; a file with
// today's stock expression says nothing. Before, the exclusion changed
// without a line.
func TestConfigNotesLoggedOnce(t *testing.T) {
	const old = `^/(dev|proc|sys|run|var/lib/kubelet/pods|var/lib/kubelet/plugins/kubernetes\.io/csi/.+/globalmount|var/lib/containerd/.+|run/containerd)($|/)`
	oldFile := "[checks.DiskUsageHigh]\nmount_points_exclude = '" + old + "'\n"
	f := newFileDaemon(t, oldFile, Options{})
	f.start(t)
	const said = "configuration: checks.DiskUsageHigh.mount_points_exclude is taken otherwise than written: the stock expression copied is taken as the default: it is an earlier version's stock expression"
	count := func() int { return strings.Count(f.logs.String(), said) }
	for deadline := time.Now().Add(10 * time.Second); count() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the start did not say the earlier stock expression was taken as the default:\n%s", f.logs.String())
		}
	}
	line := strings.Count(reloadTOML(f.base, f.listen, oldFile), "\n")
	logs := f.logs.String()
	if want := config.Default().Checks.DiskUsageHigh.MountPointsExclude; !strings.Contains(logs, "file="+f.path) ||
		!strings.Contains(logs, "line="+strconv.Itoa(line)) || !strings.Contains(logs, "taken="+want) {
		t.Errorf("the line names no file %s, line %d or the value taken %s:\n%s", f.path, line, want, logs)
	}
	reload := func(step string) {
		t.Helper()
		if _, err := f.Reload(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	reload("the same file")
	f.write(t, "[checks.DiskUsageHigh]\nspace_percent = 91\nmount_points_exclude = '"+old+"'\n")
	reload("another key changed")
	if n := count(); n != 1 {
		t.Errorf("said %d times after two reloads of files with it, want once:\n%s", n, f.logs.String())
	}
	f.write(t, "[checks.DiskUsageHigh]\nmount_points_exclude = '"+config.Default().Checks.DiskUsageHigh.MountPointsExclude+"'\n")
	reload("today's stock")
	f.write(t, oldFile)
	reload("the earlier stock again")
	if n := count(); n != 2 {
		t.Errorf("said %d times, want twice (the start, and the reload that brought it back):\n%s", n, f.logs.String())
	}
	if n := strings.Count(f.logs.String(), "is taken otherwise than written"); n != 2 {
		t.Errorf("%d notes logged, want 2:\n%s", n, f.logs.String())
	}
}
