package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

// gpuAddr is the fixture GPU's PCI address.
const gpuAddr = "0000:3b:00.0"

// plugGPU puts an NVIDIA GPU (3D controller) bound to nvidia at gpuAddr
// into the PCI tree under the host root, as the kernel's sysfs lists it.
func plugGPU(t *testing.T, cfg *config.Config) {
	t.Helper()
	dev := cfg.HostPath(filepath.Join(checks.PCIDevicesDir, gpuAddr))
	writeFile(t, filepath.Join(dev, "vendor"), "0x10de\n")
	writeFile(t, filepath.Join(dev, "class"), "0x030200\n")
	if err := os.MkdirAll(cfg.HostPath("/sys/bus/pci/drivers/nvidia"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../bus/pci/drivers/nvidia", filepath.Join(dev, "driver")); err != nil {
		t.Fatal(err)
	}
}

// unplugGPU takes it out of the PCI tree: what the kernel does with a GPU
// whose link went down (pciehp, DPC), and an operator's
// `echo 1 > /sys/bus/pci/devices/<address>/remove`.
func unplugGPU(t *testing.T, cfg *config.Config) {
	t.Helper()
	if err := os.RemoveAll(cfg.HostPath(filepath.Join(checks.PCIDevicesDir, gpuAddr))); err != nil {
		t.Fatal(err)
	}
}

// gpuGoneDaemon builds a daemon (not running) that detects its node from
// the host root of cfg, with the kernel log monitor.
func gpuGoneDaemon(t *testing.T, cfg *config.Config) *Daemon {
	t.Helper()
	ln := newIdleListener()
	t.Cleanup(func() { ln.Close() })
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	// Each stands for a start of its own process, after the one before
	// ended: the state directory's lock goes with the process.
	d.unlockState()
	return d
}

// redetectNow is one round of the detect loop (redetect).
func redetectNow(d *Daemon) { d.detectOnce() }

// fallOffTheBus hands the kernel log monitor the driver's line for a GPU
// that fell off the bus.
func fallOffTheBus(d *Daemon, at time.Time) {
	d.kmsg.Handle(kmsg.Record{Level: 3, Seq: 1, Usec: 1, Message: []byte("NVRM: GPU " + gpuAddr + ": GPU has fallen off the bus.")}, at)
}

// assertStillAGPUNode fails the test unless d plans and evaluates the GPU
// conditions: GpuFallenOffBus True since fellAt, GpuActivationFailed still
// planned and not set aside as not applicable.
func assertStillAGPUNode(t *testing.T, d *Daemon, step string, fellAt time.Time) {
	t.Helper()
	if !d.currentEnv().GPU {
		t.Errorf("%s: no longer a GPU node", step)
	}
	c, ok := d.Store().Get("GpuFallenOffBus")
	if !ok || c.Status != report.StatusTrue || c.Reason != report.ReasonGpuFellOffBus || !c.LastTransitionTime.Equal(fellAt) {
		t.Errorf("%s: GpuFallenOffBus %+v (in the store: %v); want True, %s, since %v", step, c, ok, report.ReasonGpuFellOffBus, fellAt)
	}
	if !slices.Contains(KmsgExternal(d.kmsg), "GpuFallenOffBus") {
		t.Errorf("%s: the kernel log monitor no longer evaluates GpuFallenOffBus", step)
	}
	if !slices.Contains(d.currentRunner().Checks(), "GpuActivationFailed") {
		t.Errorf("%s: GpuActivationFailed no longer planned: %v", step, d.currentRunner().Checks())
	}
	if c, ok := d.Store().Get("GpuActivationFailed"); ok && c.Reason == report.ReasonNotApplicable {
		t.Errorf("%s: GpuActivationFailed set aside: %+v", step, c)
	}
}

// A GPU that falls off the bus can leave the PCI bus too (the kernel
// removes a device whose link went down; an operator's remove in sysfs):
// the node stays a GPU node until the next boot, so GpuFallenOffBus stays
// True since the kernel's line and GpuActivationFailed stays planned, at
// the detect loop's next round and at a restart of the daemon within the
// boot. Before, the re-detection made it a node without a GPU: the GPU
// conditions were set aside Unknown / NotApplicable (GpuActivationFailed)
// and dropped from the state at the next start (GpuFallenOffBus, the
// alert): the failure hid itself. A new boot detects afresh, and
// `gpu = "false"` wins over what was seen.
func TestGPUGoneFromPCIStaysAGPUNodeForTheBoot(t *testing.T) {
	cfg := testConfig(t)
	cfg.GPU = "auto"
	cfg.Kmsg.Enabled = true
	// Started without a GPU on PCI; the GPU appears later (a GPU added
	// after the start makes a GPU node).
	d := gpuGoneDaemon(t, cfg)
	if d.currentEnv().GPU {
		t.Fatal("a GPU node without a GPU on PCI")
	}
	plugGPU(t, cfg)
	redetectNow(d)
	if !d.currentEnv().GPU {
		t.Fatal("the GPU added after the start: not a GPU node")
	}
	now := time.Now()
	d.kmsg.Start(now, now.Add(-time.Hour))
	d.kmsg.CaughtUp(1, now)
	fellAt := now.Add(time.Second)
	fallOffTheBus(d, fellAt)
	// GpuActivationFailed as its last run left it.
	d.Store().Set(report.Condition{Type: "GpuActivationFailed", Status: report.StatusFalse, Reason: report.ReasonGpuActivated,
		Message: "GPU " + gpuAddr + " activated"}, now)
	assertStillAGPUNode(t, d, "the GPU fell off the bus", fellAt)

	unplugGPU(t, cfg)
	redetectNow(d)
	assertStillAGPUNode(t, d, "the GPU gone from PCI, re-detected", fellAt)
	redetectNow(d)
	assertStillAGPUNode(t, d, "the next round", fellAt)
	if err := d.Store().Save(cfg.StateDir, time.Now()); err != nil {
		t.Fatal(err)
	}

	// The daemon restarts within the boot, the GPU still gone.
	d2 := gpuGoneDaemon(t, cfg)
	assertStillAGPUNode(t, d2, "a restart within the boot", fellAt)
	redetectNow(d2)
	assertStillAGPUNode(t, d2, "a restart within the boot, re-detected", fellAt)
	if err := d2.Store().Save(cfg.StateDir, time.Now()); err != nil {
		t.Fatal(err)
	}

	// `gpu = "false"` wins over what was seen.
	off := *cfg
	off.GPU = "false"
	d3 := gpuGoneDaemon(t, &off)
	if d3.currentEnv().GPU {
		t.Error(`gpu = "false": a GPU node`)
	}
	// Nor are the GPU conditions carried over there, the GPUs seen in this
	// boot notwithstanding (README, "Reporting to Kubernetes": not carried
	// over).
	for _, ct := range []string{"GpuFallenOffBus", "GpuActivationFailed"} {
		if c, ok := d3.Store().Get(ct); ok {
			t.Errorf(`gpu = "false", a GPU seen in this boot: %s %+v carried over`, ct, c)
		}
	}

	// A new boot detects afresh: no GPU on PCI, no GPU node.
	writeFile(t, cfg.HostPath("/proc/sys/kernel/random/boot_id"), "7d1e2f30-0000-4000-8000-000000000002\n")
	d4 := gpuGoneDaemon(t, cfg)
	if d4.currentEnv().GPU {
		t.Error("a new boot without a GPU on PCI: still a GPU node")
	}
	if c, ok := d4.Store().Get("GpuFallenOffBus"); ok {
		t.Errorf("a new boot: GpuFallenOffBus %+v kept", c)
	}
}
