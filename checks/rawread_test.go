package checks

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/testenv"
)

// The periodic reads of sysfs and procfs files on this host make no
// epoll_ctl(2) (rawsys.ReadPseudoFile): os.ReadFile registered each file
// with the runtime's poller (an add and a delete; a sysfs attribute,
// pollable and ready, woke the thread waiting there), 2 files a PCI
// function every minute; DiskUsageHigh's read of /proc/self/mountinfo is an
// ordinary unix.Open and unix.Read, which os is not. os.ReadDir's open of a directory makes none (os
// does not register a directory).
func TestPeriodicPseudoFileReadsMakeNoEpollCtl(t *testing.T) {
	env := testEnv(t, nil) // host root /
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	target, linked := filepath.Join(dir, "data", "kubelet"), filepath.Join(dir, "kubelet")
	if err := os.MkdirAll(filepath.Join(target, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, linked); err != nil {
		t.Fatal(err)
	}
	reads := map[string]func() error{
		"NvidiaGPUs": func() error { _, err := NvidiaGPUs("/sys/bus/pci/devices"); return err },
		"lvmVolumes": func() error { _, err := lvmVolumes("/sys/block"); return err },
		"BootTime":   func() error { _, err := env.BootTime(); return err },
		// DiskUsageHigh's mount table, every run.
		"mountinfo": func() error { _, err := readMountinfo(env.Path(mountinfoPath)); return err },
		// DiskUsageHigh's lookup of the pod volume directories' links, every
		// run while mount_points_exclude is the default.
		// A kubelet directory linked to a data disk's, as operators move it.
		"pod volume dirs": func() error {
			if got := hostio.HostMountPath("/", linked+"/pods"); got != target+"/pods" {
				return fmt.Errorf("HostMountPath(%s/pods) = %s, want %s/pods", linked, got, target)
			}
			return nil
		},
	}
	ctrls, _ := filepath.Glob("/sys/class/nvme/nvme*")
	for _, c := range ctrls {
		reads["fabrics "+filepath.Base(c)] = func() error { realNVMe{env: env}.fabrics(filepath.Base(c)); return nil }
	}
	pci, _ := filepath.Glob("/sys/bus/pci/devices/*/vendor")
	t.Logf("%d PCI functions, %d NVMe controllers here", len(pci), len(ctrls))
	for name, read := range reads {
		var err error
		_, epoll := testenv.ThreadSyscalls(t, func() { err = read() })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if epoll != 0 {
			t.Errorf("%s: %d epoll_ctl, want none: a file read by os", name, epoll)
		}
	}
}
