package tamper

import (
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/testenv"
	"golang.org/x/sys/unix"
)

// FuzzMountWatcherRead holds MountWatcher.read (its prefilter and its
// field splitting without strings.Fields) to a plain reading of the same
// table: the same relevant mounts, whatever the bytes (escaped names, long
// lines, a table larger than its buffer, a last line cut mid-way), and no
// panic.
func FuzzMountWatcherRead(f *testing.F) {
	for _, s := range []string{
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n",
		"600 22 0:52 /srv/evil /etc/kubernetes/kubelet.conf rw shared:1 - ext4 /dev/sda1 rw\n",
		"601 22 0:53 / /etc/my\\040dir rw - tmpfs tmpfs rw\n601 22 0:53 / /etc/kubernetes\\134x rw - tmpfs tmpfs rw\n",
		"602 22 0:54 / /var/lib/kubelet/pods/x/volumes rw - tmpfs tmpfs rw\n603 22 0:55 / /etc/kuber",
		"604 22 0:56 /a//deleted /etc/cni/net.d/05-cilium.conflist rw - ext4 /dev/sda1 rw\n",
		"605 22 0:57 / /etc rw - tmpfs tmpfs rw\n606 22 0:58 / /etc/containerd/conf.d rw - tmpfs tmpfs rw",
		"607 22 0:59 / /etc/kubernetes/kubelet.conf\\012x rw - tmpfs tmpfs rw\n",
		"\n\n 608  22 0:60 / /host/etc rw\n",
	} {
		f.Add(s, "/")
		f.Add(s, "/host")
	}
	f.Fuzz(func(t *testing.T, table, root string) {
		if root != "/" && root != "/host" {
			return
		}
		// The kernel writes no empty field, no run of spaces and no line
		// beginning with one (fields are single-space separated, names
		// escaped): the plain reading is the reference for such tables.
		for _, l := range strings.Split(table, "\n") {
			if strings.HasPrefix(l, " ") || strings.Contains(l, "  ") {
				return
			}
		}
		spec := Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf", "/etc/containerd", "/etc/cni/net.d/*.conflist", "/etc/my dir/x", `/etc/kubernetes\x`}}
		p := filepath.Join(t.TempDir(), "mountinfo")
		if err := os.WriteFile(p, []byte(table), 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		m := &MountWatcher{fd: fd, root: root, spec: spec}
		m.buf = make([]byte, 0, 7) // smaller than most tables: grown while read
		got, err := m.read()
		if err != nil {
			t.Fatal(err)
		}
		// The reference knows no link: it holds where no pattern's
		// directory under root is a symlink on this machine.
		for _, w := range m.ways {
			if w.linked {
				testenv.Skip(t, w.base+" leads to "+w.at+" on this machine")
			}
		}
		want := map[string]string{}
		for _, l := range strings.Split(table, "\n") {
			// Split at single spaces only: the kernel escapes space, tab,
			// newline and backslash in a name, and writes any other byte
			// (a carriage return, a vertical tab, UTF-8) as it is.
			fs := strings.Split(l, " ")
			if len(fs) < 5 || fs[4] == "" {
				continue
			}
			hp, ok := underRoot(root, path.Clean(hostio.UnescapeMountinfo(fs[4])))
			if !ok || !spec.Relevant(hp) {
				continue
			}
			want[fs[0]+" "+fs[3]+" "+fs[4]] = hp
		}
		if len(got) != len(want) {
			t.Fatalf("read %d relevant mounts %v, want %d %v", len(got), got, len(want), want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("mount %q: read %q, want %q (all: %v)", k, got[k], v, got)
			}
		}
	})
}
