//go:build integration

package tests

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tests/harness"
)

// The kubelet moved to a data disk by a link, on the real kernel: a real
// ext4 on a loop device stands for the node's data disk, mounted at
// <dir>/data, kubelet_root_dir is <dir>/var/lib/kubelet, a link to
// <dir>/data/kubelet, and a pod's volume, another real ext4 filled to its
// last block, is mounted below the link's target
// (<dir>/data/kubelet/pods/<uid>/volumes/kubernetes.io~csi/<pvc>/mount),
// which the kernel writes in /proc/self/mountinfo as it resolves it. The
// check, at host_root "/" with the default mount_points_exclude derived
// from kubelet_root_dir, reads the real mount table and statfs: the data
// disk is in its storage report and the pod's full volume is not. Before,
// the volume was measured (100 % used) and named in the condition's
// message. The machine's own filesystems decide the condition's status, so
// only what the report carries is asserted.
func TestDiskUsageLeavesOutAPodVolumeBelowALinkedKubeletDirOnARealLoopDevice(t *testing.T) {
	requireLoopTools(t)
	tok := harness.Token()
	dir, err := os.MkdirTemp("", "autopilot-health-dulink-"+tok+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	mountExt4Loop(t, filepath.Join(dir, "data.img"), data)
	podMount := filepath.Join(data, "kubelet", "pods", "6f1c5a8e-"+tok, "volumes", "kubernetes.io~csi", "pvc-"+tok, "mount")
	mountExt4Loop(t, filepath.Join(dir, "pod.img"), podMount)
	fill(t, filepath.Join(podMount, "fill"))
	res, got := probeDiskUsageThroughKubeletLink(t, dir, filepath.Join(data, "kubelet"), tok)
	if !strings.Contains(" "+got+" ", " "+data+" ") {
		t.Errorf("the data disk %s not measured; measured: %s", data, got)
	}
	if strings.Contains(got, podMount) || strings.Contains(res.Message, podMount) {
		t.Errorf("the pod's volume %s measured: %s; %s %q", podMount, got, res.Status, res.Message)
	}
}

// A disk for pods' emptyDirs mounted at the pods directory itself, on the
// real kernel, through the kubelet's link: a real ext4 on a loop device is
// mounted at <dir>/data/kubelet/pods, where the link
// <dir>/var/lib/kubelet -> <dir>/data/kubelet leads kubelet_root_dir's
// pods directory, and a pod's volume, another real ext4 filled to its
// last block, below it. With the default mount_points_exclude the pods
// disk is the node's, in the storage report; the pod's volume is not.
// Before, the default's pods($|/) left the pods disk out too.
func TestDiskUsageMeasuresAPodsDiskThroughALinkedKubeletDirOnARealLoopDevice(t *testing.T) {
	requireLoopTools(t)
	tok := harness.Token()
	dir, err := os.MkdirTemp("", "autopilot-health-dupods-"+tok+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	pods := filepath.Join(dir, "data", "kubelet", "pods")
	mountExt4Loop(t, filepath.Join(dir, "pods.img"), pods)
	podMount := filepath.Join(pods, "6f1c5a8e-"+tok, "volumes", "kubernetes.io~csi", "pvc-"+tok, "mount")
	mountExt4Loop(t, filepath.Join(dir, "pod.img"), podMount)
	fill(t, filepath.Join(podMount, "fill"))
	res, got := probeDiskUsageThroughKubeletLink(t, dir, filepath.Join(dir, "data", "kubelet"), tok)
	if !strings.Contains(" "+got+" ", " "+pods+" ") {
		t.Errorf("the pods disk %s not measured; measured: %s", pods, got)
	}
	if strings.Contains(got, podMount) || strings.Contains(res.Message, podMount) {
		t.Errorf("the pod's volume %s measured: %s; %s %q", podMount, got, res.Status, res.Message)
	}
}

// probeDiskUsageThroughKubeletLink links <dir>/var/lib/kubelet to target,
// names the link kubelet_root_dir, probes DiskUsageHigh once on the real
// host (host_root /, the default mount_points_exclude) and returns the
// result and the mount points it measured, space-separated.
func probeDiskUsageThroughKubeletLink(t *testing.T, dir, target, tok string) (checks.Result, string) {
	t.Helper()
	kubelet := filepath.Join(dir, "var", "lib", "kubelet")
	if err := os.MkdirAll(filepath.Dir(kubelet), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, kubelet); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("config.toml", []byte("kubelet_root_dir = \""+kubelet+"\"\n[checks.DiskUsageHigh]\nlvm_command = \"\"\n"), config.Default())
	if err != nil {
		t.Fatal(err)
	}
	env := &checks.Env{Config: cfg, NodeName: "n-" + tok, Role: report.RoleWorker,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Sys: bootedADayAgo{checks.RealSys()}, Now: time.Now}
	c, err := checks.NewForTest("DiskUsageHigh", env)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Probe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, d := range res.Details {
		if fss, ok := d.Value.([]checks.FSUsage); ok {
			for _, u := range fss {
				mps = append(mps, u.MountPoint)
			}
		}
	}
	return res, strings.Join(mps, " ")
}

// fill writes zeros to a new file at p until its filesystem has no room.
func fill(t *testing.T, p string) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for range 64 {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
	t.Fatal("16 MiB filesystem took 64 MiB")
}
