package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
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
// The monitor built from the daemon's options resolves them under
// host_root at each lookup, the link made after the options were built
// included: a read-only line of a volume mounted there is a
// PodVolumeReadOnly event, ReadonlyFilesystem stays False. Before, the
// directories were resolved once, as the options were built, and a link
// made later was not followed (and at host_root "/" not at all).
func TestPodVolumeDirsThroughKubeletsLinkUnderHostRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"var/lib/kubelet/pods", "data/kubelet/pods", "data/kubelet/plugins", "sys/class/block/rbd0", "proc/self"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mount := root + "/data/kubelet/pods/6f1c5a8e/volumes/kubernetes.io~csi/pvc-2b7e41c3/mount"
	for name, text := range map[string]string{
		"sys/class/block/rbd0/dev": "252:0\n",
		"proc/self/mountinfo":      "534 22 252:0 / " + mount + " rw,relatime shared:260 - ext4 /dev/rbd0 rw\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Default()
	cfg.HostRoot = root
	store := report.NewStore("b")
	ko, err := KmsgOptions(cfg, &checks.Env{Config: cfg}, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ko.HostRoot != root || !slices.Equal(ko.PodVolumeDirs, kmsg.DefaultPodVolumeDirs) {
		t.Errorf("HostRoot %q, PodVolumeDirs %q; want %q and the defaults", ko.HostRoot, ko.PodVolumeDirs, root)
	}
	var evs []report.Event
	store.Observe(eventsTo{&evs})
	mon := kmsg.NewMonitor(ko)
	now := time.Now()
	mon.Start(now, now)
	mon.CaughtUp(0, now)
	// The kubelet moved to the data disk after the start.
	if err := os.RemoveAll(filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	line := "EXT4-fs (rbd0): Remounting filesystem read-only"
	mon.Handle(kmsg.Record{Level: 3, Usec: kmsg.MonotonicNow(), Message: []byte(line)}, now)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Errorf("ReadonlyFilesystem %+v, want False: rbd0 is a pod's volume", c)
	}
	if len(evs) != 1 || evs[0].Reason != report.EventPodVolumeReadOnly || !strings.Contains(evs[0].Message, mount+"; a pod's volume") {
		t.Errorf("events %+v, want one PodVolumeReadOnly naming %s", evs, mount)
	}
}

// eventsTo keeps the events a store emits.
type eventsTo struct{ evs *[]report.Event }

func (eventsTo) ConditionChanged(*report.Condition, report.Condition) {}
func (eventsTo) ConditionRestored(report.Condition)                   {}
func (e eventsTo) EventEmitted(ev report.Event)                       { *e.evs = append(*e.evs, ev) }
