package tamper

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// tree writes files (host path -> content) under a new root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

var spec = Spec{Patterns: []string{"/var/lib/kubelet/config.yaml", "/etc/cni/net.d", "/etc/systemd/system/*.d/*.conf"}, Exclude: []string{"/etc/cni/net.d/*.bak"}}

func paths(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	return out
}

func TestScanPatternsTreesAndExcludes(t *testing.T) {
	root := tree(t, map[string]string{
		"/var/lib/kubelet/config.yaml":                  "kind: KubeletConfiguration\n",
		"/var/lib/kubelet/cpu_manager_state":            "{}",
		"/etc/cni/net.d/05-cilium.conflist":             "{}",
		"/etc/cni/net.d/10-old.conf.bak":                "{}",
		"/etc/systemd/system/kubelet.service.d/10.conf": "[Service]\n",
		"/etc/systemd/system/kubelet.service":           "[Unit]\n",
	})
	if err := os.Symlink("05-cilium.conflist", filepath.Join(root, "/etc/cni/net.d/link")); err != nil {
		t.Fatal(err)
	}
	es, err := Scan(root, spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/cni/net.d", "/etc/cni/net.d/05-cilium.conflist", "/etc/cni/net.d/link",
		"/etc/systemd/system/kubelet.service.d/10.conf", "/var/lib/kubelet/config.yaml"}
	if got := paths(es); !slices.Equal(got, want) {
		t.Fatalf("scanned %q, want %q", got, want)
	}
	link := es[2]
	if link.Kind != KindSymlink || link.Target != "05-cilium.conflist" || link.SHA256 != "" {
		t.Errorf("symlink entry %+v", link)
	}
	cfg := es[4]
	sum := sha256.Sum256([]byte("kind: KubeletConfiguration\n"))
	if cfg.Kind != KindFile || cfg.Mode != 0o644 || cfg.UID != uint32(os.Getuid()) || cfg.GID != uint32(os.Getgid()) || cfg.Size != 27 ||
		cfg.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("file entry %+v", cfg)
	}
}

func TestScanStopsAtTheCap(t *testing.T) {
	files := map[string]string{}
	for i := range 11 {
		files[fmt.Sprintf("/var/big/%d/f", i)] = ""
	}
	root := tree(t, files)
	es, err := Scan(root, Spec{Patterns: []string{"/var/big"}, MaxEntries: 20})
	var le *LimitError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "more than 20 protected paths") {
		t.Fatalf("a tree of 23 paths with a limit of 20: err %v", err)
	}
	if len(es) != 20 || !slices.IsSortedFunc(es, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) }) {
		t.Fatalf("a scan cut at 20 returned %d entries (sorted: want 20)", len(es))
	}
	if _, err := Scan(root, Spec{Patterns: []string{"/var/big"}, MaxEntries: 23}); err != nil {
		t.Fatalf("23 paths with a limit of 23: %v", err)
	}
}

