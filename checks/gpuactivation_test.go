package checks

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// The PCI trees under testdata/roots/pci-* are laid out as the kernel's
// sysfs is (each /sys/bus/pci/devices/<address> a link into /sys/devices,
// with vendor, device and class files); they are written by hand, not
// captured from a GPU host (this machine has none):
//
//	pci-no-gpu  an Intel host bridge, an Intel NIC, and an ASPEED BMC VGA
//	            controller (a display device, class 0x030000, not NVIDIA)
//	pci-1-gpu   the same, plus a GeForce RTX 3090 (VGA class 0x030000) and
//	            its HDMI audio function (NVIDIA, class 0x040300)
//	pci-4-gpu   the base, plus four H100 (3D controller, 0x030200) and an
//	            NVSwitch (NVIDIA, bridge class 0x068000)
//	pci-vfio    pci-4-gpu with 0000:2a:00.0 and 0000:ba:00.0 bound to
//	            vfio-pci (passed through to a virtual machine) and
//	            0000:ab:00.0 bound to no driver; the driver lists only
//	            0000:18:00.0
//	pci-vfio-only pci-1-gpu with the GPU and its audio function bound to
//	            vfio-pci, and no NVIDIA driver
//
// Each function bound to a driver has the kernel's link to it
// (<function>/driver -> ../../../bus/pci/drivers/<name>): nvidia for the
// GPUs and the NVSwitch, snd_hda_intel, igb.
//
// The GPU trees also hold the driver's /proc/driver/nvidia/gpus/<address>/
// information files, with the UUIDs the CDI specs in testdata/cdi use.
// Those specs were written by NVIDIA's own generator, the code of
// `nvidia-ctk cdi generate` (tests/tools/nvcdi: pkg/nvcdi and its spec
// writer, v1.20.2, with NVML answered by go-nvml's DGX H100 mock;
// tests/tools/nvcdi/fixtures.sh regenerates them): devices named by index
// and by UUID (its default), then "all"; nvidia-4-gpus-uuid.yaml by UUID
// only; nvidia-1-gpu.json in its JSON format; nvidia-torn.yaml is
// nvidia-4-gpus.yaml cut off inside a quoted name (it does not parse),
// nvidia-unknown-version.json nvidia-1-gpu.json with cdiVersion 9.9.9 (it
// parses and does not validate); nvidia-vfio.yaml the generator's spec for
// pci-vfio, where NVML sees only 0000:18:00.0 (index 0).

var fourGPUs = []string{"0000:18:00.0", "0000:2a:00.0", "0000:ab:00.0", "0000:ba:00.0"}

func TestNvidiaGPUs(t *testing.T) {
	bound := func(driver string, addrs ...string) []PCIGPU {
		var gs []PCIGPU
		for _, a := range addrs {
			gs = append(gs, PCIGPU{Addr: a, Driver: driver})
		}
		return gs
	}
	for tree, want := range map[string][]PCIGPU{
		"pci-no-gpu": nil,
		"pci-1-gpu":  bound("nvidia", "0000:3b:00.0"),
		"pci-4-gpu":  bound("nvidia", fourGPUs...),
		"pci-vfio": {{"0000:18:00.0", "nvidia"}, {"0000:2a:00.0", "vfio-pci"},
			{"0000:ab:00.0", ""}, {"0000:ba:00.0", "vfio-pci"}},
		"pci-vfio-only": bound("vfio-pci", "0000:3b:00.0"),
		"missing":       nil, // no /sys/bus/pci at all
	} {
		got, err := NvidiaGPUs(filepath.Join("testdata/roots", tree, PCIDevicesDir))
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", tree, got, err, want)
		}
	}
	// A function whose files cannot be read is not counted.
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "0000:01:00.0"), 0o755)
	os.WriteFile(filepath.Join(dir, "0000:01:00.0", "vendor"), []byte("0x10de\n"), 0o644)
	if got, err := NvidiaGPUs(dir); err != nil || got != nil {
		t.Errorf("no class file: %q %v", got, err)
	}
	for _, tc := range []struct {
		driver string
		want   bool
	}{{"nvidia", true}, {"", true}, {"vfio-pci", false}, {"nouveau", false}} {
		if got := (PCIGPU{Addr: "0000:3b:00.0", Driver: tc.driver}).ForContainers(); got != tc.want {
			t.Errorf("driver %q: ForContainers %t, want %t", tc.driver, got, tc.want)
		}
	}
}

