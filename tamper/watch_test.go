package tamper

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
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
	if added, failed := w.Set([]string{"/etc/file"}); len(added) > 0 || !slices.Equal(failed, []string{"/etc/file"}) {
		t.Fatalf("a file: added %q, failed %q; want it failed, not added", added, failed)
	}
}
