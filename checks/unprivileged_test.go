package checks

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// socketDeniedChildEnv names the directory of the refused sockets in the
// child TestSocketRefusedToTheUserIsUnknown runs as another user.
const socketDeniedChildEnv = "AUTOPILOT_HEALTH_TEST_SOCKET_DENIED"

// `autopilot-health check` run without sudo (README, "Using it on a
// node") may not connect to containerd's socket or cilium-agent's
// (root's, 0660): the kernel refuses the connect with EACCES. That says
// nothing of the runtime's or the agent's health, so it is a failed run
// (Unknown, CheckFailed, naming the refusal and what to do), not True
// CRIProbeFailed / CiliumUnreachable: before, a healthy node showed two
// problems to a user without sudo, and `check` exited 1. The daemon, a
// root refused by SELinux or AppArmor, does not restart containerd for it.
func TestSocketRefusedToTheUserIsUnknown(t *testing.T) {
	if dir := os.Getenv(socketDeniedChildEnv); dir != "" {
		socketRefusedChild(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "a socket refused to another user needs root (the test runs itself as nobody)")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"containerd.sock", "cilium.sock"} {
		l, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		if err := os.Chmod(filepath.Join(dir, name), 0o660); err != nil {
			t.Fatal(err)
		}
	}
	runAsNobody(t, dir, socketDeniedChildEnv)
}

// runAsNobody runs t alone in a copy of the test binary in dir (where
// nobody may run it: go test's build directory is 0700) as nobody, with
// childEnv set to dir, and fails t unless the child's t passed.
func runAsNobody(t *testing.T, dir, childEnv string) {
	t.Helper()
	bin := filepath.Join(dir, "checks.test")
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
}

// socketRefusedChild probes the sockets in dir, which this user may not
// connect to.
func socketRefusedChild(t *testing.T, dir string) {
	if os.Geteuid() == 0 {
		t.Fatal("the child runs as root")
	}
	const hint = "permission denied (run it as root: this user may not connect to the socket, so its service's health is not known)"
	cri := filepath.Join(dir, "containerd.sock")
	env := testEnv(t, func(c *config.Config) { c.Checks.ContainerRuntimeUnhealthy.Socket = cri })
	c, _ := newContainerdCheck(env)
	defer c.(*containerdCheck).Close()
	r, err := c.Probe(context.Background())
	if err == nil || r.Status != "" || !strings.Contains(err.Error(), cri) || !strings.HasSuffix(err.Error(), hint) {
		t.Errorf("containerd's socket refused: %+v, %v; want a failed run ending %q", r, err, hint)
	}
	cil := filepath.Join(dir, "cilium.sock")
	env = testEnv(t, func(c *config.Config) { c.Checks.CNIUnhealthy.Socket = cil })
	n, _ := newCNICheck(env)
	defer n.(*cniCheck).Close()
	r, err = n.Probe(context.Background())
	if err == nil || r.Status != "" || !strings.Contains(err.Error(), cil) || !strings.HasSuffix(err.Error(), hint) {
		t.Errorf("cilium-agent's socket refused: %+v, %v; want a failed run ending %q", r, err, hint)
	}
}

// diskUsageDeniedChildEnv names the host root of the child
// TestDiskUsageFilesystemRefusedToTheUserIsNamed runs as nobody.
const diskUsageDeniedChildEnv = "AUTOPILOT_HEALTH_TEST_DISKUSAGE_DENIED"

