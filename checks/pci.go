package checks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// PCIDevicesDir is where the kernel lists the PCI functions, one entry per
// address (a link into /sys/devices), under the host root.
const PCIDevicesDir = "/sys/bus/pci/devices"

// The NVIDIA GPUs are the PCI functions with vendor 0x10de whose class is a
// VGA-compatible display controller (0x0300xx) or a 3D controller
// (0x0302xx, the data-centre GPUs). The same vendor's HDMI audio function
// (0x0403xx) and NVSwitch bridges (0x0680xx) are not GPUs.
const (
	nvidiaVendor   = "0x10de"
	classVGA       = "0x0300"
	class3DControl = "0x0302"
)

// NvidiaGPUs returns the PCI addresses of the NVIDIA GPUs under dir (the
// host's /sys/bus/pci/devices), sorted: the order in which the driver's
// NVML numbers them (nvidia-smi's index). A missing dir is no GPU; a
// function whose vendor or class cannot be read is not counted. This one
// scan decides both whether the node is a GPU node (gpu = "auto") and
// which GPUs GpuActivationFailed expects to be activated.
func NvidiaGPUs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}
	var gpus []string
	for _, e := range ents {
		vendor, err1 := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		class, err2 := os.ReadFile(filepath.Join(dir, e.Name(), "class"))
		if err1 != nil || err2 != nil {
			continue
		}
		c := strings.TrimSpace(string(class))
		if strings.TrimSpace(string(vendor)) == nvidiaVendor && len(c) == len("0x030200") &&
			(strings.HasPrefix(c, classVGA) || strings.HasPrefix(c, class3DControl)) {
			gpus = append(gpus, e.Name())
		}
	}
	slices.Sort(gpus)
	return gpus, nil
}