// ReadBefore says of every path whether a scan cut at the cap read it, as
// the cut scan itself does, at every cap: patterns in order (a path met
// again under a later one read at the first), a tree name by name ("a"
// and what it holds before "a-b", though "/a-b" sorts before "/a/"),
// excluded trees skipped. DiffWithin reports a removal of what it read.
func TestReadBeforeIsWhatTheCutScanRead(t *testing.T) {
	root := tree(t, map[string]string{
		"/var/lib/kubelet/config.yaml": "",
		"/etc/x/a/b":                   "",
		"/etc/x/a/c/d":                 "",
		"/etc/x/a-b":                   "",
		"/etc/x/a.b/e":                 "",
		"/etc/x/skip/f":                "",
		"/etc/x/z":                     "",
		"/etc/systemd/system/kubelet.service.d/10.conf": "",
		"/etc/systemd/system/a.service.d/20.conf":       "",
		"/etc/systemd/system/a.service.d/x.txt":         "",
	})
	sp := Spec{Patterns: []string{"/var/lib/kubelet/config.yaml", "/etc/x", "/etc/systemd/system/*.d/*.conf", "/etc/x/a"},
		Exclude: []string{"/etc/x/skip"}}
	all, err := Scan(root, sp)
	if err != nil {
		t.Fatal(err)
	}
	for limit := 1; limit < len(all); limit++ {
		sp.MaxEntries = limit
		cut, err := Scan(root, sp)
		var le *LimitError
		if !errors.As(err, &le) {
			t.Fatalf("cap %d: err %v", limit, err)
		}
		read := paths(cut)
		for _, e := range all {
			if got, want := sp.ReadBefore(e.Path, le.At), slices.Contains(read, e.Path); got != want {
				t.Errorf("cap %d, cut at %s: ReadBefore(%s) = %v, the scan read it: %v", limit, le.At, e.Path, got, want)
			}
		}
		var removed []string
		for _, d := range DiffWithin(sp, le.At, all, cut) {
			removed = append(removed, d.Path)
		}
		if len(removed) != 0 {
			t.Errorf("cap %d: a cut scan of an unchanged tree reports %q removed", limit, removed)
		}
	}
}

