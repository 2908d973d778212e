package rawsys

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The files the daemon reads so (a sysctl, sysfs attributes, /proc/stat)
// read as os.ReadFile reads them, by the raw calls: each is on procfs or
// sysfs here.
func TestReadPseudoFileReadsProcAndSys(t *testing.T) {
	paths := []string{"/proc/sys/kernel/hung_task_warnings", "/proc/sys/kernel/ostype", "/proc/stat", "/proc/self/mountinfo"}
	if m, _ := filepath.Glob("/sys/bus/pci/devices/*/vendor"); len(m) > 0 {
		paths = append(paths, m[0])
	}
	if m, _ := filepath.Glob("/sys/block/*/size"); len(m) > 0 {
		paths = append(paths, m[0])
	}
	if m, _ := filepath.Glob("/sys/kernel/mm/transparent_hugepage/enabled"); len(m) > 0 {
		paths = append(paths, m[0])
	}
	for _, p := range paths {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // no hung-task detector in this kernel
			}
			t.Fatal(err)
		}
		if st.Type != unix.PROC_SUPER_MAGIC && st.Type != unix.SYSFS_MAGIC {
			t.Fatalf("%s: file system %#x, neither procfs nor sysfs", p, st.Type)
		}
		got, err := ReadPseudoFile(p, 1<<20)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		want, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// /proc/stat and mountinfo may change between the two reads: their
		// lines' first fields and their count are the same.
		if p == "/proc/stat" || p == "/proc/self/mountinfo" {
			if f, w := firstFields(got), firstFields(want); f != w {
				t.Fatalf("%s: read %q..., os.ReadFile %q...", p, f, w)
			}
			continue
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: read %q, os.ReadFile %q", p, got, want)
		}
	}
	if len(paths) < 2 {
		t.Fatal("nothing read")
	}
}

// firstFields is each line's first field.
func firstFields(b []byte) string {
	var out []byte
	for line := range bytes.Lines(b) {
		if f := bytes.Fields(line); len(f) > 0 {
			out = append(append(out, f[0]...), ' ')
		}
	}
	return string(out)
}

// A missing file, a directory, a file over the limit, a path with a NUL:
// errors as os.ReadFile's, each an *os.PathError.
func TestReadPseudoFileErrors(t *testing.T) {
	missing := "/proc/sys/kernel/no-such-sysctl"
	_, err := ReadPseudoFile(missing, 64)
	_, osErr := os.ReadFile(missing)
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != osErr.Error() {
		t.Fatalf("missing: %v; os.ReadFile's: %v", err, osErr)
	}
	for _, dir := range []string{"/proc/sys/kernel", "/sys/kernel"} {
		_, err = ReadPseudoFile(dir, 64)
		_, osErr = os.ReadFile(dir)
		if !errors.Is(err, syscall.EISDIR) || err.Error() != osErr.Error() {
			t.Fatalf("directory %s: %v; os.ReadFile's: %v", dir, err, osErr)
		}
	}
	// /proc/sys/kernel/ostype is "Linux\n": 6 bytes.
	if b, err := ReadPseudoFile("/proc/sys/kernel/ostype", 6); err != nil || string(b) != "Linux\n" {
		t.Fatalf("at the limit: %q, %v", b, err)
	}
	_, err = ReadPseudoFile("/proc/sys/kernel/ostype", 5)
	var pe *os.PathError
	if !errors.Is(err, ErrTooLarge) || !errors.As(err, &pe) || pe.Path != "/proc/sys/kernel/ostype" {
		t.Fatalf("over the limit: %v", err)
	}
	// Over the first buffer's 512 bytes, within the limit, and over it.
	stat, err := ReadPseudoFile("/proc/stat", 1<<20)
	if err != nil || len(stat) <= 512 {
		t.Fatalf("/proc/stat: %d bytes, %v", len(stat), err)
	}
	if _, err := ReadPseudoFile("/proc/stat", 600); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("/proc/stat over 600 bytes: %v", err)
	}
	if _, err := ReadPseudoFile("a\x00b", 64); !errors.As(err, &pe) {
		t.Fatalf("a path with a NUL byte: %v", err)
	}
}

