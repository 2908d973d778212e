package checks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// A spec directory reached through an absolute symbolic link on the host
// is read as the host reads it, under a host_root other than / too: on
// Debian, Ubuntu and Fedora /var/run is a link to /run, and nvidia-ctk
// writes /var/run/cdi/nvidia.yaml, which is the host's /run/cdi/nvidia.yaml
// (containerd's CDI loader, on the host, finds it there). Before, the CDI
// loader was given <root>/var/run/cdi, whose link resolved to the daemon's
// own /run/cdi: the spec was not found, and a GPU that containerd can hand
// out was CDISpecMissing. Errors still name the configured directory.
func TestGpuActivationSpecDirUnderAnAbsoluteLinkUnderHostRoot(t *testing.T) {
	root := gpuHost(t, "pci-1-gpu", true, true, map[string]string{"/run/cdi/nvidia.json": "nvidia-1-gpu.json"})
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/run", filepath.Join(root, "var/run")); err != nil {
		t.Fatal(err)
	}
	if r := probeGPU(t, root, nil); r.Status != report.StatusFalse {
		t.Fatalf("spec at /var/run/cdi/nvidia.json through /var/run -> /run: %s %s %q; want False", r.Status, r.Reason, r.Message)
	}
	// A spec there that the loader refuses is named by the configured
	// directory, not the root's resolved path.
	if err := os.WriteFile(filepath.Join(root, "run/cdi/zz.yaml"), []byte("kind: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := probeGPU(t, root, nil)
	if r.Status != report.StatusFalse || !strings.Contains(r.Message, `"/var/run/cdi/zz.yaml"`) || strings.Contains(r.Message, root) {
		t.Fatalf("a refused spec beside it: %s %s %q; want False naming /var/run/cdi/zz.yaml", r.Status, r.Reason, r.Message)
	}
}