// `check` without sudo, a filesystem mounted below a directory this user
// may not search (statfs: EACCES): DiskUsageHigh judges the filesystems it
// measured and names the other "not checked: statfs <mount>: permission
// denied", as it names a hung one (README, "Status of this build"); a
// filesystem it measured over the threshold is True all the same. Nothing
// is counted as measured that was not. (Held; the statfs is the kernel's.)
func TestDiskUsageFilesystemRefusedToTheUserIsNamed(t *testing.T) {
	if root := os.Getenv(diskUsageDeniedChildEnv); root != "" {
		if os.Geteuid() == 0 {
			t.Fatal("the child runs as root")
		}
		const notChecked = "; not checked: statfs /srv/data: permission denied"
		for _, tc := range []struct {
			pct    int
			status report.Status
			msg    string
		}{
			{99, report.StatusFalse, "1 filesystem not over 99% space and 90% inodes" + notChecked},
			// Any real filesystem is over 0 % used.
			{1, report.StatusTrue, "/ "},
		} {
			env := testEnv(t, func(c *config.Config) {
				c.HostRoot = root
				c.Checks.DiskUsageHigh.SpacePercent = tc.pct
				c.Checks.DiskUsageHigh.LVMCommand = ""
			})
			c, _ := newDiskUsageCheck(env)
			r, err := c.Probe(context.Background())
			if err != nil || r.Status != tc.status || !strings.HasPrefix(r.Message, tc.msg) || !strings.HasSuffix(r.Message, notChecked) {
				t.Errorf("space_percent %d: %+v %v, want %s %q ... %q", tc.pct, r, err, tc.status, tc.msg, notChecked)
			}
			// The storage document lists it with its error, no figures.
			det := report.NewDetails()
			det.Replace("DiskUsageHigh", r.Details)
			if d := docOf(t, det, "storage"); !strings.Contains(d, `{"mountPoint":"/srv/data","fsType":"ext4","source":"/dev/sdb1","error":"statfs: permission denied"}`) {
				t.Errorf("space_percent %d: storage document %s, want /srv/data with its error", tc.pct, d)
			}
		}
		return
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "a directory refused to another user needs root (the test runs itself as nobody)")
	}
	root := t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, root+"/proc/self/mountinfo", `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 8:17 / /srv/data rw,relatime shared:20 - ext4 /dev/sdb1 rw
`)
	for _, d := range []string{root + "/proc", root + "/proc/self"} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root+"/proc/self/mountinfo", 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(root+"/srv/data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root+"/srv", 0o700); err != nil {
		t.Fatal(err)
	}
	runAsNobody(t, root, diskUsageDeniedChildEnv)
}

// gpuSpecDeniedChildEnv names the host root of the child
// TestGpuActivationSpecRefusedToTheUserIsUnknown runs as nobody.
const gpuSpecDeniedChildEnv = "AUTOPILOT_HEALTH_TEST_GPU_SPEC_DENIED"

// `check` without sudo on a GPU node whose CDI spec is root's alone (0600):
// the spec is there, and containerd (root) reads it, so the GPU is not
// without a spec: GpuActivationFailed is Unknown, CheckFailed, naming the
// file and the refusal, as a spec directory it may not read already was.
// Before, the CDI cache's read error was one more note on a True
// CDISpecMissing, "no CDI spec ... names a device ... for 0000:3b:00.0".
func TestGpuActivationSpecRefusedToTheUserIsUnknown(t *testing.T) {
	if root := os.Getenv(gpuSpecDeniedChildEnv); root != "" {
		if os.Geteuid() == 0 {
			t.Fatal("the child runs as root")
		}
		env := testEnv(t, func(c *config.Config) { c.HostRoot = root })
		env.GPU = true
		c, err := NewForTest("GpuActivationFailed", env)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.Probe(context.Background())
		const want = "CDI spec /etc/cdi/nvidia.json: permission denied"
		if err == nil || err.Error() != want || r.Status != "" {
			t.Errorf("probe: %+v, %v; want a failed run %q", r, err, want)
		}
		return
	}
	if os.Geteuid() != 0 {
		testenv.Skip(t, "a CDI spec refused to another user needs root (the test runs itself as nobody)")
	}
	root := gpuHost(t, "pci-1-gpu", true, true, map[string]string{"/etc/cdi/nvidia.json": "nvidia-1-gpu.json"})
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "etc/cdi/nvidia.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	runAsNobody(t, root, gpuSpecDeniedChildEnv)
}
