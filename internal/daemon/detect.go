package daemon

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// Identity is who this node is, and where each answer came from.
type Identity struct {
	NodeName       string
	NodeNameSource string
	Role           report.Role
	RoleSource     string
	GPU            bool
	GPUSource      string
	BootID         string
}

// Detect works out the node's name, role and GPU presence from the host
// (under cfg.HostRoot), unless the configuration sets them.
func Detect(cfg *config.Config) (Identity, error) {
	id := Identity{}
	switch {
	case cfg.NodeName != "":
		id.NodeName, id.NodeNameSource = cfg.NodeName, "config node_name"
	default:
		if n, err := nodeNameFromCert(cfg.HostRoot, cfg.Detect.KubeletClientCert); err == nil {
			id.NodeName, id.NodeNameSource = n, "kubelet client certificate "+cfg.Detect.KubeletClientCert
		} else if h, err := readTrim(cfg.HostPath("/proc/sys/kernel/hostname")); err == nil && h != "" {
			id.NodeName, id.NodeNameSource = strings.ToLower(h), "kernel hostname"
		} else if h, err := os.Hostname(); err == nil {
			id.NodeName, id.NodeNameSource = strings.ToLower(h), "hostname"
		} else {
			return id, fmt.Errorf("cannot detect the node name; set node_name in the configuration: %w", err)
		}
	}
	id.Role, id.RoleSource, id.GPU, id.GPUSource = DetectRoleGPU(cfg, nil)
	b, err := readTrim(cfg.HostPath("/proc/sys/kernel/random/boot_id"))
	if err != nil {
		return id, fmt.Errorf("cannot read the boot id: %w", err)
	}
	id.BootID = b
	return id, nil
}

// DetectRoleGPU works out the node's role and whether it has an NVIDIA GPU
// (each unless the configuration fixes it), and where each answer came
// from. Both can change while the daemon runs: on a first boot the
// kube-apiserver manifest appears after the daemon starts, and a GPU may be
// added or activated later. seen (nil: none) are the GPUs seen on PCI in
// this boot: the scan's GPUs are added to them, and a node seen with a GPU
// in this boot stays a GPU node until the next boot, its GPUs gone from PCI
// or not (a GPU that fell off the bus can leave it).
func DetectRoleGPU(cfg *config.Config, seen *checks.GPUsSeen) (role report.Role, roleSource string, gpu bool, gpuSource string) {
	switch {
	case cfg.Role != "":
		role, roleSource = report.Role(cfg.Role), "config role"
	default:
		if _, err := os.Stat(cfg.HostPath(cfg.Detect.ControlPlaneManifest)); err == nil {
			role, roleSource = report.RoleControlPlane, cfg.Detect.ControlPlaneManifest+" present"
		} else {
			role, roleSource = report.RoleWorker, cfg.Detect.ControlPlaneManifest+" absent"
		}
	}
	gpu, gpuSource, _ = detectGPU(cfg, seen)
	return role, roleSource, gpu, gpuSource
}

// gpuFixed says whether the configuration fixes the node's GPU presence
// (gpu = "true" or "false"), so that it is not detected.
func gpuFixed(cfg *config.Config) bool { return cfg.GPU == "true" || cfg.GPU == "false" }

// detectGPU is DetectRoleGPU's GPU part, and the GPUs on PCI it found.
func detectGPU(cfg *config.Config, seen *checks.GPUsSeen) (gpu bool, gpuSource string, found []checks.PCIGPU) {
	if gpuFixed(cfg) {
		return cfg.GPU == "true", "config gpu", nil
	}
	// Every NVIDIA GPU makes a GPU node, also one bound to vfio-pci for
	// a virtual machine: the node has the GPU. GpuActivationFailed
	// leaves such a GPU out (Unknown where it leaves out all of them).
	found, gone, err := seen.Scan(cfg.HostPath(checks.PCIDevicesDir))
	gpu = len(found) > 0
	switch {
	case err != nil:
		gpuSource = "no PCI devices readable: " + err.Error()
	case gpu:
		at := make([]string, len(found))
		for i, g := range found {
			at[i] = g.Addr
			if !g.ForContainers() {
				at[i] += " (bound to " + g.Driver + ")"
			}
		}
		gpuSource = "NVIDIA GPU at PCI " + strings.Join(at, ", ")
	default:
		gpuSource = "no NVIDIA GPU on PCI"
	}
	if err == nil {
		// A scan that failed says nothing of which GPUs are there.
		if len(gone) > 0 {
			gpu = true
			gpuSource += "; " + goneText(gone)
		}
	} else if all := seen.All(); len(all) > 0 {
		gpu = true
		gpuSource += "; NVIDIA GPU at PCI " + strings.Join(all, ", ") + " seen in this boot"
	}
	return gpu, gpuSource, found
}

// goneText says which GPUs seen in this boot are gone from PCI.
func goneText(gone []string) string {
	return "NVIDIA GPU at PCI " + strings.Join(gone, ", ") + " seen in this boot, gone from PCI since (a GPU node until the next boot)"
}

func readTrim(p string) (string, error) {
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}

// nodeNameFromCert returns <name> of the certificate in a PEM file whose
// subject CN is system:node:<name> (the kubelet's client certificate): the
// host path path under the host root root, its links resolved under the
// root (kubelet's kubelet-client-current.pem is an absolute link to the
// dated file).
func nodeNameFromCert(root, path string) (string, error) {
	c, err := checks.LeafCertificate(root, path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	n, ok := strings.CutPrefix(c.Subject.CommonName, "system:node:")
	if !ok || n == "" {
		return "", fmt.Errorf("%s: CN %q is not system:node:<name>", path, c.Subject.CommonName)
	}
	return n, nil
}

// BootStart returns the wall time at which this boot began
// (CLOCK_BOOTTIME, which also counts time suspended).
func BootStart() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}
