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

// A kubelet run with --root-dir=/data/kubelet, no link from
// /var/lib/kubelet, mounts a pod's volume below /data/kubelet/pods:
// with kubelet_root_dir = "/data/kubelet" the monitor built from the
// daemon's options takes its read-only line for a pod's volume, the
// PodVolumeReadOnly event, ReadonlyFilesystem False; with the default
// kubelet_root_dir the same line is the node's, the condition (before the
// key, always: the configuration had no way to name the directory).
func TestPodVolumeReadOnlyUnderAConfiguredKubeletRootDir(t *testing.T) {
	const line = "EXT4-fs (rbd0): Remounting filesystem read-only"
	for _, tc := range []struct {
		name, file string
		wantDirs   []string
		wantEvent  bool
	}{
		{"kubelet_root_dir /data/kubelet", `kubelet_root_dir = "/data/kubelet"`, []string{"/data/kubelet/pods", "/data/kubelet/plugins"}, true},
		{"default", ``, kmsg.DefaultPodVolumeDirs, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range []string{"var/lib/kubelet", "data/kubelet/pods", "data/kubelet/plugins", "sys/class/block/rbd0", "proc/self"} {
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
			cfg, err := config.Parse("config.toml", []byte(tc.file), config.Default())
			if err != nil {
				t.Fatal(err)
			}
			cfg.HostRoot = root
			store := report.NewStore("b")
			ko, err := KmsgOptions(cfg, &checks.Env{Config: cfg}, store, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ko.PodVolumeDirs, tc.wantDirs) {
				t.Errorf("PodVolumeDirs %q, want %q", ko.PodVolumeDirs, tc.wantDirs)
			}
			var evs []report.Event
			store.Observe(eventsTo{&evs})
			mon := kmsg.NewMonitor(ko)
			now := time.Now()
			mon.Start(now, now)
			mon.CaughtUp(0, now)
			mon.Handle(kmsg.Record{Level: 3, Usec: kmsg.MonotonicNow(), Message: []byte(line)}, now)
			c, _ := store.Get("ReadonlyFilesystem")
			if tc.wantEvent {
				if c.Status != report.StatusFalse {
					t.Errorf("ReadonlyFilesystem %+v, want False: rbd0 is a pod's volume below kubelet_root_dir", c)
				}
				if len(evs) != 1 || evs[0].Reason != report.EventPodVolumeReadOnly || !strings.Contains(evs[0].Message, mount+"; a pod's volume") {
					t.Errorf("events %+v, want one PodVolumeReadOnly naming %s", evs, mount)
				}
				return
			}
			if c.Status != report.StatusTrue {
				t.Errorf("ReadonlyFilesystem %+v, want True: /data/kubelet is not the kubelet's by default", c)
			}
			for _, ev := range evs {
				if ev.Reason == report.EventPodVolumeReadOnly {
					t.Errorf("event %+v, want none PodVolumeReadOnly", ev)
				}
			}
		})
	}
}
