package main

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Held (review of 65784dc): a socket reached through a chain of symlinks
// that works is asked, not named; with --json too; and the symlinks that
// loop or run through a file are named the same with --json.
func TestStatusThroughASymlinkChainIsAsked(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "real.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"pid":42,"now":"` + time.Now().UTC().Format(time.RFC3339) + `"}`))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	l1, l2 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2.sock")
	if err := os.Symlink(sock, l1); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(l1, l2); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := run(t, "status", "--socket", l2); code != exitOK || !strings.Contains(out, "pid 42") || errs != "" {
		t.Errorf("status through a symlink chain: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, out, errs := run(t, "status", "--json", "--socket", l2); code != exitOK || !strings.Contains(out, `"pid":42`) || errs != "" {
		t.Errorf("status --json through a symlink chain: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	loop, through := filepath.Join(dir, "loop.sock"), filepath.Join(dir, "through.sock")
	os.Symlink(loop, loop)
	os.Symlink(filepath.Join(file, "x.sock"), through)
	for _, path := range []string{loop, through} {
		code, out, errs := run(t, "status", "--json", "--socket", path)
		if want := "autopilot-health status: " + path + " is not a socket but a symlink: "; code != exitError || out != "" || !strings.HasPrefix(errs, want) {
			t.Errorf("status --json --socket %s: exit %d, stdout %q, stderr %q; want %q", path, code, out, errs, want)
		}
	}
}
