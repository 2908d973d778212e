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

// What the plan leaves to the kernel log monitor (KmsgExternal, read from
// the catalog) is exactly what the monitor sets when it starts: its own
// conditions and its part of DisksFailure.
func TestKmsgExternalIsWhatTheMonitorSets(t *testing.T) {
	rs, err := kmsg.Compile(kmsg.DefaultRules, kmsg.DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	for _, gpu := range []bool{false, true} {
		store := report.NewStore("b")
		mon := kmsg.NewMonitor(kmsg.Options{Rules: rs, Store: store, GPU: gpu, IOErrorThreshold: 5, IOErrorWindow: 10 * time.Minute})
		mon.Start(time.Unix(1700000000, 0), time.Unix(1699990000, 0))
		var set []string
		for _, c := range store.All() {
			set = append(set, c.Type)
		}
		ext := KmsgExternal(mon)
		slices.Sort(ext)
		if !slices.Equal(ext, set) {
			t.Errorf("gpu=%v: KmsgExternal = %v, the monitor set %v", gpu, ext, set)
		}
		if !slices.Contains(ext, "DisksFailure") || slices.Contains(ext, "GpuFallenOffBus") != gpu {
			t.Errorf("gpu=%v: KmsgExternal = %v", gpu, ext)
		}
	}
	if KmsgExternal(nil) != nil {
		t.Error("no monitor (kmsg.enabled = false), yet external conditions")
	}
}

// The kernel log monitor reads the host under host_root: sysfs for the
// devices of disk I/O errors, /proc for the cgroup of a hung task named as
// a node daemon (a pod's own kubelet is not KernelDeadlock).
func TestKmsgOptionsReadTheHostRoot(t *testing.T) {
	cfg := config.Default()
	cfg.HostRoot = "/host"
	ko, err := KmsgOptions(cfg, &checks.Env{Config: cfg}, report.NewStore("b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ko.Sysfs != "/host/sys" || ko.Proc != "/host/proc" {
		t.Errorf("Sysfs %q, Proc %q; want /host/sys, /host/proc", ko.Sysfs, ko.Proc)
	}
}

// The kubelet's pod volume directories are looked for where the daemon's
// mount table writes them: under a host_root other than /, a
// /var/lib/kubelet the host links to /data/kubelet (a kubelet moved to a
// data disk) is <root>/data/kubelet, whose mounts the kernel writes there.
// Before, <root>/var/lib/kubelet/pods, below which no mount point lies:
// every pod volume's read-only line was ReadonlyFilesystem.
func TestPodVolumeDirsThroughKubeletsLinkUnderHostRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"var/lib", "data/kubelet/pods", "data/kubelet/plugins"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot = root
	ko, err := KmsgOptions(cfg, &checks.Env{Config: cfg}, report.NewStore("b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{root + "/data/kubelet/pods", root + "/data/kubelet/plugins"}
	if !slices.Equal(ko.PodVolumeDirs, want) {
		t.Errorf("PodVolumeDirs %q; want %q", ko.PodVolumeDirs, want)
	}
}
