//go:build integration

package tests

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// The UUIDs of the GPUs of checks/testdata/roots/pci-4-gpu, in PCI order.
var gpuUUIDs = []string{"GPU-3f1c2a8e-5b7d-4e19-a6c2-8d9e0f1a2b3c", "GPU-7a2e9c41-0d3b-4f58-b1e7-2c6d8a9f0e14",
	"GPU-c4d81f26-93ab-4e07-8f5c-6b1a2d3e4f50", "GPU-e9b05d73-1c2f-4a86-9d4e-7f8a0b1c2d36"}

// genCDI builds tests/tools/nvcdi: the code of `nvidia-ctk cdi generate`
// (NVIDIA's pkg/nvcdi and spec writer), with NVML mocked (go-nvml is cgo).
func genCDI(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatal("no C compiler: go-nvml, which NVIDIA's generator links, needs cgo (Debian package gcc)")
	}
	bin := filepath.Join(t.TempDir(), "gen-cdi")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = "tools/nvcdi"
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building tests/tools/nvcdi: %v\n%s", err, out)
	}
	return bin
}

// nvidiaDriverRoot is what the generator looks up on a host with the
// driver: the /dev/nvidia* character devices (major 195, as the driver's)
// and libcuda of the mock's driver version.
func nvidiaDriverRoot(t *testing.T, gpus int) string {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "dev"), 0o755)
	os.MkdirAll(filepath.Join(root, "usr/lib/x86_64-linux-gnu"), 0o755)
	nodes := map[string][2]uint32{"nvidiactl": {195, 255}, "nvidia-modeset": {195, 254}, "nvidia-uvm": {510, 0}, "nvidia-uvm-tools": {510, 1}}
	for i := range gpus {
		nodes["nvidia"+strconv.Itoa(i)] = [2]uint32{195, uint32(i)}
	}
	for name, mm := range nodes {
		if err := unix.Mknod(filepath.Join(root, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(mm[0], mm[1]))); err != nil {
			t.Fatalf("mknod %s: %v", name, err)
		}
	}
	for _, lib := range []string{"libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"} {
		os.WriteFile(filepath.Join(root, "usr/lib/x86_64-linux-gnu", lib), nil, 0o644)
	}
	return root
}

// bootedADayAgo is the host's system calls on a host booted a day ago:
// GpuActivationFailed judges as it does past its grace after the boot
// (TestGpuActivationBootGrace), whenever the machine running the test booted.
type bootedADayAgo struct{ checks.Sys }

func (bootedADayAgo) SinceBoot() (time.Duration, error) { return 24 * time.Hour, nil }

// GpuActivationFailed on the 4-GPU host tree, reading specs that NVIDIA's
// generator writes into the host's CDI directories as the node's
// activation would: none, one for 2 of the 4 GPUs, one for all four (YAML,
// then JSON), and the marker gone. No GPU or driver on this machine: the
// PCI tree and the driver's /proc are the fixture's, NVML is go-nvml's
// DGX H100 mock; the spec files are the generator's own.
func TestGpuActivationWithNvidiasGenerator(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the driver root's /dev/nvidia* are character devices (mknod)")
	}
	gen := genCDI(t)
	drv := nvidiaDriverRoot(t, len(gpuUUIDs))

	host := t.TempDir()
	fixture, _ := filepath.Abs("../checks/testdata/roots/pci-4-gpu")
	for _, d := range []string{"sys", "proc"} {
		if err := os.Symlink(filepath.Join(fixture, d), filepath.Join(host, d)); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(host, "run/syself/gpu-activated")
	os.MkdirAll(filepath.Dir(marker), 0o755)
	os.WriteFile(marker, nil, 0o644)

	cfg := config.Default()
	cfg.HostRoot = host
	env := &checks.Env{Config: cfg, NodeName: "gpu-1", Role: report.RoleWorker, GPU: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Sys: bootedADayAgo{checks.RealSys()}, Now: time.Now}
	c, err := checks.NewForTest("GpuActivationFailed", env)
	if err != nil {
		t.Fatal(err)
	}
	probe := func(step string, status report.Status, reason report.Reason, msgParts ...string) {
		t.Helper()
		r, err := c.Probe(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if r.Status != status || r.Reason != reason {
			t.Errorf("%s: %s/%s %q, want %s/%s", step, r.Status, r.Reason, r.Message, status, reason)
		}
		for _, p := range msgParts {
			if !strings.Contains(r.Message, p) {
				t.Errorf("%s: message %q lacks %q", step, r.Message, p)
			}
		}
	}
	generate := func(hostPath string, uuids ...string) {
		t.Helper()
		out := filepath.Join(host, hostPath)
		os.MkdirAll(filepath.Dir(out), 0o755)
		cmd := exec.Command(gen, "-driver-root", drv, "-output", out, "-uuids", strings.Join(uuids, ","))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gen-cdi %s: %v\n%s", hostPath, err, b)
		}
	}
	const four = "4 GPUs (0000:18:00.0, 0000:2a:00.0, 0000:ab:00.0, 0000:ba:00.0)"

	probe("no spec yet", report.StatusTrue, report.ReasonCDISpecMissing,
		four+" present; no CDI spec under /etc/cdi, /var/run/cdi names a device of kind nvidia.com/gpu for 0000:18:00.0 (index 0, "+gpuUUIDs[0]+")")
	generate("/var/run/cdi/nvidia.yaml", gpuUUIDs[:2]...)
	probe("a spec for 2 of the 4 GPUs", report.StatusTrue, report.ReasonCDISpecMissing,
		"names a device of kind nvidia.com/gpu for 0000:ab:00.0 (index 2, "+gpuUUIDs[2]+"), 0000:ba:00.0 (index 3, "+gpuUUIDs[3]+")")
	generate("/var/run/cdi/nvidia.yaml", gpuUUIDs...)
	probe("a spec for all four", report.StatusFalse, report.ReasonGpuActivated,
		four+" activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.yaml")
	os.Remove(filepath.Join(host, "/var/run/cdi/nvidia.yaml"))
	generate("/etc/cdi/nvidia.json", gpuUUIDs...)
	probe("the JSON spec in /etc/cdi", report.StatusFalse, report.ReasonGpuActivated, "in /etc/cdi/nvidia.json")
	os.Remove(marker)
	probe("marker gone", report.StatusTrue, report.ReasonActivationMarkerMissing,
		four+" present, but the activation marker /run/syself/gpu-activated is missing (gpu-activate has not finished)")
}
