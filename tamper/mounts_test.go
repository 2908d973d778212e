package tamper

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"golang.org/x/sys/unix"
)

// A mount over a protected file, and its unmount, are reported by their
// mount point (a host path under the root), once each; a mount elsewhere
// (a pod's volume) is not. A mount sends inotify nothing: before, a bind
// mount over a protected file waited for the interval's scan.
func TestMountWatcherReportsMountsOverProtectedPaths(t *testing.T) {
	root := tree(t, map[string]string{"/etc/kubernetes/kubelet.conf": "apiVersion: v1\n", "/srv/evil": "evil\n"})
	if err := os.MkdirAll(filepath.Join(root, "/var/lib/kubelet/pods/volume"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf"}}
	events := watchMounts(t, root, s)

	conf, vol := filepath.Join(root, "/etc/kubernetes/kubelet.conf"), filepath.Join(root, "/var/lib/kubelet/pods/volume")
	if err := unix.Mount("tmpfs", vol, "tmpfs", 0, ""); err != nil {
		testenv.Skip(t, "cannot mount a tmpfs (root in a mount namespace that allows it): "+err.Error())
	}
	mounted := map[string]bool{vol: true}
	t.Cleanup(func() { // before t.TempDir's removal, which a mount keeps busy
		for p := range mounted {
			unix.Unmount(p, unix.MNT_DETACH)
		}
	})
	if err := unix.Mount(filepath.Join(root, "/srv/evil"), conf, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounted[conf] = true
	next := func(what string) string {
		t.Helper()
		select {
		case p := <-events:
			return p
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not reported within 10s", what)
			return ""
		}
	}
	if p := next("the bind mount over the protected file"); p != "/etc/kubernetes/kubelet.conf" {
		t.Fatalf("reported %q first, want /etc/kubernetes/kubelet.conf", p)
	}
	for _, p := range []string{vol, conf} {
		if err := unix.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
		delete(mounted, p)
	}
	if p := next("its unmount"); p != "/etc/kubernetes/kubelet.conf" {
		t.Fatalf("reported %q after the unmounts, want /etc/kubernetes/kubelet.conf (the volume's mount is no protected path)", p)
	}
}

// The cost of one reading of this process's mount table with the default
// protected paths (README: measured in a mount namespace of 2,000 tmpfs
// mounts, as a node with many pods holds).
func BenchmarkMountWatcherReading(b *testing.B) {
	s := Spec{Patterns: []string{"/var/lib/kubelet/config.yaml", "/var/lib/kubelet/kubeadm-flags.env", "/etc/kubernetes/kubelet.conf",
		"/etc/kubernetes/manifests", "/etc/containerd", "/etc/cni/net.d", "/etc/systemd/system", "/var/lib/syself/sealed-os"}}
	m, err := NewMountWatcher("/", s)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(m.fd)
	for b.Loop() {
		if _, err := m.read(); err != nil {
			b.Fatal(err)
		}
	}
}

// The same with a pattern whose wildcard is not its last name (a drop-in
// directory matched by a glob): each reading also lists the directories
// the wildcard passes through, for a link there (resolveWays).
func BenchmarkMountWatcherReadingWithAWildcard(b *testing.B) {
	s := Spec{Patterns: []string{"/var/lib/kubelet/config.yaml", "/var/lib/kubelet/kubeadm-flags.env", "/etc/kubernetes/kubelet.conf",
		"/etc/kubernetes/manifests", "/etc/containerd", "/etc/cni/net.d", "/etc/systemd/system", "/var/lib/syself/sealed-os",
		"/etc/systemd/system/*.d/*.conf", "/usr/lib/systemd/system/*.d/*.conf"}}
	m, err := NewMountWatcher("/", s)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(m.fd)
	for b.Loop() {
		if _, err := m.read(); err != nil {
			b.Fatal(err)
		}
	}
}

// A watcher stopped (a reload, a re-detect, the daemon's stop) leaves no
// goroutine and no descriptor behind: twenty watchers started and stopped
// hold as many of each as before.
func TestMountWatcherStopLeavesNothing(t *testing.T) {
	s := Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf"}}
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(es)
	}
	cycle := func() {
		m, err := NewMountWatcher("/", s)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx, func(string) {}) }()
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	cycle() // the runtime's own first-use goroutines and descriptors
	g0, f0 := runtime.NumGoroutine(), fds()
	for range 20 {
		cycle()
	}
	// Run's helper goroutine ends after Run returns: awaited, not slept on.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if g, f := runtime.NumGoroutine(), fds(); g > g0 || f != f0 {
		t.Fatalf("after 20 watchers stopped: %d goroutines (before %d), %d descriptors (before %d)", g, g0, f, f0)
	}
}