// gpuHost builds a host root: the PCI tree of a fixture (its /proc too, the
// driver's view, when driver is set), the activation marker when marker is
// set, and the given CDI spec files (host path: file under testdata/cdi).
func gpuHost(t *testing.T, tree string, driver, marker bool, specs map[string]string) string {
	t.Helper()
	root := t.TempDir()
	fixture, _ := filepath.Abs(filepath.Join("testdata/roots", tree))
	link := func(dir string) {
		if err := os.Symlink(filepath.Join(fixture, dir), filepath.Join(root, dir)); err != nil {
			t.Fatal(err)
		}
	}
	link("sys")
	if driver {
		link("proc")
	}
	write := func(p string, b []byte) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if marker {
		write("/run/syself/gpu-activated", nil)
	}
	for p, name := range specs {
		b, err := os.ReadFile(filepath.Join("testdata/cdi", name))
		if err != nil {
			t.Fatal(err)
		}
		write(p, b)
	}
	return root
}

func probeGPU(t *testing.T, root string, mutate func(*config.GpuActivationFailed)) Result {
	t.Helper()
	env := testEnv(t, func(c *config.Config) {
		c.HostRoot = root
		if mutate != nil {
			mutate(&c.Checks.GpuActivationFailed)
		}
	})
	env.GPU = true
	c, err := NewForTest("GpuActivationFailed", env)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Probe(context.Background())
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	return r
}