// A file on another file system (a fixture tree) is read by os, with the
// same limit, its errors os's.
func TestReadPseudoFileFallsBackOffProcAndSys(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Type == unix.PROC_SUPER_MAGIC || st.Type == unix.SYSFS_MAGIC {
		testenv.Skip(t, "the temporary directory is on procfs or sysfs")
	}
	p := filepath.Join(dir, "hung_task_warnings")
	content := bytes.Repeat([]byte("10\n"), 400) // over the first buffer
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadPseudoFile(p, len(content)); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("fixture: %d bytes, %v", len(b), err)
	}
	if _, err := ReadPseudoFile(p, len(content)-1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("fixture over the limit: %v", err)
	}
	_, err := ReadPseudoFile(dir, 64)
	_, osErr := os.ReadFile(dir)
	if !errors.Is(err, syscall.EISDIR) || err.Error() != osErr.Error() {
		t.Fatalf("fixture directory: %v; os.ReadFile's: %v", err, osErr)
	}
	_, err = ReadPseudoFile(filepath.Join(dir, "none"), 64)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing fixture: %v", err)
	}
}

// The point of it: a read of a sysctl makes no epoll_ctl(2) (os.ReadFile's
// registers the file with the runtime's poller, and the file being
// pollable and ready, wakes the thread waiting there), and five system
// calls (openat, fstatfs, two reads, close), none of them through the
// runtime's syscall state.
func TestReadPseudoFileMakesNoEpollCtl(t *testing.T) {
	const path = "/proc/sys/kernel/ostype"
	var err, osErr error
	all, epoll := testenv.FewestThreadSyscalls(t, func() { _, e := ReadPseudoFile(path, 64); err = errors.Join(err, e) })
	osAll, osEpoll := testenv.FewestThreadSyscalls(t, func() { _, e := os.ReadFile(path); osErr = errors.Join(osErr, e) })
	if err != nil || osErr != nil {
		t.Fatal(err, osErr)
	}
	t.Logf("ReadPseudoFile: %d system calls, %d epoll_ctl; os.ReadFile: %d, %d", all, epoll, osAll, osEpoll)
	if epoll != 0 || all != 5 {
		t.Errorf("ReadPseudoFile(%s): %d system calls, %d of them epoll_ctl; want 5, none", path, all, epoll)
	}
	if osEpoll != 2 {
		t.Errorf("os.ReadFile(%s): %d epoll_ctl, want 2 (add, delete): does os still register a procfs file with the poller?", path, osEpoll)
	}
}

// The buffer's growth, past 512 bytes and past it doubled, against
// os.ReadFile on files that do not change between the two reads (a
// process's limits, 1,323 bytes here; the kernel's crypto list, 11,460);
// and a host root whose proc is a symlink to the real /proc (the fstatfs
// is of the file the link leads to: read raw) or whose file is a symlink
// out to another file system (read by os).
func TestReadPseudoFileGrowsAndFollowsSymlinks(t *testing.T) {
	for _, p := range []string{"/proc/self/limits", "/proc/crypto"} {
		want, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadPseudoFile(p, 1<<20)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, %v; os.ReadFile %d bytes", p, len(got), err, len(want))
		}
		if len(want) > 512 {
			if _, err := ReadPseudoFile(p, len(want)-1); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%s a byte over the limit: %v", p, err)
			}
			if b, err := ReadPseudoFile(p, len(want)); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("%s at the limit: %d bytes, %v", p, len(b), err)
			}
		}
	}
	root := t.TempDir()
	if err := os.Symlink("/proc", filepath.Join(root, "proc")); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("/proc/sys/kernel/ostype")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := ReadPseudoFile(filepath.Join(root, "proc/sys/kernel/ostype"), 64); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("through a symlink to /proc: %q, %v", b, err)
	}
	out := filepath.Join(t.TempDir(), "hung_task_warnings")
	if err := os.WriteFile(out, []byte("10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "sys"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "sys", "hung_task_warnings")
	if err := os.Symlink(out, link); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadPseudoFile(link, 64); err != nil || string(b) != "10\n" {
		t.Fatalf("a symlink out to a regular file: %q, %v", b, err)
	}
}