func TestDiff(t *testing.T) {
	f := Entry{Path: "/a", Kind: KindFile, Mode: 0o644, SHA256: "x", Size: 1}
	l := Entry{Path: "/l", Kind: KindSymlink, Mode: 0o777, Target: "a"}
	base := []Entry{f, l, {Path: "/r", Kind: KindFile}}
	for _, tc := range []struct {
		name string
		cur  []Entry
		want []Difference
	}{
		{"same", base, nil},
		{"content", []Entry{{Path: "/a", Kind: KindFile, Mode: 0o644, SHA256: "y", Size: 1}, l, base[2]}, []Difference{{"/a", Modified}}},
		{"mode", []Entry{{Path: "/a", Kind: KindFile, Mode: 0o666, SHA256: "x", Size: 1}, l, base[2]}, []Difference{{"/a", Chmod}}},
		{"owner", []Entry{{Path: "/a", Kind: KindFile, Mode: 0o644, SHA256: "x", Size: 1, UID: 1000}, l, base[2]}, []Difference{{"/a", Chown}}},
		{"retarget", []Entry{f, {Path: "/l", Kind: KindSymlink, Mode: 0o777, Target: "/etc/shadow"}, base[2]}, []Difference{{"/l", Retarget}}},
		{"file to symlink", []Entry{{Path: "/a", Kind: KindSymlink, Mode: 0o644, Target: "x"}, l, base[2]}, []Difference{{"/a", Modified}}},
		{"added and removed", []Entry{f, l, {Path: "/new", Kind: KindFile}}, []Difference{{"/new", Added}, {"/r", Removed}}},
		{"all gone", nil, []Difference{{"/a", Removed}, {"/l", Removed}, {"/r", Removed}}},
	} {
		if got := Diff(base, tc.cur); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Diff = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDirsAndRelevant(t *testing.T) {
	es := []Entry{{Path: "/etc/cni/net.d", Kind: KindDir}, {Path: "/etc/cni/net.d/x", Kind: KindFile},
		{Path: "/etc/systemd/system/kubelet.service.d/10.conf", Kind: KindFile}}
	want := []string{"/etc/cni", "/etc/cni/net.d", "/etc/systemd/system", "/etc/systemd/system/kubelet.service.d", "/var/lib/kubelet"}
	if got := Dirs(spec, es); !slices.Equal(got, want) {
		t.Errorf("Dirs = %q, want %q", got, want)
	}
	for p, want := range map[string]bool{
		"/var/lib/kubelet/config.yaml":                    true,
		"/var/lib/kubelet/cpu_manager_state":              false,
		"/etc/cni/net.d/evil":                             true,
		"/etc/cni/net.d/sub/deeper":                       true,
		"/etc/systemd/system/evil.service.d":              true, // a new drop-in directory
		"/etc/systemd/system/evil.service.d/x.conf":       true,
		"/etc/systemd/system/multi-user.target.wants/foo": false,
	} {
		if got := spec.Relevant(p); got != want {
			t.Errorf("Relevant(%s) = %v, want %v", p, got, want)
		}
	}
}

// WildcardDirs: every directory a pattern's wildcard passes through, at
// each level, an empty one included, excluded ones and files not. A match
// that is a symlink to a directory is one (the scan's glob lists its
// target), relative or absolute out of the root (followed from this
// process's "/", as the glob follows it); a link to a file, or to nothing,
// is not (no directory to watch there).
func TestWildcardDirs(t *testing.T) {
	root := tree(t, map[string]string{
		"/etc/systemd/system/kubelet.service.d/10.conf": "",
		"/etc/systemd/system/not-a-dir.d":               "",
		"/etc/systemd/system/skip.d/x.conf":             "",
		"/etc/a/one/b/x.conf":                           "",
		"/etc/cni/net.d/05.conflist":                    "",
		"/srv/a-file":                                   "",
	})
	out := t.TempDir()
	for _, d := range []string{"/etc/systemd/system/empty.d", "/etc/a/two", "/srv/dropins", "/srv/b"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"/etc/systemd/system/linked.service.d":   "../../../srv/dropins",
		"/etc/systemd/system/abs.service.d":      out,
		"/etc/systemd/system/to-a-file.d":        "../../../srv/a-file",
		"/etc/systemd/system/dangling.service.d": "../../../srv/none",
		"/etc/systemd/system/skip-link.d":        "../../../srv/dropins",
		"/etc/a/three":                           "../../srv",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	sp := Spec{Patterns: []string{"/etc/systemd/system/*.d/*.conf", "/etc/a/*/b/*.conf", "/etc/cni/net.d/*.conflist", "/etc/cni/net.d"},
		Exclude: []string{"/etc/systemd/system/skip.d", "/etc/systemd/system/skip-link.d"}}
	// /etc/a/three/b is /srv/b, through the link.
	want := []string{"/etc/a/one", "/etc/a/one/b", "/etc/a/three", "/etc/a/three/b", "/etc/a/two", "/etc/systemd/system/abs.service.d",
		"/etc/systemd/system/empty.d", "/etc/systemd/system/kubelet.service.d", "/etc/systemd/system/linked.service.d"}
	if got := WildcardDirs(root, sp); !slices.Equal(got, want) {
		t.Errorf("WildcardDirs = %q, want %q", got, want)
	}
}

// Links matched by a wildcard that lead back into the directory listed
// (/d/l000 .. /d/l100 -> .) make each level as wide as the one before:
// "/d/*/*/*.conf" passes through 101 + 101*101 directories. WildcardDirs
// returns MaxEntries at most, so the watches handed to the watcher stay
// bounded however the links fan out.
func TestWildcardDirsThroughLinksStayUnderTheCap(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 101 {
		if err := os.Symlink(".", filepath.Join(root, "d", fmt.Sprintf("l%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	got := WildcardDirs(root, Spec{Patterns: []string{"/d/*/*/*.conf"}})
	if len(got) != MaxEntries {
		t.Fatalf("%d directories, want the cap, %d", len(got), MaxEntries)
	}
	if got[0] != "/d/l000" {
		t.Errorf("first %q, want /d/l000", got[0])
	}
}

func TestScanRecordsAHugeFileWithoutItsDigest(t *testing.T) {
	root := tree(t, map[string]string{"/etc/big": "small"})
	base, err := Scan(root, Spec{Patterns: []string{"/etc/big"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(root, "/etc/big"), MaxFileSize+1); err != nil { // sparse
		t.Fatal(err)
	}
	cur, err := Scan(root, Spec{Patterns: []string{"/etc/big"}})
	if err != nil {
		t.Fatalf("a file over 64 MiB: %v", err)
	}
	if len(cur) != 1 || !cur[0].TooLarge || cur[0].SHA256 != "" || cur[0].Size != MaxFileSize+1 {
		t.Fatalf("entry of a file over 64 MiB: %+v", cur)
	}
	if !strings.Contains(cur[0].Describe(), "over 67108864 bytes, not digested") {
		t.Errorf("Describe = %q", cur[0].Describe())
	}
	if got, want := Diff(base, cur), []Difference{{"/etc/big", Modified}}; !slices.Equal(got, want) {
		t.Errorf("Diff = %v, want %v", got, want)
	}
	if got, want := Diff(nil, cur), []Difference{{"/etc/big", Added}}; !slices.Equal(got, want) {
		t.Errorf("Diff from nothing = %v, want %v", got, want)
	}
}

func TestScanDoesNotBlockOnAFIFO(t *testing.T) {
	root := tree(t, map[string]string{"/etc/cni/net.d/a": "{}"})
	fifo := filepath.Join(root, "/etc/cni/net.d/fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	es, err := Scan(root, Spec{Patterns: []string{"/etc/cni/net.d"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 3 || es[2].Path != "/etc/cni/net.d/fifo" || es[2].Kind != KindOther {
		t.Fatalf("scan with a FIFO: %+v", es)
	}
	// A regular file swapped for a FIFO after the Lstat: the open neither
	// blocks nor succeeds.
	if _, err := OpenRegular(fifo); !errors.Is(err, report.ErrNotRegular) {
		t.Errorf("OpenRegular(FIFO) = %v, want not a regular file", err)
	}
	if _, err := report.ReadRegular(fifo, 100); !errors.Is(err, report.ErrNotRegular) {
		t.Errorf("ReadRegular(FIFO) = %v, want not a regular file", err)
	}
	link := filepath.Join(root, "/etc/link")
	if err := os.Symlink(filepath.Join(root, "/etc/cni/net.d/a"), link); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRegular(link); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("OpenRegular(symlink) = %v, want ELOOP (not followed)", err)
	}
}

// Under ProtectHome=yes the helper's /home, /root and /run/user are
// systemd's inaccessible directory (mountinfo's root
// /systemd/inaccessible/dir, as captured under systemd 252 in
// checks/testdata/roots/protectsystem-strict): a pattern there, glob or
// not, and such a mount inside a protected tree are unreadable entries,
// never an empty or absent path; the rest is scanned as ever. Fails when
// the scan reads the empty directories (no /home, /root/.ssh entries and
// /run/user a directory).
func TestScanRecordsWhatTheSandboxHidesAsUnreadable(t *testing.T) {
	root := tree(t, map[string]string{
		"/etc/kubernetes/kubelet.conf": "apiVersion: v1\n",
		"/run/syself/marker":           "",
		"/proc/self/mountinfo": "66 49 0:41 / / ro,relatime shared:1 - tmpfs rootfs rw\n" +
			"93 66 0:47 / /run rw,nosuid,nodev,relatime shared:10 - tmpfs tmpfs rw\n" +
			"90 66 0:47 /systemd/inaccessible/dir /home ro,nosuid,nodev,noexec,relatime shared:25 - tmpfs tmpfs rw\n" +
			"108 66 0:47 /systemd/inaccessible/dir /root ro,nosuid,nodev,noexec,relatime shared:35 - tmpfs tmpfs rw\n" +
			"110 93 0:47 /systemd/inaccessible/dir /run/user ro,nosuid,nodev,noexec,relatime shared:13 - tmpfs tmpfs rw\n",
	})
	for _, d := range []string{"/home", "/root", "/run/user"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	es, err := Scan(root, Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf", "/root/.ssh", "/home/*/.ssh/authorized_keys", "/run"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/kubernetes/kubelet.conf", "/home", "/root/.ssh", "/run", "/run/syself", "/run/syself/marker", "/run/user"}
	if got := paths(es); !slices.Equal(got, want) {
		t.Fatalf("scanned %q, want %q", got, want)
	}
	for _, e := range es {
		hidden := e.Path == "/home" || e.Path == "/root/.ssh" || e.Path == "/run/user"
		if got := e.Kind == KindUnreadable; got != hidden {
			t.Errorf("%s: %+v, unreadable %v, want %v", e.Path, e, got, hidden)
		}
	}
	if e := es[1]; !strings.HasPrefix(e.Error, "hidden by the sandbox: /home is a systemd inaccessible mount") {
		t.Errorf("why /home is unreadable: %q", e.Error)
	}
}

// PrivateTmp=yes mounts the unit's own directory over /tmp and /var/tmp
// (mountinfo's root .../systemd-private-<boot id>-<unit>-<random>/tmp, as
// captured under systemd 252 in checks/testdata/roots/protectsystem-strict):
// a pattern there is unreadable, never the unit's empty directory vouched
// for. Fails when the scan reads the private directories (no /var/tmp/app
// entry, /tmp/x absent).
func TestScanRecordsThePrivateTmpAsUnreadable(t *testing.T) {
	root := tree(t, map[string]string{
		"/etc/kubernetes/kubelet.conf": "apiVersion: v1\n",
		"/proc/self/mountinfo": "66 49 0:41 / / ro,relatime shared:1 - tmpfs rootfs rw\n" +
			"115 66 0:48 /systemd-private-1b2d41f34baf442b83032cf8f130eff8-capture.service-rYSQ13/tmp /tmp rw,nosuid,nodev,relatime shared:16 - tmpfs tmpfs rw\n" +
			"117 66 7:0 /tmp/systemd-private-1b2d41f34baf442b83032cf8f130eff8-capture.service-upwdDh/tmp /var/tmp rw,noatime shared:20 - ext4 /dev/loop0 rw\n" +
			"118 66 7:0 /srv/tmp /srv/tmp rw,noatime shared:21 - ext4 /dev/loop0 rw\n",
	})
	for _, d := range []string{"/tmp", "/var/tmp", "/srv/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	es, err := Scan(root, Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf", "/var/tmp/app", "/tmp/x", "/srv/tmp"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/kubernetes/kubelet.conf", "/srv/tmp", "/tmp/x", "/var/tmp/app"}
	if got := paths(es); !slices.Equal(got, want) {
		t.Fatalf("scanned %q, want %q", got, want)
	}
	for _, e := range es {
		hidden := e.Path == "/tmp/x" || e.Path == "/var/tmp/app"
		if got := e.Kind == KindUnreadable; got != hidden {
			t.Errorf("%s: %+v, unreadable %v, want %v", e.Path, e, got, hidden)
		}
	}
	if e := es[3]; e.Error != "hidden by the sandbox: /var/tmp is the unit's private /var/tmp in this mount namespace, as PrivateTmp= makes" {
		t.Errorf("why /var/tmp/app is unreadable: %q", e.Error)
	}
}

// A pattern whose wildcard reaches into a mount the sandbox hides
// ("/*/.ssh/authorized_keys": /root's and every home's, the hidden /home
// and /root among them) matches nothing there: the hidden mount it passes
// through is unreadable, not absent, as for a pattern under it.
func TestScanRecordsAHiddenMountAWildcardReaches(t *testing.T) {
	root := tree(t, map[string]string{
		"/srv/.ssh/authorized_keys": "ssh-ed25519 AAAA\n",
		"/proc/self/mountinfo": "66 49 0:41 / / ro,relatime shared:1 - tmpfs rootfs rw\n" +
			"93 66 0:47 / /run rw,nosuid,nodev,relatime shared:10 - tmpfs tmpfs rw\n" +
			"90 66 0:47 /systemd/inaccessible/dir /home ro,nosuid,nodev,noexec,relatime shared:25 - tmpfs tmpfs rw\n" +
			"108 66 0:47 /systemd/inaccessible/dir /root ro,nosuid,nodev,noexec,relatime shared:35 - tmpfs tmpfs rw\n" +
			"110 93 0:47 /systemd/inaccessible/dir /run/user ro,nosuid,nodev,noexec,relatime shared:13 - tmpfs tmpfs rw\n",
	})
	for _, d := range []string{"/home", "/root", "/run/user"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	es, err := Scan(root, Spec{Patterns: []string{"/*/.ssh/authorized_keys"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/home", "/root", "/srv/.ssh/authorized_keys"}
	if got := paths(es); !slices.Equal(got, want) {
		t.Fatalf("scanned %q, want %q", got, want)
	}
	for _, e := range es {
		if hidden := e.Path != "/srv/.ssh/authorized_keys"; (e.Kind == KindUnreadable) != hidden {
			t.Errorf("%s: %+v, want unreadable %v", e.Path, e, hidden)
		}
	}
}

// A protected path the scan cannot reach for another reason than that it is
// not there (EACCES: a directory on the way it may not search, or a glob's
// directory it may not list; ELOOP: a symlink loop on the way) is an
// unreadable entry with the error, never an absent path: absent, a file
// that is there would be reported removed (a finding that stays until a
// clear), and at the baseline a tree nobody read would be vouched for.
// filepath.Glob, which the scan used, reads every such error as "no
// match". A path that names nothing (ENOENT; ENOTDIR: a component on the
// way is a file) is absent, as before. The scan runs without the DAC
// capabilities (testenv.Unprivileged), as a daemon without them, or the
// one-shot check run by another user, reads the host.
func TestScanTellsAPathItCannotReachFromOneThatIsNotThere(t *testing.T) {
	root := tree(t, map[string]string{
		"/etc/kubernetes/kubelet.conf":        "apiVersion: v1\n",
		"/etc/cni/net.d/05-cilium.conflist":   "{}\n",
		"/var/lib/kubelet.real/config.yaml":   "kind: KubeletConfiguration\n",
		"/etc/containerd/config.toml":         "",
		"/etc/systemd/system/kubelet.service": "",
	})
	// The fixture's own directories are searchable by anyone, as /etc is.
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for d, mode := range map[string]os.FileMode{"/etc/kubernetes": 0, "/etc/cni/net.d": 0o300} {
		if err := os.Chmod(filepath.Join(root, d), mode); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(filepath.Join(root, d), 0o755) })
	}
	for link, target := range map[string]string{"/var/lib/kubelet": "kubelet", "/opt/loop": "loop"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{Patterns: []string{
		"/etc/kubernetes/kubelet.conf",                 // EACCES on the way
		"/etc/cni/net.d/*.conflist",                    // its directory not listable
		"/var/lib/kubelet/config.yaml",                 // ELOOP on the way
		"/opt/loop/*.conf",                             // the glob's directory a loop
		"/etc/containerd/config.toml/x",                // ENOTDIR: not there
		"/etc/systemd/system/kubelet.service.d/*.conf", // ENOENT: not there
		"/etc/systemd/system/kubelet.service",          // read
	}}
	var es []Entry
	var err error
	testenv.Unprivileged(t, func() { es, err = Scan(root, spec) })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/etc/kubernetes/kubelet.conf": "lstat: permission denied",
		"/etc/cni/net.d":               "open: permission denied",
		"/var/lib/kubelet/config.yaml": "lstat: too many levels of symbolic links",
		"/opt/loop":                    "stat: too many levels of symbolic links",
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Path)
		if e.Path == "/etc/systemd/system/kubelet.service" {
			if e.Kind != KindFile {
				t.Errorf("%s: %+v, want the file read", e.Path, e)
			}
			continue
		}
		if why, ok := want[e.Path]; !ok || e.Kind != KindUnreadable || e.Error != why {
			t.Errorf("%s: %+v, want unreadable: %q", e.Path, e, why)
		}
	}
	if wantPaths := []string{"/etc/cni/net.d", "/etc/kubernetes/kubelet.conf", "/etc/systemd/system/kubelet.service", "/opt/loop", "/var/lib/kubelet/config.yaml"}; !slices.Equal(got, wantPaths) {
		t.Fatalf("scanned %q, want %q", got, wantPaths)
	}
}