func TestGpuActivation(t *testing.T) {
	const (
		four        = "4 GPUs (0000:18:00.0, 0000:2a:00.0, 0000:ab:00.0, 0000:ba:00.0)"
		dirs        = "/etc/cdi, /var/run/cdi"
		noMarker    = " present, but the activation marker /run/syself/gpu-activated is missing (gpu-activate has not finished)"
		g0          = "0000:18:00.0 (index 0, GPU-3f1c2a8e-5b7d-4e19-a6c2-8d9e0f1a2b3c)"
		g1          = "0000:2a:00.0 (index 1, GPU-7a2e9c41-0d3b-4f58-b1e7-2c6d8a9f0e14)"
		g2          = "0000:ab:00.0 (index 2, GPU-c4d81f26-93ab-4e07-8f5c-6b1a2d3e4f50)"
		g3          = "0000:ba:00.0 (index 3, GPU-e9b05d73-1c2f-4a86-9d4e-7f8a0b1c2d36)"
		tornErr     = `failed to load CDI Spec failed to parse CDI Spec "/etc/cdi/nvidia.yaml": failed to unmarshal CDI Spec: yaml: line 46: found unexpected end of stream`
		nvidiaYAML  = "/var/run/cdi/nvidia.yaml"
		vfioLeftOut = "0000:2a:00.0 bound to vfio-pci, 0000:ba:00.0 bound to vfio-pci, left out"
	)
	conflict := func(dev string) string {
		return `conflicting device "nvidia.com/gpu=` + dev + `" (specs "/var/run/cdi/nvidia.yaml", "/var/run/cdi/nvidia-copy.yaml")`
	}
	for _, tc := range []struct {
		name           string
		tree           string
		driver, marker bool
		specs          map[string]string
		mutate         func(*config.GpuActivationFailed)
		status         report.Status
		reason         report.Reason
		msg            string
	}{
		{name: "no GPU, a non-NVIDIA display device", tree: "pci-no-gpu", marker: true,
			status: report.StatusUnknown, reason: report.ReasonNothingToCheck,
			msg: "no NVIDIA GPU (PCI vendor 0x10de, class 0x0300 or 0x0302) under /sys/bus/pci/devices"},
		{name: "1 GPU activated, JSON spec", tree: "pci-1-gpu", driver: true, marker: true,
			specs:  map[string]string{"/var/run/cdi/nvidia.json": "nvidia-1-gpu.json"},
			status: report.StatusFalse, reason: report.ReasonGpuActivated,
			msg: "GPU 0000:3b:00.0 activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.json"},
		{name: "1 GPU, spec but no marker", tree: "pci-1-gpu", driver: true,
			specs:  map[string]string{"/var/run/cdi/nvidia.json": "nvidia-1-gpu.json"},
			status: report.StatusTrue, reason: report.ReasonActivationMarkerMissing,
			msg: "GPU 0000:3b:00.0" + noMarker},
		{name: "4 GPUs activated, YAML spec", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-4-gpus.yaml"},
			status: report.StatusFalse, reason: report.ReasonGpuActivated,
			msg: four + " activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.yaml"},
		{name: "4 GPUs, no marker, no spec", tree: "pci-4-gpu", driver: true,
			status: report.StatusTrue, reason: report.ReasonActivationMarkerMissing,
			msg: four + noMarker + "; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for " + strings.Join([]string{g0, g1, g2, g3}, ", ")},
		{name: "4 GPUs, marker, no spec", tree: "pci-4-gpu", driver: true, marker: true,
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: four + " present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for " + strings.Join([]string{g0, g1, g2, g3}, ", ")},
		{name: "4 GPUs, spec names 2", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-2-of-4-gpus.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: four + " present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for " + g2 + ", " + g3},
		{name: "4 GPUs, the spec does not parse", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{"/etc/cdi/nvidia.yaml": "nvidia-torn.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: four + " present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for " + strings.Join([]string{g0, g1, g2, g3}, ", ") + "; " + tornErr},
		{name: "4 GPUs, a torn spec beside a good one", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{"/etc/cdi/nvidia.yaml": "nvidia-torn.yaml", nvidiaYAML: "nvidia-4-gpus.yaml"},
			status: report.StatusFalse, reason: report.ReasonGpuActivated,
			msg: four + " activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.yaml; other CDI specs left out: " + tornErr},
		{name: "1 GPU, the spec does not validate", tree: "pci-1-gpu", driver: true, marker: true,
			specs:  map[string]string{"/etc/cdi/nvidia.json": "nvidia-unknown-version.json"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: "GPU 0000:3b:00.0 present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:3b:00.0 (index 0, GPU-5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f); " +
				`/etc/cdi/nvidia.json: failed to load CDI Spec invalid CDI Spec: invalid version "9.9.9"`},
		{name: "4 GPUs named by UUID only, driver loaded", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-4-gpus-uuid.yaml"},
			status: report.StatusFalse, reason: report.ReasonGpuActivated,
			msg: four + " activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.yaml"},
		{name: "4 GPUs named by UUID only, no driver to say which", tree: "pci-4-gpu", marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-4-gpus-uuid.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: four + " present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:18:00.0 (index 0), 0000:2a:00.0 (index 1), 0000:ab:00.0 (index 2), 0000:ba:00.0 (index 3)"},
		{name: "two specs in one directory name the same devices", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-4-gpus.yaml", "/var/run/cdi/nvidia-copy.yaml": "nvidia-2-of-4-gpus.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: four + " present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for " + strings.Join([]string{g0, g1}, ", ") + "; " +
				conflict("0") + "; " + conflict("1") + "; " + conflict("GPU-3f1c2a8e-5b7d-4e19-a6c2-8d9e0f1a2b3c") + "; " +
				conflict("GPU-7a2e9c41-0d3b-4f58-b1e7-2c6d8a9f0e14") + "; " + conflict("all")},
		{name: "the later directory wins, both name the GPUs", tree: "pci-4-gpu", driver: true, marker: true,
			specs:  map[string]string{"/etc/cdi/nvidia.yaml": "nvidia-2-of-4-gpus.yaml", nvidiaYAML: "nvidia-4-gpus.yaml"},
			status: report.StatusFalse, reason: report.ReasonGpuActivated,
			msg: four + " activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.yaml"},
		{name: "another kind configured", tree: "pci-1-gpu", driver: true, marker: true,
			specs:  map[string]string{"/var/run/cdi/nvidia.json": "nvidia-1-gpu.json"},
			mutate: func(k *config.GpuActivationFailed) { k.CDIKind = "example.com/gpu" },
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: "GPU 0000:3b:00.0 present; no CDI spec under " + dirs + " names a device of kind example.com/gpu for 0000:3b:00.0 (index 0, GPU-5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f)"},
		{name: "all GPUs bound to vfio-pci", tree: "pci-vfio-only", marker: true,
			status: report.StatusUnknown, reason: report.ReasonNothingToCheck,
			msg: "no NVIDIA GPU for containers under /sys/bus/pci/devices: 0000:3b:00.0 bound to vfio-pci, left out"},
		// The GPUs that count are the one bound to nvidia and the unbound
		// one. NVML sees only the first, its index 0, and the generator's
		// spec names it alone (nvidia-vfio.yaml: "0", its UUID, "all"): the
		// unbound one is not activated. Before, it was numbered too (0, and
		// the working GPU 1), and a spec naming "0" and "1" said both were.
		{name: "2 of 4 GPUs bound to vfio-pci, one unbound, the generator's spec", tree: "pci-vfio", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-vfio.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: "2 GPUs (0000:18:00.0, 0000:ab:00.0) present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:ab:00.0 (no driver bound); " + vfioLeftOut},
		{name: "2 of 4 GPUs bound to vfio-pci, one unbound, a spec naming index 1", tree: "pci-vfio", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-2-of-4-gpus.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: "2 GPUs (0000:18:00.0, 0000:ab:00.0) present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:ab:00.0 (no driver bound); " + vfioLeftOut},
		{name: "2 of 4 GPUs bound to vfio-pci, one unbound, no marker, no spec", tree: "pci-vfio", driver: true,
			status: report.StatusTrue, reason: report.ReasonActivationMarkerMissing,
			msg: "2 GPUs (0000:18:00.0, 0000:ab:00.0)" + noMarker + "; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for " + g0 + ", 0000:ab:00.0 (no driver bound); " + vfioLeftOut},
		{name: "2 of 4 GPUs bound to vfio-pci, one unbound, named by UUID only", tree: "pci-vfio", driver: true, marker: true,
			specs:  map[string]string{nvidiaYAML: "nvidia-4-gpus-uuid.yaml"},
			status: report.StatusTrue, reason: report.ReasonCDISpecMissing,
			msg: "2 GPUs (0000:18:00.0, 0000:ab:00.0) present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:ab:00.0 (no driver bound); " + vfioLeftOut},
		{name: "other paths configured", tree: "pci-1-gpu", marker: false,
			specs: map[string]string{"/opt/cdi/nvidia.json": "nvidia-1-gpu.json", "/run/gpu/done": "nvidia-1-gpu.json"},
			mutate: func(k *config.GpuActivationFailed) {
				k.MarkerPath, k.CDISpecDirs = "/run/gpu/done", []string{"/opt/cdi"}
			},
			status: report.StatusFalse, reason: report.ReasonGpuActivated,
			msg: "GPU 0000:3b:00.0 activated: marker /run/gpu/done present, each named by a device of kind nvidia.com/gpu in /opt/cdi/nvidia.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := gpuHost(t, tc.tree, tc.driver, tc.marker, tc.specs)
			r := probeGPU(t, root, tc.mutate)
			if r.Status != tc.status || r.Reason != tc.reason || r.Message != tc.msg {
				t.Errorf("got %s/%s\n%s\nwant %s/%s\n%s", r.Status, r.Reason, r.Message, tc.status, tc.reason, tc.msg)
			}
		})
	}
}

// unboundGPUHost builds a host root by hand: NVIDIA GPUs at the given PCI
// addresses, those in bound bound to nvidia with the driver's information
// file (the one of pci-1-gpu's GPU, its UUID that of nvidia-1-gpu.json), the
// others bound to no driver; the activation marker and the generator's spec
// for that one GPU (nvidia-1-gpu.json) in /var/run/cdi.
func unboundGPUHost(t *testing.T, addrs []string, bound string) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, a := range addrs {
		write(filepath.Join(PCIDevicesDir, a, "vendor"), "0x10de\n")
		write(filepath.Join(PCIDevicesDir, a, "class"), "0x030000\n")
		if a != bound {
			continue
		}
		if err := os.MkdirAll(filepath.Join(root, "sys/bus/pci/drivers/nvidia"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("../../../bus/pci/drivers/nvidia", filepath.Join(root, PCIDevicesDir, a, "driver")); err != nil {
			t.Fatal(err)
		}
		write("/proc/driver/nvidia/gpus/"+a+"/information", read("testdata/roots/pci-1-gpu/proc/driver/nvidia/gpus/0000:3b:00.0/information"))
	}
	write("/run/syself/gpu-activated", "")
	write("/var/run/cdi/nvidia.json", read("testdata/cdi/nvidia-1-gpu.json"))
	return root
}

// A GPU bound to no driver is not activated, whatever the marker and the
// specs say: NVML, and so the generator, number only the GPUs bound to
// nvidia, so an index in a spec is never the unbound GPU's.
func TestGpuActivationUnboundGPU(t *testing.T) {
	const dirs = "/etc/cdi, /var/run/cdi"
	for _, tc := range []struct {
		name   string
		addrs  []string
		bound  string
		reason report.Reason
		msg    string
	}{
		// The driver failed to bind the GPU at the lower address: the
		// generator's spec names the working one "0", by its UUID, and
		// "all". Before, the unbound GPU took index 0, and the check said
		// both were activated.
		{name: "an unbound GPU below a working one", addrs: []string{"0000:0a:00.0", "0000:3b:00.0"}, bound: "0000:3b:00.0",
			reason: report.ReasonCDISpecMissing,
			msg:    "2 GPUs (0000:0a:00.0, 0000:3b:00.0) present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:0a:00.0 (no driver bound)"},
		// The driver unloaded after gpu-activate: the marker and the spec
		// in /run stay, the GPU has no driver.
		{name: "the driver unloaded after activation", addrs: []string{"0000:3b:00.0"},
			reason: report.ReasonCDISpecMissing,
			msg:    "GPU 0000:3b:00.0 present; no CDI spec under " + dirs + " names a device of kind nvidia.com/gpu for 0000:3b:00.0 (no driver bound)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := probeGPU(t, unboundGPUHost(t, tc.addrs, tc.bound), nil)
			if r.Status != report.StatusTrue || r.Reason != tc.reason || r.Message != tc.msg {
				t.Errorf("got %s/%s\n%s\nwant %s/%s\n%s", r.Status, r.Reason, r.Message, report.StatusTrue, tc.reason, tc.msg)
			}
		})
	}
	// The control: the same GPU bound to nvidia is activated.
	r := probeGPU(t, unboundGPUHost(t, []string{"0000:3b:00.0"}, "0000:3b:00.0"), nil)
	if r.Status != report.StatusFalse {
		t.Errorf("the GPU bound to nvidia: %s/%s %s", r.Status, r.Reason, r.Message)
	}
}

func TestParseDriverUUID(t *testing.T) {
	b, err := os.ReadFile("testdata/roots/pci-1-gpu/proc/driver/nvidia/gpus/0000:3b:00.0/information")
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		string(b):                            "GPU-5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f",
		"GPU UUID: \t ??\n":                  "", // an older driver that cannot read it
		"GPU UUID: \t GPU-\n":                "",
		"Model: \t\t GPU UUID: GPU-1\n":      "",
		"GPU UUID:GPU-1 2\n":                 "",
		"IRQ: 1\nGPU UUID: \t GPU-ab-12\r\n": "GPU-ab-12",
	} {
		if got := parseDriverUUID(in); got != want {
			t.Errorf("parseDriverUUID(%q) = %q, want %q", in, got, want)
		}
	}
}

// The CDI loader, fed any bytes as a spec file: no panic, and what it
// finds is either a device of the kind or an error naming the file.
func FuzzCDISpec(f *testing.F) {
	for _, name := range []string{"nvidia-1-gpu.json", "nvidia-4-gpus.yaml", "nvidia-2-of-4-gpus.yaml", "nvidia-4-gpus-uuid.yaml", "nvidia-torn.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata/cdi", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{}}]}`))
	f.Add([]byte("cdiVersion: 9.9.9\nkind: nvidia.com/gpu\ndevices: []\n"))
	f.Add([]byte("kind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n      fileMode: 0777\n"))
	root := f.TempDir()
	dir := filepath.Join(root, "etc/cdi")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	c := &gpuActivationCheck{env: &Env{Config: &config.Config{HostRoot: root}}, dirs: []string{"/etc/cdi"}, kind: "nvidia.com/gpu"}
	f.Fuzz(func(t *testing.T, spec []byte) {
		if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), spec, 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := c.loadCDI()
		if err != nil {
			// Only a spec the CDI loader panics on is refused so.
			if !strings.HasPrefix(err.Error(), "CDI spec /etc/cdi/nvidia.yaml: the CDI loader panics reading it") {
				t.Fatalf("loading a readable directory: %v", err)
			}
			return
		}
		if len(d.byName) > 0 && len(d.errs) > 0 {
			t.Fatalf("one spec both loaded (%v) and failed: %q", d.byName, d.errs)
		}
		for name, p := range d.byName {
			if p != "/etc/cdi/nvidia.yaml" || name == "" {
				t.Fatalf("device %q from %q", name, p)
			}
		}
		for _, e := range d.errs {
			if !strings.Contains(e, "/etc/cdi/nvidia.yaml") {
				t.Fatalf("error without the spec's host path: %s", e)
			}
		}
	})
}

func FuzzDriverUUID(f *testing.F) {
	f.Add("Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-3f1c2a8e-5b7d-4e19-a6c2-8d9e0f1a2b3c\nBus Location: \t 0000:18:00.0\n")
	f.Add("GPU UUID: \t ??\n")
	f.Fuzz(func(t *testing.T, info string) {
		u := parseDriverUUID(info)
		if u != "" && (!strings.HasPrefix(u, "GPU-") || len(u) <= 4 || strings.ContainsAny(u, " \t\r\n")) {
			t.Fatalf("parseDriverUUID(%q) = %q", info, u)
		}
	})
}

// A CDI spec directory entry that is not a regular file (a FIFO), or a spec
// larger than maxCDISpec, is an error (Unknown) naming it, without reading
// it: the CDI cache reads every *.json and *.yaml whole, and its read of a
// FIFO waits for a writer (the run abandoned at its timeout, and every
// later run finding it still running).
func TestGpuActivationSpecNotReadable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		make    func(t *testing.T, p string)
		wantErr string
	}{
		{"a FIFO", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "CDI spec /var/run/cdi/zz.yaml: not a regular file (p---------)"},
		{"larger than the bound", func(t *testing.T, p string) {
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(maxCDISpec + 1); err != nil {
				t.Fatal(err)
			}
		}, "CDI spec /var/run/cdi/zz.yaml: larger than 8388608 bytes, the most read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := gpuHost(t, "pci-1-gpu", true, true, map[string]string{"/var/run/cdi/nvidia.json": "nvidia-1-gpu.json"})
			p := filepath.Join(root, "/var/run/cdi/zz.yaml")
			tc.make(t, p)
			env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
			env.GPU = true
			c, err := NewForTest("GpuActivationFailed", env)
			if err != nil {
				t.Fatal(err)
			}
			if err := probeFIFO(t, c, p); err == nil || err.Error() != tc.wantErr {
				t.Errorf("probe: %v; want %q", err, tc.wantErr)
			}
		})
	}
}

// The daemon starts early in the boot, before gpu-activate has loaded the
// driver and written the CDI spec and the marker (the marker is on /run, gone
// at every boot). Until activation has been seen complete once in this boot,
// within gpuBootGrace of the boot, a missing marker or CDI spec is Unknown,
// NoData, not True: before, every boot of every GPU node set
// GpuActivationFailed (an event, a write of the Node, and its alert's for:
// started) until gpu-activate finished. After the grace the same is True;
// once activation was seen complete in this boot, a marker or spec that goes
// missing is True at once, also for the next daemon of the same boot (the
// state file), and a new boot starts over.
func TestGpuActivationBootGrace(t *testing.T) {
	const spec = "/var/run/cdi/nvidia.json"
	root := gpuHost(t, "pci-1-gpu", true, false, nil)
	state := filepath.Join(t.TempDir(), "state.json")
	sys := &fakeSys{up: 40 * time.Second}
	newCheck := func(s *report.Store) Check {
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.GPU = true
		env.Sys = sys
		if s != nil {
			env.Memos = s
		}
		c, err := NewForTest("GpuActivationFailed", env)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	expect := func(c Check, when string, status report.Status, reason report.Reason, msgParts ...string) {
		t.Helper()
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != status || r.Reason != reason {
			t.Errorf("%s: %+v %v, want %s %s", when, r, err, status, reason)
		}
		for _, p := range msgParts {
			if !strings.Contains(r.Message, p) {
				t.Errorf("%s: message %q lacks %q", when, r.Message, p)
			}
		}
	}
	write := func(p string, b []byte) {
		t.Helper()
		mkdir(t, filepath.Dir(filepath.Join(root, p)))
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(p string) {
		t.Helper()
		if err := os.Remove(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	specBytes, err := os.ReadFile("testdata/cdi/nvidia-1-gpu.json")
	if err != nil {
		t.Fatal(err)
	}
	const notYet = "GPU activation has not finished yet in this boot"
	s1 := report.NewStore("boot-1")
	c := newCheck(s1)
	expect(c, "neither marker nor spec 40 s after the boot", report.StatusUnknown, report.ReasonNoData,
		notYet, "the activation marker /run/syself/gpu-activated is missing", "it is a problem from 10m after the boot")
	write("/run/syself/gpu-activated", nil)
	expect(c, "the marker but no spec yet, 40 s after the boot", report.StatusUnknown, report.ReasonNoData,
		notYet, "no CDI spec under /etc/cdi, /var/run/cdi")
	sys.up = gpuBootGrace - time.Second
	expect(c, "the same just before the grace's end", report.StatusUnknown, report.ReasonNoData, notYet)
	sys.up = gpuBootGrace
	expect(c, "the same at the grace's end", report.StatusTrue, report.ReasonCDISpecMissing)
	remove("/run/syself/gpu-activated")
	expect(c, "no marker at the grace's end", report.StatusTrue, report.ReasonActivationMarkerMissing)
	sys.up = 90 * time.Second
	write("/run/syself/gpu-activated", nil)
	write(spec, specBytes)
	expect(c, "activated", report.StatusFalse, report.ReasonGpuActivated)
	remove(spec)
	expect(c, "the spec gone after activation in this boot", report.StatusTrue, report.ReasonCDISpecMissing)
	remove("/run/syself/gpu-activated")
	expect(c, "the marker gone too", report.StatusTrue, report.ReasonActivationMarkerMissing)
	if err := s1.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}
	// The daemon restarts within the boot: activation was seen complete in it.
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s2), "the next daemon of the boot", report.StatusTrue, report.ReasonActivationMarkerMissing)
	// A new boot starts over.
	s3 := report.NewStore("boot-2")
	if _, err := s3.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s3), "a new boot", report.StatusUnknown, report.ReasonNoData, notYet)
	// The one-shot check (no state) judges by the boot's age alone.
	expect(newCheck(nil), "the one-shot check 90 s after the boot", report.StatusUnknown, report.ReasonNoData, notYet)
	sys.up = 0 // a day
	expect(newCheck(nil), "the one-shot check a day after the boot", report.StatusTrue, report.ReasonActivationMarkerMissing)
}
