package checks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// Review of the pod volume directories' links (linkedPodDirs) against
// links a host may have that lead nowhere sensible:
//   - a relative link that climbs past the host root (../../../../..):
//     resolved inside the root as the host resolves it (RESOLVE_IN_ROOT
//     clamps .. at the root), so /var/lib/kubelet -> ../../../../../data/kubelet
//     is the host's /data/kubelet and the pods' volumes are left out;
//   - a loop (/var/lib/kubelet -> kubelet2 -> kubelet): nothing resolves
//     (ELOOP), the directories are taken as named, the run neither fails
//     nor hangs, and the volumes below /data/kubelet are measured, as
//     nothing of the host says they are the kubelet's;
//   - a link to / (pods -> /): not taken, or every mount would be a pod's.
func TestDiskUsageLinkedPodDirsEscapeLoopAndRoot(t *testing.T) {
	probe := func(t *testing.T, root string, sys *fakeSys) (Result, string) {
		t.Helper()
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root; c.Checks.DiskUsageHigh.LVMCommand = "" })
		env.Sys = sys
		c, err := newDiskUsageCheck(env)
		if err != nil {
			t.Fatal(err)
		}
		return probeWatched(t, c)
	}
	t.Run("relative link past the root", func(t *testing.T) {
		root, sys := linkedKubeletHost(t)
		if err := os.Symlink("../../../../../../../data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		res, got := probe(t, root, sys)
		if want := "/ /data /data/kubelet/plugins/example.com/cache"; got != want || res.Status != report.StatusFalse {
			t.Errorf("watched %q, %s %q; want %q, False", got, res.Status, res.Message, want)
		}
	})
	t.Run("loop", func(t *testing.T) {
		root, sys := linkedKubeletHost(t)
		if err := os.Symlink("kubelet2", filepath.Join(root, "var/lib/kubelet")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("kubelet", filepath.Join(root, "var/lib/kubelet2")); err != nil {
			t.Fatal(err)
		}
		res, got := probe(t, root, sys)
		if res.Status != report.StatusTrue || got == "" {
			t.Errorf("watched %q, %s %q; want the volumes below /data/kubelet measured (True)", got, res.Status, res.Message)
		}
	})
	t.Run("pods linked to the root", func(t *testing.T) {
		root, sys := linkedKubeletHost(t)
		mkdir(t, filepath.Join(root, "var/lib/kubelet"))
		if err := os.Symlink("/", filepath.Join(root, "var/lib/kubelet/pods")); err != nil {
			t.Fatal(err)
		}
		res, got := probe(t, root, sys)
		if res.Status != report.StatusTrue || !strings.HasPrefix(got, "/ /data ") {
			t.Errorf("watched %q, %s %q; want /, /data and the volumes below /data/kubelet measured (True)", got, res.Status, res.Message)
		}
	})
}
