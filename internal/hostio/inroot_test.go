package hostio

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// InRoot resolves a host path's links as the host does: an absolute link
// under the root, a missing tail joined to what resolves, the pseudo
// filesystems and host_root "/" as given.
func TestInRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"run/cilium", "data/kubelet/pods", "etc/kubernetes", "srv/conf", "var/lib", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"var/run":                     "/run",             // Debian, Ubuntu, Fedora
		"var/lib/kubelet":             "/data/kubelet",    // a kubelet moved to a data disk
		"etc/kubernetes/kubelet.conf": "../../srv/conf/k", // relative, climbing
		"etc/mtab":                    "../proc/self/mounts",
		"etc/up":                      "/../../../../../srv", // ".." above the root stays at it
		"dev/stdin":                   "/proc/self/fd/0",
		"sys/block":                   "/nowhere", // a fixture's link: /sys is not resolved
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "srv/conf/k"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// root given through a link of its own: the result is spelled with root as given.
	alias := filepath.Join(t.TempDir(), "host")
	if err := os.Symlink(root, alias); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ root, p, want string }{
		{"/", "/var/run/cilium/cilium.sock", "/var/run/cilium/cilium.sock"},
		{"", "/var/run/x", "/var/run/x"},
		{root, "/var/run/cilium/cilium.sock", root + "/run/cilium/cilium.sock"}, // the socket not made yet
		{root, "/var/run/containerd/containerd.sock", root + "/run/containerd/containerd.sock"},
		{root, "/var/lib/kubelet/pods", root + "/data/kubelet/pods"},
		{root, "/etc/kubernetes/kubelet.conf", root + "/srv/conf/k"},
		{root, "/etc/up/conf", root + "/srv/conf"},
		{root, "/etc/cni/net.d/*.conflist", root + "/etc/cni/net.d/*.conflist"},
		{root, "/sys/block", root + "/sys/block"},
		{root, "/dev/stdin", root + "/dev/stdin"},
		{root, "/", root},
		{alias, "/var/run/cilium", alias + "/run/cilium"},
		{filepath.Join(root, "absent"), "/var/run", filepath.Join(root, "absent/var/run")},
	} {
		if got := InRoot(tc.root, tc.p); got != tc.want {
			t.Errorf("InRoot(%q, %q) = %q; want %q", tc.root, tc.p, got, tc.want)
		}
	}
}

// With host_root "/" InRoot makes no system call: nothing at all is
// allocated or asked of the kernel (the daemon's own resolution is the
// host's).
func TestInRootSlashAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = InRoot("/", "/var/run/cilium/cilium.sock") }); n != 0 {
		t.Fatalf("InRoot at / allocates %v times; want 0", n)
	}
}

// InRootNoFollow resolves the directories on the way and leaves the last
// name as it is, so that a reader refusing a link there still refuses it.
func TestInRootNoFollow(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "data/syself"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "var/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/data/syself", filepath.Join(root, "var/lib/syself")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(root, "data/syself/root-hashes")); err != nil {
		t.Fatal(err)
	}
	if got, want := InRootNoFollow(root, "/var/lib/syself/root-hashes"), root+"/data/syself/root-hashes"; got != want {
		t.Errorf("InRootNoFollow = %q; want %q", got, want)
	}
	if got := InRootNoFollow("/", "/var/lib/syself/root-hashes"); got != "/var/lib/syself/root-hashes" {
		t.Errorf("at /: %q", got)
	}
}

