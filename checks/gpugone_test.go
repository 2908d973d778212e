package checks

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// A GPU seen on PCI earlier in this boot and gone from it since (fallen off
// the bus, the kernel's removal of a function whose link went down, an
// operator's remove in sysfs) is not left out silently: GpuActivationFailed
// is Unknown, GpuGoneFromPCI, naming it, where it would otherwise be False
// (the GPUs still there activated) or Unknown, NothingToCheck (none left);
// a True of the GPUs still there stays True and names it too. Kept across a
// restart of the daemon within the boot; a new boot, and the one-shot check
// (no state), judge by what is on PCI. Before, the check said
// NothingToCheck once the only GPU was gone, and GpuActivated once the one
// GPU that was not activated was gone.
func TestGpuActivationGPUGoneFromPCI(t *testing.T) {
	const (
		dirs      = "/etc/cdi, /var/run/cdi"
		working   = "0000:3b:00.0"
		unbound   = "0000:5e:00.0"
		activated = "GPU 0000:3b:00.0 activated: marker /run/syself/gpu-activated present, each named by a device of kind nvidia.com/gpu in /var/run/cdi/nvidia.json"
	)
	gone := func(addrs string) string {
		return "NVIDIA GPU at PCI " + addrs + " seen in this boot, gone from /sys/bus/pci/devices since (fallen off the bus, its link down, or removed): its activation cannot be checked"
	}
	// A GPU bound to nvidia and activated, and one bound to no driver
	// (never activated), as unboundGPUHost lays them out.
	root := unboundGPUHost(t, []string{working, unbound}, working)
	state := filepath.Join(t.TempDir(), "state.json")
	newCheck := func(m Memos) Check {
		t.Helper()
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.GPU = true
		if m != nil {
			env.Memos = m
			env.GPUsSeen = NewGPUsSeen(m)
		}
		c, err := NewForTest("GpuActivationFailed", env)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	expect := func(c Check, when string, status report.Status, reason report.Reason, msg string) {
		t.Helper()
		r, err := c.Probe(context.Background())
		if err != nil || r.Status != status || r.Reason != reason || r.Message != msg {
			t.Errorf("%s: got %s/%s %v\n%s\nwant %s/%s\n%s", when, r.Status, r.Reason, err, r.Message, status, reason, msg)
		}
	}
	unplug := func(addr string) {
		t.Helper()
		if err := os.RemoveAll(filepath.Join(root, PCIDevicesDir, addr)); err != nil {
			t.Fatal(err)
		}
	}

	s1 := report.NewStore("boot-1")
	c := newCheck(s1)
	expect(c, "both GPUs on PCI", report.StatusTrue, report.ReasonCDISpecMissing,
		"2 GPUs (0000:3b:00.0, 0000:5e:00.0) present; no CDI spec under "+dirs+" names a device of kind nvidia.com/gpu for 0000:5e:00.0 (no driver bound)")
	unplug(unbound)
	expect(c, "the GPU that was not activated gone", report.StatusUnknown, report.ReasonGpuGoneFromPCI,
		gone(unbound)+"; "+activated)
	// The GPU bound to nvidia loses its driver (no spec names it now): a
	// True of the GPUs still there stays True, and names the one gone.
	if err := os.Remove(filepath.Join(root, PCIDevicesDir, working, "driver")); err != nil {
		t.Fatal(err)
	}
	expect(c, "the GPU still there not activated", report.StatusTrue, report.ReasonCDISpecMissing,
		"GPU 0000:3b:00.0 present; no CDI spec under "+dirs+" names a device of kind nvidia.com/gpu for 0000:3b:00.0 (no driver bound); "+gone(unbound))
	unplug(working)
	expect(c, "no GPU left on PCI", report.StatusUnknown, report.ReasonGpuGoneFromPCI, gone(working+", "+unbound))
	if err := s1.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}

	// The daemon restarts within the boot: the GPUs seen are kept.
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s2), "the next daemon of the boot", report.StatusUnknown, report.ReasonGpuGoneFromPCI, gone(working+", "+unbound))
	// A new boot, and the one-shot check, judge by what is on PCI.
	const nothing = "no NVIDIA GPU (PCI vendor 0x10de, class 0x0300 or 0x0302) under /sys/bus/pci/devices"
	s3 := report.NewStore("boot-2")
	if _, err := s3.Load(state); err != nil {
		t.Fatal(err)
	}
	expect(newCheck(s3), "a new boot", report.StatusUnknown, report.ReasonNothingToCheck, nothing)
	expect(newCheck(nil), "the one-shot check", report.StatusUnknown, report.ReasonNothingToCheck, nothing)
}

// The GPUs seen read back from a state file edited by hand: what is not a
// PCI address is not restored.
func TestGPUsSeenRestoresPCIAddressesOnly(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	s := report.NewStore("boot-1")
	s.Keep(GPUsSeenKey, func() any {
		return []string{"0000:3b:00.0", "../../etc", "0000:3b:00.0", "", "10000:01:1f.7", "0000:3B:00.0", strings.Repeat("0", 4096)}
	})
	if err := s.Save(state, time.Now()); err != nil {
		t.Fatal(err)
	}
	s2 := report.NewStore("boot-1")
	if _, err := s2.Load(state); err != nil {
		t.Fatal(err)
	}
	if got := NewGPUsSeen(s2).All(); strings.Join(got, " ") != "0000:3b:00.0 10000:01:1f.7" {
		t.Errorf("restored %q", got)
	}
}
