package report

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// A save of the state file (WriteFileAtomic) registers nothing with the
// runtime's poller and makes no call it does not need: 11 system calls on
// the saving thread (MkdirAll's stat; open, write, fchmod, fsync, close of
// the temp file; os.Rename's lstat and the rename; open, fsync, close of
// the directory), where os's files made 24 (4 fcntl and an epoll_ctl for
// each of the two opens, and an unlink and rmdir of the name already
// renamed). It still replaces the file whole, with its mode, and leaves no
// temp file.
func TestWriteFileAtomicSystemCalls(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, StateFileName)
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	all, epoll := testenv.FewestThreadSyscalls(t, func() { err = WriteFileAtomic(path, []byte("new state"), 0o644) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a save: %d system calls, %d epoll_ctl", all, epoll)
	// 11, and a runtime call or two of the thread's own at times (a
	// stack or heap grown): a bound well under the 24 of before.
	if epoll != 0 || all > 15 {
		t.Errorf("a save made %d system calls, %d of them epoll_ctl; want at most 15 (11 its own) and none", all, epoll)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "new state" {
		t.Errorf("file after the save: %q, %v", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("mode after the save: %v, %v; want 0644", fi.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory after the save holds %d files, want the state file alone", len(entries))
	}
}

// A save whose rename fails (the state file's name taken by a directory
// that is not empty: os.Rename's EEXIST, the kernel's EISDIR or ENOTEMPTY, as a real bad day's EXDEV or EIO
// would) returns the rename's error, named by the file replaced, and
// leaves no temp file: the save by x/sys/unix removes the temp file itself
// where the rename did not happen (os.CreateTemp's deferred os.Remove did
// it before).
func TestWriteFileAtomicRenameFailureLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, StateFileName)
	if err := os.MkdirAll(filepath.Join(path, "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := WriteFileAtomic(path, []byte("new state"), 0o644)
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Op != "rename" || pe.Path != path {
		t.Fatalf("save over a directory: %v; want the rename's error naming %s", err, path)
	}
	if !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		t.Errorf("save over a directory: %v; want EISDIR, ENOTEMPTY or EEXIST", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("after the failed rename the directory holds %v; want %s alone (no temp file)", names, StateFileName)
	}
}
