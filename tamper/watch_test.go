package tamper

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestWatcherFollowsAReplacedDirectory: after a watched directory is removed
// and created again (or renamed away), its dead watch is dropped, a Gone
// event says so, and the next Set watches the new directory, where a new
// file is seen.
func TestWatcherFollowsAReplacedDirectory(t *testing.T) {
	for _, replace := range []struct {
		name string
		do   func(dir string) error
	}{
		{"rm -rf and mkdir", func(dir string) error {
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
			return os.Mkdir(dir, 0o755)
		}},
		{"rename away and mkdir", func(dir string) error {
			if err := os.Rename(dir, dir+".old"); err != nil {
				return err
			}
			return os.Mkdir(dir, 0o755)
		}},
	} {
		t.Run(replace.name, func(t *testing.T) {
			root := tree(t, map[string]string{"/etc/cni/net.d/05-cilium.conflist": "{}"})
			w, err := NewWatcher(root)
			if err != nil {
				t.Fatal(err)
			}
			if _, failed := w.Set([]string{"/etc/cni/net.d"}); len(failed) > 0 {
				t.Fatalf("Set failed for %q", failed)
			}
			events := make(chan Event, 64)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx, func(ev Event) { events <- ev }) }()
			defer func() { cancel(); <-done }()

			dir := filepath.Join(root, "/etc/cni/net.d")
			if err := replace.do(dir); err != nil {
				t.Fatal(err)
			}
			await(t, events, Event{Path: "/etc/cni/net.d", Gone: true})
			w.mu.Lock()
			_, still := w.dir["/etc/cni/net.d"]
			w.mu.Unlock()
			if still {
				t.Fatal("the dead watch is still in the maps")
			}
			if _, failed := w.Set([]string{"/etc/cni/net.d"}); len(failed) > 0 {
				t.Fatalf("Set failed for %q", failed)
			}
			if err := os.WriteFile(filepath.Join(dir, "00-evil.conflist"), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
			await(t, events, Event{Path: "/etc/cni/net.d/00-evil.conflist"})
		})
	}
}

func await(t *testing.T, events <-chan Event, want Event) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev == want {
				return
			}
		case <-deadline:
			t.Fatalf("no event %+v within 10s", want)
		}
	}
}

