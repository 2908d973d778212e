package checks

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/syself/autopilot-health/internal/rawsys"
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

// NvidiaDriver is the name of the NVIDIA kernel driver's PCI driver
// (/sys/bus/pci/drivers/nvidia).
const NvidiaDriver = "nvidia"

// PCIGPU is an NVIDIA GPU on PCI and the driver bound to it.
type PCIGPU struct {
	Addr string // PCI address, "0000:3b:00.0"
	// Driver is the name of the driver bound to the function (the last
	// element of the target of its "driver" link: "nvidia", "vfio-pci"),
	// "" where none is bound (or the link cannot be read).
	Driver string
}

// ForContainers says whether the GPU is meant for containers on this node:
// bound to the NVIDIA driver, or to no driver yet (the driver not loaded,
// which is what an activation failure looks like). A GPU bound to another
// driver, vfio-pci for passthrough to a virtual machine above all, is not
// for containers: the NVIDIA driver, so NVML and the CDI specs, never see
// it.
func (g PCIGPU) ForContainers() bool {
	return g.Driver == "" || g.Driver == NvidiaDriver
}

// NvidiaGPUs returns the NVIDIA GPUs under dir (the host's
// /sys/bus/pci/devices), sorted by PCI address, each with the driver bound
// to it. A missing dir is no GPU; a function whose vendor or class cannot
// be read is not counted. This one scan decides both whether the node is a
// GPU node (gpu = "auto": any of them, whatever its driver) and which GPUs
// GpuActivationFailed expects to be activated (those ForContainers).
func NvidiaGPUs(dir string) ([]PCIGPU, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing PCI devices: %w", err)
	}
	var gpus []PCIGPU
	for _, e := range ents {
		// Raw reads: 2 files a function, 100-200 functions on a GPU
		// server, every minute; by os each woke the thread waiting in
		// the runtime's poller (rawsys.ReadPseudoFile).
		vendor, err1 := rawsys.ReadPseudoFile(filepath.Join(dir, e.Name(), "vendor"), attrMax)
		class, err2 := rawsys.ReadPseudoFile(filepath.Join(dir, e.Name(), "class"), attrMax)
		if err1 != nil || err2 != nil {
			continue
		}
		c := strings.TrimSpace(string(class))
		if strings.TrimSpace(string(vendor)) != nvidiaVendor || len(c) != len("0x030200") ||
			(!strings.HasPrefix(c, classVGA) && !strings.HasPrefix(c, class3DControl)) {
			continue
		}
		g := PCIGPU{Addr: e.Name()}
		// sysfs: <function>/driver -> ../../../bus/pci/drivers/<name>,
		// absent while no driver is bound.
		if t, err := os.Readlink(filepath.Join(dir, e.Name(), "driver")); err == nil {
			g.Driver = filepath.Base(t)
		}
		gpus = append(gpus, g)
	}
	slices.SortFunc(gpus, func(a, b PCIGPU) int { return strings.Compare(a.Addr, b.Addr) })
	return gpus, nil
}

// GPUsSeenKey is the name under which the NVIDIA GPUs seen on PCI in this
// boot are kept in the state file.
const GPUsSeenKey = "gpusSeen"

// maxGPUsSeen bounds the addresses kept: far more GPUs than a host holds,
// so that a state file edited by hand cannot make the list unbounded.
const maxGPUsSeen = 256

// pciAddr is a PCI function's address as sysfs names it
// (domain:bus:device.function, "0000:3b:00.0").
var pciAddr = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)

// GPUsSeen are the PCI addresses of the NVIDIA GPUs seen on PCI in this
// boot (NvidiaGPUs, whatever the driver), kept in the state file for the
// boot (Env.Memos): a GPU that falls off the bus can leave the PCI bus too
// (the kernel removes a function whose link went down, pciehp or DPC; an
// operator's `echo 1 > /sys/bus/pci/devices/<address>/remove`), and its
// node stays a GPU node until the next boot, also across a restart of the
// daemon within the boot. A nil *GPUsSeen (the one-shot check) remembers
// nothing.
type GPUsSeen struct {
	memos Memos
	mu    sync.Mutex
	addrs []string // sorted
}

// NewGPUsSeen returns the GPUs seen in this boot as m holds them (nil:
// none; call it after the state file is loaded), and keeps them in m from
// now on. An entry that is not a PCI address is not restored.
func NewGPUsSeen(m Memos) *GPUsSeen {
	s := &GPUsSeen{memos: m}
	if m == nil {
		return s
	}
	var saved []string
	if m.Memo(GPUsSeenKey, &saved) {
		for _, a := range saved {
			if pciAddr.MatchString(a) && !slices.Contains(s.addrs, a) && len(s.addrs) < maxGPUsSeen {
				s.addrs = append(s.addrs, a)
			}
		}
		slices.Sort(s.addrs)
	}
	m.Keep(GPUsSeenKey, s.snapshot)
	return s
}

func (s *GPUsSeen) snapshot() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.addrs)
}

// Saw records the GPUs of a scan of PCI and returns those seen in this boot
// that the scan did not find, sorted, also one first seen by another scan
// after this one began: Scan is the scan that names only the GPUs gone.
func (s *GPUsSeen) Saw(found []PCIGPU) (gone []string) {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	changed := false
	for _, g := range found {
		if _, ok := slices.BinarySearch(s.addrs, g.Addr); !ok && len(s.addrs) < maxGPUsSeen {
			s.addrs = append(s.addrs, g.Addr)
			slices.Sort(s.addrs)
			changed = true
		}
	}
	for _, a := range s.addrs {
		if !slices.ContainsFunc(found, func(g PCIGPU) bool { return g.Addr == a }) {
			gone = append(gone, a)
		}
	}
	s.mu.Unlock()
	if changed && s.memos != nil {
		s.memos.Touch()
	}
	return gone
}

// Scan lists the NVIDIA GPUs under dir (NvidiaGPUs), adds them to the GPUs
// seen in this boot (Saw), and returns those seen before the scan began
// that it did not find, sorted. A GPU that another scan found meanwhile
// (the detect loop's beside a check's, a GPU added to PCI after this scan
// read the directory) is not gone: this scan says nothing of it. A scan
// that fails adds nothing. A nil *GPUsSeen (the one-shot check) scans
// only.
func (s *GPUsSeen) Scan(dir string) (found []PCIGPU, gone []string, err error) {
	before := s.All()
	found, err = NvidiaGPUs(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, a := range s.Saw(found) {
		if _, ok := slices.BinarySearch(before, a); ok {
			gone = append(gone, a)
		}
	}
	return found, gone, nil
}

// All returns the addresses of the GPUs seen in this boot, sorted.
func (s *GPUsSeen) All() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.addrs)
}

// attrMax bounds a read of a sysfs attribute: the kernel's own bound is a
// page.
const attrMax = 4096
