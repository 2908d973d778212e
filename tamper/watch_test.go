package tamper

import (
	"context"
	"os"
	"path/filepath"
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
			if failed := w.Set([]string{"/etc/cni/net.d"}); len(failed) > 0 {
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
			if failed := w.Set([]string{"/etc/cni/net.d"}); len(failed) > 0 {
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