// A mount over a protected path reached through a symlinked directory on
// the way (/var/lib/kubelet -> /data/kubelet) shows in the mount table
// under the link's target (/data/kubelet/config.yaml), and is reported as
// one over the protected path is, and so is its unmount; a mount elsewhere
// under the target (a pod's volume) is not. The link is relative, or
// absolute, meaning a host path under the root as the host follows it, or
// one out of the root, where the kernel follows it from this process's
// "/" (what the scan reads there), or a chain of both. Before, the mount
// was no protected path's name, and waited for the interval's scan, while
// a read through the link returned the mount's content.
func TestMountWatcherReportsMountsThroughASymlinkedDirectory(t *testing.T) {
	out := t.TempDir() // a directory out of the root, for a link that leads there
	for _, c := range []struct {
		name  string
		links map[string]string // host path -> target, under the root
		pat   string
		// make are the links' targets (paths of this process: R is the
		// root; a name ending in "/" a directory, else a file). mount
		// (over a file: a bind mount; a directory: a tmpfs) and unrelated
		// (a tmpfs) are paths of this process; want is the report.
		make                   []string
		mount, unrelated, want string
		// through, where set, is a protected host path this process
		// reads through the link (not an absolute link under a root other
		// than "/"), and seen what it reads there with the mount ("":
		// nothing, hidden by it).
		through, seen string
	}{
		{name: "relative link", links: map[string]string{"/var/lib/kubelet": "../../data/kubelet"}, pat: "/var/lib/kubelet/config.yaml",
			make: []string{"R/data/kubelet/config.yaml", "R/data/kubelet/pods/volume/"}, through: "/var/lib/kubelet/config.yaml", seen: "evil\n",
			mount: "R/var/lib/kubelet/config.yaml", unrelated: "R/data/kubelet/pods/volume", want: "/data/kubelet/config.yaml"},
		{name: "absolute link under the root", links: map[string]string{"/var/lib/kubelet": "/data/kubelet"}, pat: "/var/lib/kubelet/config.yaml",
			make:  []string{"R/data/kubelet/config.yaml", "R/data/kubelet/pods/volume/"},
			mount: "R/data/kubelet/config.yaml", unrelated: "R/data/kubelet/pods/volume", want: "/data/kubelet/config.yaml"},
		{name: "directory on the way to the target", links: map[string]string{"/var/lib/kubelet": "../../data/kubelet"}, pat: "/var/lib/kubelet/config.yaml",
			make:  []string{"R/data/kubelet/config.yaml", "R/srv/volume/"},
			mount: "R/data", unrelated: "R/srv/volume", want: "/data"},
		{name: "protected tree", links: map[string]string{"/etc/kubernetes": "../srv/kubernetes"}, pat: "/etc/kubernetes/manifests",
			make: []string{"R/srv/kubernetes/manifests/pki/ca.crt", "R/srv/kubernetes/pods/volume/"}, through: "/etc/kubernetes/manifests/pki/ca.crt",
			mount: "R/srv/kubernetes/manifests/pki", unrelated: "R/srv/kubernetes/pods/volume", want: "/srv/kubernetes/manifests/pki"},
		{name: "wildcard", links: map[string]string{"/etc/systemd": "../srv/systemd"}, pat: "/etc/systemd/system/*.d/*.conf",
			make:    []string{"R/srv/systemd/system/kubelet.service.d/10-kubeadm.conf", "R/srv/systemd/system/multi-user.target.wants/"},
			through: "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", seen: "evil\n",
			mount: "R/srv/systemd/system/kubelet.service.d/10-kubeadm.conf", unrelated: "R/srv/systemd/system/multi-user.target.wants",
			want: "/srv/systemd/system/kubelet.service.d/10-kubeadm.conf"},
		{name: "chain of links", links: map[string]string{"/etc/kubernetes": "static/kubernetes", "/etc/static": "/srv/gen-1"}, pat: "/etc/kubernetes/kubelet.conf",
			make:  []string{"R/srv/gen-1/kubernetes/kubelet.conf", "R/srv/gen-1/kubernetes/pods/volume/"},
			mount: "R/srv/gen-1/kubernetes/kubelet.conf", unrelated: "R/srv/gen-1/kubernetes/pods/volume", want: "/srv/gen-1/kubernetes/kubelet.conf"},
		{name: "absolute link out of the root", links: map[string]string{"/var/lib/kubelet": out + "/kubelet"}, pat: "/var/lib/kubelet/config.yaml",
			make: []string{out + "/kubelet/config.yaml", out + "/kubelet/pods/volume/"}, through: "/var/lib/kubelet/config.yaml", seen: "evil\n",
			mount: "R/var/lib/kubelet/config.yaml", unrelated: out + "/kubelet/pods/volume", want: out + "/kubelet/config.yaml"},
		// A link in a pattern's wildcard part: the scan's glob lists the
		// directory the match leads to, and reads the drop-in there.
		{name: "link matched by a wildcard", links: map[string]string{"/etc/systemd/system/kubelet.service.d": "../../../srv/dropins"},
			pat:     "/etc/systemd/system/*.d/*.conf",
			make:    []string{"R/srv/dropins/10-kubeadm.conf", "R/srv/other/volume/", "R/etc/systemd/system/multi-user.target.wants/"},
			through: "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", seen: "evil\n",
			mount: "R/srv/dropins/10-kubeadm.conf", unrelated: "R/srv/other/volume", want: "/srv/dropins/10-kubeadm.conf"},
		{name: "directory on the way to a wildcard link's target", links: map[string]string{"/etc/systemd/system/kubelet.service.d": "../../../srv/dropins"},
			pat:   "/etc/systemd/system/*.d/*.conf",
			make:  []string{"R/srv/dropins/10-kubeadm.conf", "R/srv/other/volume/"},
			mount: "R/srv/dropins", unrelated: "R/srv/other/volume", want: "/srv/dropins"},
		{name: "link after a wildcard", links: map[string]string{"/home/alice/.ssh": "../../data/alice-ssh"}, pat: "/home/*/.ssh/authorized_keys",
			make:    []string{"R/data/alice-ssh/authorized_keys", "R/data/alice-ssh/other/"},
			through: "/home/alice/.ssh/authorized_keys", seen: "evil\n",
			mount: "R/data/alice-ssh/authorized_keys", unrelated: "R/data/alice-ssh/other", want: "/data/alice-ssh/authorized_keys"},
		{name: "absolute link out of the root matched by a wildcard", links: map[string]string{"/etc/systemd/system/kubelet.service.d": out + "/dropins"},
			pat:     "/etc/systemd/system/*.d/*.conf",
			make:    []string{out + "/dropins/10-kubeadm.conf", out + "/dropins/volume/", "R/etc/systemd/system/"},
			through: "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", seen: "evil\n",
			mount: "R/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", unrelated: out + "/dropins/volume", want: out + "/dropins/10-kubeadm.conf"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := tree(t, map[string]string{"/srv/evil": "evil\n"})
			full := func(p string) string {
				if rest, ok := strings.CutPrefix(p, "R"); ok {
					return filepath.Join(root, rest)
				}
				return p
			}
			for _, p := range c.make {
				var err error
				if err := os.MkdirAll(filepath.Dir(full(p)), 0o755); err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(p, "/") {
					err = os.MkdirAll(full(p), 0o755)
				} else {
					err = os.WriteFile(full(p), []byte("apiVersion: v1\n"), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			for link, target := range c.links {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
					t.Fatal(err)
				}
			}
			events := watchMounts(t, root, Spec{Patterns: []string{c.pat}})
			mounted := map[string]bool{}
			t.Cleanup(func() {
				for p := range mounted {
					unix.Unmount(p, unix.MNT_DETACH)
				}
			})
			if err := unix.Mount("tmpfs", full(c.unrelated), "tmpfs", 0, ""); err != nil {
				testenv.Skip(t, "cannot mount a tmpfs (root in a mount namespace that allows it): "+err.Error())
			}
			mounted[full(c.unrelated)] = true
			over := full(c.mount)
			fi, err := os.Stat(over)
			if err != nil {
				t.Fatal(err)
			}
			if fi.IsDir() {
				err = unix.Mount("tmpfs", over, "tmpfs", 0, "")
			} else {
				err = unix.Mount(filepath.Join(root, "/srv/evil"), over, "", unix.MS_BIND, "")
			}
			if err != nil {
				t.Fatal(err)
			}
			mounted[over] = true
			if c.through != "" {
				b, err := os.ReadFile(filepath.Join(root, c.through))
				if c.seen == "" && !errors.Is(err, fs.ErrNotExist) || c.seen != "" && (err != nil || string(b) != c.seen) {
					t.Fatalf("read through %s: %q, %v; want %q", c.through, b, err, c.seen)
				}
			}
			next := func(what string) string {
				t.Helper()
				select {
				case p := <-events:
					return p
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: not reported within 10s", what)
					return ""
				}
			}
			if p := next("the mount over " + c.mount); p != c.want {
				t.Fatalf("reported %q first, want %q (the unrelated mount is no protected path)", p, c.want)
			}
			for _, p := range []string{full(c.unrelated), over} {
				if err := unix.Unmount(p, 0); err != nil {
					t.Fatal(err)
				}
				delete(mounted, p)
			}
			if p := next("its unmount"); p != c.want {
				t.Fatalf("reported %q after the unmounts, want %q (the unrelated mount is no protected path)", p, c.want)
			}
		})
	}
}

// With a root other than "/", an absolute link on the way to a protected
// path has two meanings: the kernel follows it from this process's "/"
// (out of the root), where the scan reads, and the host follows it under
// the root. The mount watcher follows both, so every mount that changes
// what the scan reads is reported: a mount over the kernel's target
// changes the scan's entry and is reported; one over the host's target
// (under the root) changes nothing the scan reads and is reported too (a
// run that finds nothing). So for a link in the fixed part and one in a
// wildcard part: no mount the scan sees waits for the interval's scan.
func TestMountWatcherAndScanAgreeOnAnAbsoluteLinkUnderARoot(t *testing.T) {
	root := tree(t, map[string]string{"/srv/evil": "evil\n", "/etc/systemd/system/multi-user.target.wants/x.service": "[Unit]\n"})
	out := t.TempDir()
	links := map[string]string{"/var/lib/kubelet": out + "/kubelet", "/etc/systemd/system/kubelet.service.d": out + "/dropins"}
	files := []string{"/kubelet/config.yaml", "/dropins/10-kubeadm.conf"}
	for _, f := range files {
		for _, p := range []string{out + f, filepath.Join(root, out+f)} { // the kernel's target, the host's
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("apiVersion: v1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for link, target := range links {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{Patterns: []string{"/var/lib/kubelet/config.yaml", "/etc/systemd/system/*.d/*.conf"}}
	scan := func() map[string]string {
		t.Helper()
		es, err := Scan(root, spec)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, e := range es {
			out[e.Path] = e.Describe()
		}
		return out
	}
	base := scan()
	for _, p := range []string{"/var/lib/kubelet/config.yaml", "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"} {
		if _, ok := base[p]; !ok {
			t.Fatalf("the scan does not read %s through its link: %v", p, base)
		}
	}
	events := watchMounts(t, root, spec)
	next := func(what string) string {
		t.Helper()
		select {
		case p := <-events:
			return p
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not reported within 10s", what)
			return ""
		}
	}
	for _, f := range files {
		for _, c := range []struct {
			over       string
			scanSeesIt bool
		}{{out + f, true}, {filepath.Join(root, out+f), false}} {
			if err := unix.Mount(filepath.Join(root, "/srv/evil"), c.over, "", unix.MS_BIND, ""); err != nil {
				testenv.Skip(t, "cannot bind mount (root in a mount namespace that allows it): "+err.Error())
			}
			t.Cleanup(func() { unix.Unmount(c.over, unix.MNT_DETACH) })
			changed := !maps.Equal(scan(), base)
			if changed != c.scanSeesIt {
				t.Errorf("a mount over %s: the scan's entries changed %v, want %v", c.over, changed, c.scanSeesIt)
			}
			if p := next("the mount over " + c.over); p != out+f {
				t.Errorf("a mount over %s reported %q, want %q", c.over, p, out+f)
			}
			if err := unix.Unmount(c.over, 0); err != nil {
				t.Fatal(err)
			}
			if p := next("the unmount of " + c.over); p != out+f {
				t.Errorf("the unmount of %s reported %q, want %q", c.over, p, out+f)
			}
		}
	}
}

// The mount watcher resolves at most MaxEntries of the paths a pattern's
// wildcard passes through in a reading, as the scan reads at most as many
// entries. A plain directory matched there is not resolved (it leads
// where its parent does) and does not count: a pattern whose wildcard
// passes through more than MaxEntries plain directories holding no
// protected file (the scan reads none of them) leaves a later pattern's
// link resolved, and a mount over its target, which the scan reads
// through the link, is reported. Before, each plain directory counted,
// the cap was hit within the first pattern, and the mount waited for the
// interval's scan.
func TestMountWatcherCapCountsOnlyTheLinksItResolves(t *testing.T) {
	root := tree(t, map[string]string{"/srv/evil": "evil\n", "/srv/dropins/10-kubeadm.conf": "[Service]\n"})
	for i := range MaxEntries + 1 {
		if err := os.MkdirAll(filepath.Join(root, "data", "d"+strconv.Itoa(i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "etc/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../srv/dropins", filepath.Join(root, "etc/systemd/system/kubelet.service.d")); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Patterns: []string{"/data/*/marker", "/etc/systemd/system/*.d/*.conf"}}
	// The scan is within its cap and reads the drop-in through the link.
	es, err := Scan(root, spec)
	if err != nil || len(es) != 1 || es[0].Path != "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf" {
		t.Fatalf("Scan: %+v, %v; want the drop-in through the link alone", es, err)
	}
	events := watchMounts(t, root, spec)
	over := filepath.Join(root, "srv/dropins/10-kubeadm.conf")
	if err := unix.Mount(filepath.Join(root, "srv/evil"), over, "", unix.MS_BIND, ""); err != nil {
		testenv.Skip(t, "cannot bind mount (root in a mount namespace that allows it): "+err.Error())
	}
	t.Cleanup(func() { unix.Unmount(over, unix.MNT_DETACH) })
	if b, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/kubelet.service.d/10-kubeadm.conf")); err != nil || string(b) != "evil\n" {
		t.Fatalf("read through the link: %q, %v", b, err)
	}
	select {
	case p := <-events:
		if p != "/srv/dropins/10-kubeadm.conf" {
			t.Fatalf("reported %q, want /srv/dropins/10-kubeadm.conf", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the mount over the link's target: not reported within 10s (the cap spent on plain directories?)")
	}
}

// Links in a pattern's wildcard part that loop (a.d -> b.d -> a.d), or
// lead to the directory itself (dot.d -> .) or its parent (up.d -> ..):
// a reading resolves each within the kernel's bound of links and returns;
// a mount over a file the scan reads through dot.d or up.d is relevant
// (through the link), as the scan reads it; the scan records the loop's
// links as unreadable (ELOOP), and reads nothing through them.
func TestMountWatcherLinkLoopsAndDotsInAWildcardPart(t *testing.T) {
	root := tree(t, map[string]string{"/etc/systemd/system/foo.conf": "", "/etc/systemd/bar.conf": "", "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf": ""})
	for link, target := range map[string]string{"a.d": "b.d", "b.d": "a.d", "dot.d": ".", "up.d": ".."} {
		if err := os.Symlink(target, filepath.Join(root, "etc/systemd/system", link)); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{Patterns: []string{"/etc/systemd/system/*.d/*.conf"}}
	es, _ := Scan(root, spec)
	var read []string
	for _, e := range es {
		read = append(read, e.Path+" "+string(e.Kind))
	}
	want := []string{"/etc/systemd/system/a.d unreadable", "/etc/systemd/system/b.d unreadable", "/etc/systemd/system/dot.d/foo.conf file",
		"/etc/systemd/system/kubelet.service.d/10-kubeadm.conf file", "/etc/systemd/system/up.d/bar.conf file"}
	if !slices.Equal(read, want) {
		t.Errorf("the scan read %q, want %q", read, want)
	}
	m, err := NewMountWatcher(root, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(m.fd)
	for _, c := range []struct {
		mp   string
		want bool
		scan string // the scan's entry that a mount there changes
	}{
		{"/etc/systemd/system/foo.conf", true, "/etc/systemd/system/dot.d/foo.conf"},
		{"/etc/systemd/bar.conf", true, "/etc/systemd/system/up.d/bar.conf"},
		{"/etc/systemd/system/kubelet.service.d/10-kubeadm.conf", true, "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"},
		{"/etc/systemd/other", false, ""},
	} {
		hp := filepath.Join(root, c.mp)
		if got := m.spec.Relevant(c.mp) || m.throughLink(hp); got != c.want {
			t.Errorf("a mount at %s: relevant %v, want %v (ways %+v)", c.mp, got, c.want, m.ways)
		}
		if c.scan != "" && !slices.ContainsFunc(read, func(s string) bool { return strings.HasPrefix(s, c.scan+" ") }) {
			t.Errorf("the scan does not read %s: %q", c.scan, read)
		}
	}
}

// A link in a pattern's wildcard part retargeted between two readings of
// the mount table (a retarget is no mount: nothing is read then) is
// resolved again at the next reading: a bind mount over a drop-in of the
// new target, which the scan reads through the link, is reported.
func TestMountWatcherFollowsAWildcardLinkRetargetedBetweenReadings(t *testing.T) {
	root := tree(t, map[string]string{"/srv/evil": "evil\n", "/srv/a/10-kubeadm.conf": "[Service]\n", "/srv/b/10-kubeadm.conf": "[Service]\n"})
	link := filepath.Join(root, "etc/systemd/system/kubelet.service.d")
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../srv/a", link); err != nil {
		t.Fatal(err)
	}
	events := watchMounts(t, root, Spec{Patterns: []string{"/etc/systemd/system/*.d/*.conf"}})
	if err := os.Symlink("../../../srv/b", link+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(link+".new", link); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(root, "srv/b/10-kubeadm.conf")
	if err := unix.Mount(filepath.Join(root, "srv/evil"), over, "", unix.MS_BIND, ""); err != nil {
		testenv.Skip(t, "cannot bind mount (root in a mount namespace that allows it): "+err.Error())
	}
	t.Cleanup(func() { unix.Unmount(over, unix.MNT_DETACH) })
	select {
	case p := <-events:
		if p != "/srv/b/10-kubeadm.conf" {
			t.Fatalf("reported %q, want /srv/b/10-kubeadm.conf", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the mount over the new target's drop-in: not reported within 10s")
	}
}

// watchMounts runs a MountWatcher of root and spec until the test ends and
// returns the paths it reports, 16 held unread at most (more wait, or are
// dropped once the test has ended).
func watchMounts(t *testing.T, root string, spec Spec) <-chan string {
	t.Helper()
	m, err := NewMountWatcher(root, spec)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.Run(ctx, func(p string) {
			select {
			case events <- p:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return events
}
