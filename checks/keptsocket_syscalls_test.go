package checks

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The probe of a service whose socket is not there (cilium-agent's on a
// node without it, the CNI check every 30 s) stats the path, finds nothing
// and connects (refused), with no resolution of the path's links
// (rawsys.InMemory's EvalSymlinks: an lstat a component and a readlink a
// link, 4 newfstatat and a readlinkat for /var/run/cilium/cilium.sock on
// the idle benchmark's node), which only a kept connection needs. Once the
// socket is there, the dial keeps it as before: the usual stat through a
// link, the same socket.
func TestKeptSocketDialOfAnAbsentSocketResolvesNoLinks(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "varrun")
	if err := os.Symlink("run", link); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(link, "cilium", "cilium.sock")
	k := &keptSocket{path: sock}
	k.dial(context.Background(), "", "") // the first use of the dialer's code
	var err error
	all, _ := testenv.FewestThreadSyscalls(t, func() { _, err = k.dial(context.Background(), "", "") })
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the dial of an absent socket: %v, want no such file", err)
	}
	t.Logf("a dial of an absent socket through a link: %d system calls", all)
	// newfstatat, socket, connect, close (4), and a runtime call or two of
	// the thread's own at times; the links' resolution added an lstat a
	// component of the path up to the missing one and a readlinkat: 11
	// under the test's directory.
	if all > 7 {
		t.Errorf("the dial of an absent socket made %d system calls, want at most 7 (4 its own): the path's links resolved for nothing", all)
	}
	if err := os.Mkdir(filepath.Join(dir, "run", "cilium"), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "run", "cilium", "cilium.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := k.dial(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if k.raw || !k.same() {
		t.Errorf("the socket made, through the link: raw %v, same %v; want the usual stat, the same socket", k.raw, k.same())
	}
}