// MountPath is a host path as the kernel writes a mount point below it in
// the mount table: its links resolved at host_root "/" too (a kubelet
// moved to a data disk, /var/lib/kubelet -> /data/kubelet, mounts its pods'
// volumes at /data/kubelet/pods/...), and the root's own link resolved.
func TestMountPath(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "host")
	for _, d := range []string{"data/kubelet/pods", "var/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Under root: an absolute link is the host's.
	if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	// At "/": a link standing for the host's /var/lib/kubelet, to the
	// daemon's absolute path of the data disk's directory.
	if err := os.Symlink(filepath.Join(root, "data/kubelet"), filepath.Join(tmp, "kubelet")); err != nil {
		t.Fatal(err)
	}
	alias := filepath.Join(tmp, "alias")
	if err := os.Symlink(root, alias); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ root, p, want string }{
		{"/", tmp + "/kubelet/pods", root + "/data/kubelet/pods"},
		{"", tmp + "/kubelet/plugins", root + "/data/kubelet/plugins"}, // not made yet
		{"/", tmp + "/kubelet", root + "/data/kubelet"},
		{"/", "/nonexistent-autopilot/pods", "/nonexistent-autopilot/pods"},
		{root, "/var/lib/kubelet/pods", root + "/data/kubelet/pods"},
		{alias, "/var/lib/kubelet/pods", root + "/data/kubelet/pods"}, // the kernel's name of root
		{root, "/", root},
		{filepath.Join(tmp, "absent"), "/var/lib/kubelet/pods", filepath.Join(tmp, "absent/var/lib/kubelet/pods")},
	} {
		if got := MountPath(tc.root, tc.p); got != tc.want {
			t.Errorf("MountPath(%q, %q) = %q; want %q", tc.root, tc.p, got, tc.want)
		}
	}
}

// HostMountPath is MountPath as a host path, the mount point a host's
// mount table read under root names (DiskUsageHigh's): under another root
// the host's absolute link is followed under it, and root is not written
// before it; at "/" it is MountPath.
func TestHostMountPath(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "host")
	for _, d := range []string{"data/kubelet/pods", "var/lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/data/kubelet", filepath.Join(root, "var/lib/kubelet")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "data/kubelet"), filepath.Join(tmp, "kubelet")); err != nil {
		t.Fatal(err)
	}
	alias := filepath.Join(tmp, "alias")
	if err := os.Symlink(root, alias); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ root, p, want string }{
		{"/", tmp + "/kubelet/pods", root + "/data/kubelet/pods"},
		{"", tmp + "/kubelet/plugins", root + "/data/kubelet/plugins"}, // not made yet
		{root, "/var/lib/kubelet/pods", "/data/kubelet/pods"},
		{root, "/var/lib/kubelet/plugins", "/data/kubelet/plugins"}, // not made yet
		{alias, "/var/lib/kubelet/pods", "/data/kubelet/pods"},
		{root, "/srv/pods", "/srv/pods"},
		{root, "/", "/"},
		{filepath.Join(tmp, "absent"), "/var/lib/kubelet/pods", "/var/lib/kubelet/pods"},
	} {
		if got := HostMountPath(tc.root, tc.p); got != tc.want {
			t.Errorf("HostMountPath(%q, %q) = %q; want %q", tc.root, tc.p, got, tc.want)
		}
	}
}

// openat2 refused, as the shipped unit's RestrictSUIDSGID=yes refuses it
// (ENOSYS, for every openat2: seccomp cannot read its mode) and a kernel
// before 5.6 does: InRoot and MountPath resolve the same, a name at a time
// in user space. Before, they fell back to the path as given, its links
// not followed (a kubelet directory linked to a data disk was not found at
// host_root "/" under the unit: a pod volume's remount set
// ReadonlyFilesystem).
func TestInRootAndMountPathWithOpenat2Refused(t *testing.T) {
	for _, errno := range []unix.Errno{unix.ENOSYS, unix.EPERM} {
		t.Run(errno.Error(), func(t *testing.T) {
			defer func(f func(int, string, *unix.OpenHow) (int, error)) { sysOpenat2 = f }(sysOpenat2)
			calls := 0
			sysOpenat2 = func(int, string, *unix.OpenHow) (int, error) { calls++; return -1, errno }
			TestInRoot(t)
			TestMountPath(t)
			TestHostMountPath(t)
			if calls == 0 {
				t.Error("openat2 never tried")
			}
		})
	}
}

// The user-space walk stops at a loop of links, as the kernel does
// (ELOOP), and a ".." never climbs above root.
func TestWalkInRootLoopAndDotDot(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/loop", filepath.Join(root, "loop")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../a", filepath.Join(root, "a", "up")); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := walkInRoot(root, "/loop/x"); ok {
		t.Error("walkInRoot through a loop of links: ok; want not")
	}
	if in, rest, ok := walkInRoot(root, "/a/up/b"); !ok || in != "/a" || rest != "b" {
		t.Errorf("walkInRoot(/a/up/b) = %q, %q, %v; want /a, b, true", in, rest, ok)
	}
}
