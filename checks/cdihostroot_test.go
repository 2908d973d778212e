package checks

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
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

// A spec with a null entry in a list of pointers (here a device node given
// as a bare "-", what a write torn after the dash leaves) makes the CDI
// loader panic (specs-go's requiresV050 dereferences the nil *DeviceNode).
// The check refuses that spec, naming it, as it refuses a FIFO: an error
// (Unknown). Before, the panic went up through Probe: CheckPanicked, with a
// runtime error and no file named.
func TestGpuActivationSpecTheCDILoaderPanicsOn(t *testing.T) {
	root := gpuHost(t, "pci-1-gpu", true, true, map[string]string{"/var/run/cdi/nvidia.json": "nvidia-1-gpu.json"})
	torn := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: gpu0\n  containerEdits:\n    deviceNodes:\n    -"
	if err := os.MkdirAll(filepath.Join(root, "etc/cdi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/cdi/torn.yaml"), []byte(torn), 0o644); err != nil {
		t.Fatal(err)
	}
	env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
	env.GPU = true
	c, err := NewForTest("GpuActivationFailed", env)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Probe(context.Background())
	const want = "CDI spec /etc/cdi/torn.yaml: the CDI loader panics reading it (a null entry in a list?): runtime error: invalid memory address or nil pointer dereference"
	if err == nil || err.Error() != want {
		t.Fatalf("probe: %v; want %q", err, want)
	}
}

// Under a host_root other than /, a spec file that is an absolute link
// (the host's /etc/cdi/nvidia.yaml pointing into a store of generated
// files, as NixOS's /etc is, or an operator's link to where nvidia-ctk
// wrote it) is the host's file under the root, as containerd on the host
// reads it. Before, the CDI cache followed the link from the daemon's own
// /: "no such file or directory", and the GPU it names was
// CDISpecMissing, True. The messages still name the host's paths.
func TestGpuActivationSpecFileAnAbsoluteLinkUnderHostRoot(t *testing.T) {
	// A store that this machine's own / has not.
	store := fmt.Sprintf("/opt/cdi-store-%d-%d", os.Getpid(), time.Now().UnixNano())
	root := gpuHost(t, "pci-1-gpu", true, true, map[string]string{store + "/nvidia.json": "nvidia-1-gpu.json"})
	if err := os.MkdirAll(filepath.Join(root, "var/run/cdi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(store+"/nvidia.json", filepath.Join(root, "var/run/cdi/nvidia.json")); err != nil {
		t.Fatal(err)
	}
	r := probeGPU(t, root, nil)
	if r.Status != report.StatusFalse || !strings.Contains(r.Message, "/var/run/cdi/nvidia.json") || strings.Contains(r.Message, root) || strings.Contains(r.Message, os.TempDir()) {
		t.Fatalf("spec /var/run/cdi/nvidia.json -> /opt/cdi-store/nvidia.json under the root: %s %s %q; want False naming /var/run/cdi/nvidia.json", r.Status, r.Reason, r.Message)
	}
	// A link to nothing on the host is reported as the cache reports it,
	// naming the host's path.
	if err := os.Symlink(store+"/gone.json", filepath.Join(root, "var/run/cdi/zz.json")); err != nil {
		t.Fatal(err)
	}
	r = probeGPU(t, root, nil)
	if r.Status != report.StatusFalse || !strings.Contains(r.Message, "/var/run/cdi/zz.json") || strings.Contains(r.Message, root) {
		t.Fatalf("a dangling link beside it: %s %s %q; want False naming /var/run/cdi/zz.json", r.Status, r.Reason, r.Message)
	}
}
