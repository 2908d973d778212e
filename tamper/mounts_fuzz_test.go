package tamper

import (
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/hostio"
	"golang.org/x/sys/unix"
)

// FuzzMountWatcherRead holds MountWatcher.read (its prefilter and its
// field splitting without strings.Fields) to a plain reading of the same
// table: the same relevant mounts, whatever the bytes (escaped names, long
// lines, a table larger than its buffer, a last line cut mid-way), and no
// panic. The plain reading takes a mount point that is relevant by its name
// or through a link on the way to a pattern (throughLink, with the ways
// of the same reading), so it holds whatever links this machine's /etc
// has (before, a seed skipped where a pattern's directory is a link, and
// failed under CI=true). Root "fixture" is a tree with links in a
// pattern's fixed part, at its last name and in its wildcard part, $R in the table its path:
// the links' prefilter is fuzzed on every machine.
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
		// Lines the kernel does not write, at relevant mount points:
		// skipped (before, a run of spaces was skipped over and a line
		// without "-" read up to its fifth field).
		"609  22 0:61 / /etc/kubernetes/kubelet.conf rw - tmpfs tmpfs rw\n610 22 0:62 / /etc/containerd rw\n611 22 0:63 / /etc/cni/net.d/a.conflist rw - tmpfs tmpfs rw\n",
	} {
		f.Add(s, "/")
		f.Add(s, "/host")
		f.Add(s, "fixture")
	}
	for _, s := range []string{
		"700 22 0:61 / $R/srv/kubernetes/kubelet.conf rw - tmpfs tmpfs rw\n707 22 0:68 / $R/srv/containerd/config.toml rw - tmpfs tmpfs rw\n701 22 0:62 /x $R/srv/dropins/10-kubeadm.conf rw - ext4 /dev/sda1 rw\n",
		"702 22 0:63 / $R/srv/other rw - tmpfs tmpfs rw\n703 22 0:64 / $R/srv rw - tmpfs tmpfs rw\n704 22 0:65 / $R/srv/dropins rw - tmpfs tmpfs rw",
		"705 22 0:66 / $R/srv/dropins/x\\040y.conf rw - tmpfs tmpfs rw\n706 22 0:67 / $R/etc/systemd/system/kubelet.service.d/a.conf rw - tmpfs tmpfs rw\n",
	} {
		f.Add(s, "fixture")
		f.Add(s, "/")
	}
	f.Fuzz(func(t *testing.T, table, root string) {
		if root != "/" && root != "/host" && root != "fixture" {
			return
		}
		dir := t.TempDir()
		fixture, err := filepath.EvalSymlinks(dir) // no link on the way to it: the links are the tree's
		if err != nil {
			t.Fatal(err)
		}
		fixture = filepath.Join(fixture, "root")
		if root == "fixture" {
			root = fixture
			for _, d := range []string{"/srv/containerd", "/srv/kubernetes", "/srv/dropins", "/srv/other", "/etc/systemd/system/multi-user.target.wants"} {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for link, target := range map[string]string{"/etc/kubernetes": "../srv/kubernetes", "/etc/containerd": "../srv/containerd", "/etc/systemd/system/kubelet.service.d": "../../../srv/dropins"} {
				if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
					t.Fatal(err)
				}
			}
		}
		table = strings.ReplaceAll(table, "$R", fixture)
		spec := Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf", "/etc/containerd", "/etc/cni/net.d/*.conflist", "/etc/my dir/x", `/etc/kubernetes\x`,
			"/etc/systemd/system/*.d/*.conf"}}
		p := filepath.Join(dir, "mountinfo")
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
		if root == fixture {
			linked := 0
			for _, w := range m.ways {
				if w.linked {
					linked++
				}
			}
			// /etc/containerd is a pattern's last name: the scan records
			// the link, and where it leads is no way.
			if linked != 2 {
				t.Fatalf("the fixture's two links on the way are %d ways: %+v", linked, m.ways)
			}
			for mp, want := range map[string]bool{root + "/srv/kubernetes/kubelet.conf": true, root + "/srv/dropins/10-kubeadm.conf": true,
				root + "/srv": true, root + "/srv/other": false, root + "/srv/containerd/config.toml": false} {
				if m.throughLink(mp) != want {
					t.Fatalf("throughLink(%s) = %v, want %v (ways %+v)", mp, !want, want, m.ways)
				}
			}
		}
		want := map[string]string{}
		for _, l := range strings.Split(table, "\n") {
			// A line as hostio's reader reads it (fuzzed against the
			// kernel's rules there): split at single spaces only, a
			// line the kernel does not write (an empty field, a run of
			// spaces, no "-") skipped.
			if _, err := hostio.ParseMountinfo([]byte(l)); err != nil || l == "" {
				continue
			}
			fs := strings.Split(l, " ")
			mp := path.Clean(hostio.UnescapeMountinfo(fs[4]))
			hp, ok := underRoot(root, mp)
			if !ok || !spec.Relevant(hp) {
				if !m.throughLink(mp) {
					continue
				}
				if !ok {
					hp = mp
				}
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