// Set reports the directories it watches anew, and only those: the check
// runs once more after a Set that added one (what was written there before
// its watch), and that run's Set of the same directories adds none, so the
// two never wake each other in a loop. A directory it cannot watch is not
// added.
func TestWatcherSetReportsOnlyNewWatches(t *testing.T) {
	root := tree(t, map[string]string{"/etc/cni/net.d/05-cilium.conflist": "{}", "/etc/containerd/config.toml": ""})
	w, err := NewWatcher(root)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dirs := []string{"/etc/cni/net.d", "/etc/containerd/conf.d"} // conf.d does not exist: watched through /etc/containerd
	if added, failed := w.Set(dirs); !slices.Equal(added, []string{"/etc/cni/net.d", "/etc/containerd"}) || len(failed) > 0 {
		t.Fatalf("first Set: added %q, failed %q", added, failed)
	}
	if added, failed := w.Set(dirs); len(added) > 0 || len(failed) > 0 {
		t.Fatalf("the same Set again: added %q, failed %q; want nothing", added, failed)
	}
	if err := os.Mkdir(filepath.Join(root, "/etc/containerd/conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if added, _ := w.Set(dirs); !slices.Equal(added, []string{"/etc/containerd/conf.d"}) {
		t.Fatalf("after conf.d was created: added %q, want it", added)
	}
	if err := os.WriteFile(filepath.Join(root, "/etc/file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if added, failed := w.Set([]string{"/etc/file"}); len(added) > 0 || !slices.Equal(failed, []WatchFailure{{Dir: "/etc/file", Err: unix.ENOTDIR}}) {
		t.Fatalf("a file: added %q, failed %v; want it failed (ENOTDIR), not added", added, failed)
	}
}

// The directories Set cannot watch come back sorted, each with its error:
// the check logs them when they differ from the last Set's, so the same
// failures must compare equal. Before, they came in the order of a map's
// iteration, and the same failures of several directories were logged
// again at most runs.
func TestWatcherSetFailuresAreSortedWithTheirErrors(t *testing.T) {
	files := map[string]string{}
	var want []WatchFailure
	for _, f := range []string{"/etc/a", "/etc/b", "/etc/c", "/etc/d", "/etc/e"} {
		files[f] = ""
		want = append(want, WatchFailure{Dir: f, Err: unix.ENOTDIR})
	}
	root := tree(t, files)
	w, err := NewWatcher(root)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dirs := []string{"/etc/e", "/etc/c", "/etc/a", "/etc/d", "/etc/b"}
	for i := range 20 {
		if _, failed := w.Set(dirs); !slices.Equal(failed, want) {
			t.Fatalf("Set %d: failed %v, want %v", i+1, failed, want)
		}
	}
}

// A directory under a protected wildcard that comes and goes (a pod's
// directory under /var/lib/kubelet/pods/*) costs the check one extra run
// per creation (its watch is new: Set adds it, once) and none per removal
// (the directory is no longer handed over; its parent, watched all along,
// is not added again): the directories handed over are those a run plans
// (Dirs and WildcardDirs, as NodeTampered's plan). A Set that added again
// on every run, or on the removal, would run the check in a loop or twice
// per churn.
func TestWatcherSetAddsAChurningWildcardDirectoryOncePerCreation(t *testing.T) {
	root := tree(t, map[string]string{"/var/lib/kubelet/pods/.keep": ""})
	spec := Spec{Patterns: []string{"/var/lib/kubelet/pods/*/etc-hosts"}}
	w, err := NewWatcher(root)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	plan := func() []string {
		t.Helper()
		cur, err := Scan(root, spec)
		if err != nil {
			t.Fatal(err)
		}
		return append(Dirs(spec, cur), WildcardDirs(root, spec)...)
	}
	if added, failed := w.Set(plan()); !slices.Equal(added, []string{"/var/lib/kubelet/pods"}) || len(failed) > 0 {
		t.Fatalf("first Set: added %q, failed %q", added, failed)
	}
	pod := filepath.Join(root, "/var/lib/kubelet/pods/uid-1")
	adds := 0
	for cycle := range 3 {
		if err := os.Mkdir(pod, 0o755); err != nil {
			t.Fatal(err)
		}
		added, _ := w.Set(plan()) // the run the creation woke
		adds += len(added)
		if again, _ := w.Set(plan()); len(again) > 0 { // the run that Set's wake asked for
			t.Fatalf("cycle %d: the extra run's Set added %q; want nothing (no loop)", cycle, again)
		}
		if err := os.RemoveAll(pod); err != nil {
			t.Fatal(err)
		}
		if added, _ := w.Set(plan()); len(added) > 0 { // the run the removal woke
			t.Fatalf("cycle %d: the removal's run added %q; want nothing", cycle, added)
		}
	}
	if adds != 3 {
		t.Fatalf("3 creations added %d watches; want 3 (one extra run each)", adds)
	}
}

// Two watched names of one directory (a symlinked directory on the way to
// one of them, as README's "a symlinked directory on the way to a protected
// path is followed"; a bind mount is the same) are one inode, so the kernel
// gives them one watch descriptor. Each name's changes are reported under
// that name (the check tells by the name whether a change is relevant), and
// dropping one name from the watched set leaves the other watched: before,
// the second name's watch overwrote the first's in the descriptor's map
// (its changes came under the other name), and dropping either removed the
// kernel's watch for both, so the other's changes waited for the interval's
// scan.
func TestWatcherTwoNamesOfOneDirectory(t *testing.T) {
	real, alias := "/srv/real/d", "/srv/alias/d"
	for _, drop := range []string{alias, real} {
		t.Run("drop "+drop, func(t *testing.T) {
			root := tree(t, map[string]string{"/srv/real/d/a.conf": ""})
			if err := os.Symlink("real", filepath.Join(root, "/srv/alias")); err != nil {
				t.Fatal(err)
			}
			keep := real
			if drop == real {
				keep = alias
			}
			w, err := NewWatcher(root)
			if err != nil {
				t.Fatal(err)
			}
			// And /srv, which holds the symlink on the way to alias.
			if added, failed := w.Set([]string{real, alias}); !slices.Equal(added, []string{"/srv", alias, real}) || len(failed) > 0 {
				t.Fatalf("Set: added %q, failed %q; want both and /srv", added, failed)
			}
			events := make(chan Event, 64)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx, func(ev Event) { events <- ev }) }()
			defer func() { cancel(); <-done }()

			write := func(name string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(root, "/srv/real/d", name), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("b.conf")
			await(t, events, Event{Path: real + "/b.conf"})
			write("c.conf")
			await(t, events, Event{Path: alias + "/c.conf"})

			if added, failed := w.Set([]string{keep}); len(added) > 0 || len(failed) > 0 {
				t.Fatalf("Set without %s: added %q, failed %q; want nothing", drop, added, failed)
			}
			write("evil.conf")
			await(t, events, Event{Path: keep + "/evil.conf"})

			// The directory replaced: both names are gone, and are watched
			// anew by the next Set.
			if err := os.Rename(filepath.Join(root, "/srv/real/d"), filepath.Join(root, "/srv/real/d.old")); err != nil {
				t.Fatal(err)
			}
			await(t, events, Event{Path: keep, Gone: true})
			if err := os.Mkdir(filepath.Join(root, "/srv/real/d"), 0o755); err != nil {
				t.Fatal(err)
			}
			// /srv too where the Set of real alone dropped it (no link on
			// the way to real).
			want := []string{alias, real}
			if keep == real {
				want = []string{"/srv", alias, real}
			}
			if added, failed := w.Set([]string{real, alias}); !slices.Equal(added, want) || len(failed) > 0 {
				t.Fatalf("Set after the replace: added %q, failed %q; want %q", added, failed, want)
			}
			if added, _ := w.Set([]string{drop}); len(added) > 0 {
				t.Fatalf("Set of %s alone: added %q; want nothing", drop, added)
			}
			write("later.conf")
			await(t, events, Event{Path: drop + "/later.conf"})
		})
	}
}

// A symlink on the way to a watched directory (/etc/kubernetes ->
// ../srv/a): the directory holding it is watched, so its retarget (a rename
// over it, as `ln -sfn` does) is a notification, and the next Set watches
// the directory the name leads to now (added: once; the Set after it adds
// nothing), where a new file is seen. Before, the link's directory was not
// watched, and the name stayed watched on the old target's inode.
func TestWatcherFollowsARetargetedSymlinkOnTheWay(t *testing.T) {
	root := tree(t, map[string]string{"/srv/a/manifests/etcd.yaml": "", "/srv/b/manifests/etcd.yaml": "", "/etc/hosts": ""})
	if err := os.Symlink("../srv/a", filepath.Join(root, "/etc/kubernetes")); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(root)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{"/etc/kubernetes/manifests"}
	if added, _ := w.Set(dirs); !slices.Equal(added, []string{"/etc", "/etc/kubernetes/manifests"}) {
		t.Fatalf("Set added %q, want the link's directory and the directory", added)
	}
	events := make(chan Event, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, func(ev Event) { events <- ev }) }()
	defer func() { cancel(); <-done }()

	if err := os.Symlink("../srv/b", filepath.Join(root, "/etc/kubernetes.new")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "/etc/kubernetes.new"), filepath.Join(root, "/etc/kubernetes")); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/kubernetes", Link: true})
	if added, _ := w.Set(dirs); !slices.Equal(added, dirs) {
		t.Fatalf("Set after the retarget added %q, want %q (the new target)", added, dirs)
	}
	if added, _ := w.Set(dirs); len(added) > 0 {
		t.Fatalf("Set again added %q, want nothing", added)
	}
	if err := os.WriteFile(filepath.Join(root, "/srv/b/manifests/evil.yaml"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/kubernetes/manifests/evil.yaml"})

	// The link itself as a watched directory (a file protected directly
	// in /etc/kubernetes) is watched through it, as the scan reads it: a
	// file written in the target is reported under the link's name, and
	// after a retarget the next Set watches the new target (once). Before,
	// the watch was set without following the link at its name: ENOTDIR,
	// reported failed, changes there left to the interval's scan.
	dirs = append(dirs, "/etc/kubernetes")
	if added, failed := w.Set(dirs); !slices.Equal(added, []string{"/etc/kubernetes"}) || len(failed) > 0 {
		t.Fatalf("Set of the link: added %q, failed %q; want it added", added, failed)
	}
	if err := os.WriteFile(filepath.Join(root, "/srv/b/admin.conf"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/kubernetes/admin.conf"})
	if err := os.Symlink("../srv/a", filepath.Join(root, "/etc/kubernetes.new")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "/etc/kubernetes.new"), filepath.Join(root, "/etc/kubernetes")); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/kubernetes", Link: true})
	if added, _ := w.Set(dirs); !slices.Equal(added, []string{"/etc/kubernetes", "/etc/kubernetes/manifests"}) {
		t.Fatalf("Set after the link's retarget added %q, want the link and the directory under it", added)
	}
	if added, _ := w.Set(dirs); len(added) > 0 {
		t.Fatalf("Set again added %q, want nothing", added)
	}
	if err := os.WriteFile(filepath.Join(root, "/srv/a/admin.conf"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/kubernetes/admin.conf"})
	if n := inotifyWatches(t, w); n != 3 {
		t.Errorf("%d kernel watches, want 3 (/etc, /srv/a, /srv/a/manifests): the old target's removed", n)
	}
}

// inotifyWatches counts the kernel's watches of the Watcher's inotify
// instance (the "inotify wd:" lines of its fdinfo).
func inotifyWatches(t *testing.T, w *Watcher) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", w.fd))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "inotify wd:")
}

// A filesystem mounted over a watched directory sends no notification,
// and the watch stays on the directory beneath it; but the name now leads
// to another directory (the mount's root, another device and inode), so
// the next Set (the next run: the interval's scan at the latest) watches
// it there: a change in the mount then wakes the check. Unmounted, the
// mount's watch is Gone and the next Set watches the directory beneath
// again. One kernel watch throughout: the one beneath is removed.
func TestWatcherWatchesAFilesystemMountedOverItAtTheNextSet(t *testing.T) {
	root := tree(t, map[string]string{"/etc/cni/net.d/05-cilium.conflist": "{}"})
	dir := filepath.Join(root, "/etc/cni/net.d")
	w, err := NewWatcher(root)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{"/etc/cni/net.d"}
	if added, _ := w.Set(dirs); !slices.Equal(added, dirs) {
		t.Fatalf("Set added %q, want %q", added, dirs)
	}
	events := make(chan Event, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, func(ev Event) { events <- ev }) }()
	defer func() { cancel(); <-done }()

	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0755"); err != nil {
		testenv.Skip(t, "cannot mount a tmpfs (root in a mount namespace that allows it): "+err.Error())
	}
	mounted := true
	t.Cleanup(func() { // before t.TempDir's removal, which a mount would keep busy
		if mounted {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	if added, _ := w.Set(dirs); !slices.Equal(added, dirs) {
		t.Fatalf("Set after the mount added %q, want %q (the mount's root)", added, dirs)
	}
	if n := inotifyWatches(t, w); n != 1 {
		t.Errorf("%d kernel watches after the mount's Set, want 1 (the one beneath removed)", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "evil.conflist"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/cni/net.d/evil.conflist"})
	if added, _ := w.Set(dirs); len(added) > 0 {
		t.Fatalf("Set again added %q, want nothing", added)
	}

	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	await(t, events, Event{Path: "/etc/cni/net.d", Gone: true})
	if added, _ := w.Set(dirs); !slices.Equal(added, dirs) {
		t.Fatalf("Set after the unmount added %q, want %q (the directory beneath)", added, dirs)
	}
	if n := inotifyWatches(t, w); n != 1 {
		t.Errorf("%d kernel watches after the unmount's Set, want 1", n)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.conflist"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	await(t, events, Event{Path: "/etc/cni/net.d/b.conflist"})
}

// The symlinks a watched directory is reached through, as the kernel
// follows them: on its own path, through a link's target (relative, with
// "..", or absolute from the host root), a link to nothing; a loop ends
// at the kernel's bound, and a Set through it fails without spinning.
func TestWatcherLinksOnTheWay(t *testing.T) {
	root := tree(t, map[string]string{"/srv/gen-1/kubernetes/manifests/etcd.yaml": "", "/data/kubelet/config.yaml": ""})
	for link, target := range map[string]string{
		"/etc/kubernetes": "static/kubernetes", "/etc/static": "../srv/gen-1",
		"/var/lib/kubelet": "/data/kubelet", "/var/lib/gone": "../../nothing",
		"/etc/loop-a": "loop-b", "/etc/loop-b": "loop-a",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	w, err := NewWatcher(root)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	memo := map[string]resolved{}
	for d, want := range map[string][]string{
		"/etc/kubernetes/manifests": {"/etc/kubernetes", "/etc/static"},
		"/etc/kubernetes":           {"/etc/kubernetes", "/etc/static"},
		"/srv/gen-1/kubernetes":     nil,
		"/var/lib/kubelet":          {"/var/lib/kubelet"},
		"/var/lib/gone/x":           {"/var/lib/gone"},
	} {
		if got := w.linksOnTheWay(d, memo); !slices.Equal(got, want) {
			t.Errorf("linksOnTheWay(%s) = %q, want %q", d, got, want)
		}
	}
	if got := w.linksOnTheWay("/etc/loop-a/x", memo); len(got) != maxLinks {
		t.Errorf("a loop: %d links, want the bound %d", len(got), maxLinks)
	}
	if added, failed := w.Set([]string{"/etc/loop-a/x", "/etc/kubernetes/manifests"}); !slices.Equal(failed, []WatchFailure{{Dir: "/etc/loop-a/x", Err: unix.ELOOP}}) ||
		!slices.Equal(added, []string{"/etc", "/etc/kubernetes/manifests"}) {
		t.Errorf("Set: added %q, failed %v; want the loop failed (ELOOP), the rest watched", added, failed)
	}
}

// A read error ends Run (the check then logs "file notifications stopped"
// and leaves changes to the interval's scan): the inotify instance is
// closed with it, its descriptor and its watches released. Before, only
// the end of Run's context closed it, and each such error (one per check
// instance: a reload builds another) left the descriptor open, its watches
// counted against the user's inotify limits, for the daemon's lifetime.
func TestWatcherRunClosesItOnAReadError(t *testing.T) {
	w, err := NewWatcher("/")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	// The watcher's descriptor now reads a directory: EISDIR.
	if err := unix.Dup3(int(dir.Fd()), w.fd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Run(ctx, func(Event) {}); err == nil {
		t.Fatal("Run returned no error on a read error")
	}
	if _, err := unix.FcntlInt(uintptr(w.fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("descriptor %d after Run returned on a read error: fcntl error %v, want EBADF (closed)", w.fd, err)
	}
	if added, failed := w.Set([]string{t.TempDir()}); len(added) > 0 || len(failed) > 0 {
		t.Errorf("Set on a closed watcher: added %q, failed %q, want nothing (no descriptor to use)", added, failed)
	}
}
