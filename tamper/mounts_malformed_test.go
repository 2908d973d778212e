package tamper

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A line of the mount table the kernel does not write, whose mount point
// may be relevant, is skipped and counted (Malformed), the first named by
// its number; the good lines around it are still read, and a reading
// without it counts none.
func TestMountWatcherCountsMalformedLines(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"/etc/kubernetes", "/etc/cni/net.d"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	good := "21 1 8:1 / " + root + "/etc/kubernetes rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
	bad := "22 1 8:2 / " + root + "/etc/cni/net.d rw,relatime shared:2 ext4 /dev/sda2 rw\n" // no "-"
	other := "23 1 8:3 / /srv/elsewhere rw shared:3 ext4 /dev/sda3 rw\n"                    // malformed, but not relevant: not split
	after := "24 1 8:4 / " + root + "/etc/cni/net.d rw,relatime shared:4 - ext4 /dev/sda4 rw\n"
	p := filepath.Join(t.TempDir(), "mountinfo")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1 0 8:0 / / rw - ext4 /dev/root rw\n" + good + bad + other + after)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	m := &MountWatcher{fd: fd, root: root, spec: Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf", "/etc/cni/net.d/*.conflist"}}}
	got, err := m.read()
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, hp := range got {
		points = append(points, hp)
	}
	if slices.Sort(points); strings.Join(points, ",") != "/etc/cni/net.d,/etc/kubernetes" {
		t.Fatalf("relevant mounts %v, want /etc/kubernetes and the good /etc/cni/net.d", points)
	}
	n, first := m.Malformed()
	if n != 1 || first == nil || first.Line != 3 || first.Text != strings.TrimSuffix(bad, "\n") {
		t.Fatalf("Malformed() = %d, %v; want 1, line 3 %q", n, first, bad)
	}
	write("1 0 8:0 / / rw - ext4 /dev/root rw\n" + good)
	if _, err := m.read(); err != nil {
		t.Fatal(err)
	}
	if n, first := m.Malformed(); n != 0 || first != nil {
		t.Fatalf("Malformed() after a clean reading = %d, %v; want 0, nil", n, first)
	}
}
