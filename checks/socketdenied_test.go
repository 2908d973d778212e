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
	// The test binary, where nobody may run it (go test's build
	// directory is 0700).
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
	cmd.Env = append(os.Environ(), socketDeniedChildEnv+"="+dir)
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
