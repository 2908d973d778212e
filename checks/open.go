package checks

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/hostio"
)

// openNoWait opens path for reading, through symlinks, without blocking
// (O_NONBLOCK), and returns it with what the open descriptor is: the caller
// refuses what is not a regular file. A FIFO's open would otherwise wait for
// a writer that may never come (the run abandoned at its timeout, and every
// later run finding it still running). O_NONBLOCK changes nothing for the
// reads of a regular file.
func openNoWait(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	return withInfo(f)
}

// withInfo returns the opened f with what it is (fstat), or closes it
// and returns the error.
func withInfo(f *os.File) (*os.File, fs.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// openNoWaitIn is openNoWait of the host path p under the host root root,
// its symbolic links resolved as the host resolves them: an absolute
// target under root, not under the daemon's own / (kubelet points
// kubelet-client-current.pem at /var/lib/kubelet/pki/kubelet-client-<date>.pem),
// and a ".." that would climb above root staying at root (openat2's
// RESOLVE_IN_ROOT). With root "/" (or "") it is openNoWait(p). A kernel
// without openat2 (before 5.6), or a filter that refuses it, gets the
// plain open of p under root.
func openNoWaitIn(root, p string) (*os.File, fs.FileInfo, error) {
	if root == "" || root == "/" {
		return openNoWait(p)
	}
	fd, refused, err := hostio.OpenInRoot(root, p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, "open")
	switch {
	case refused:
		return openNoWait(filepath.Join(root, p))
	case err != nil:
		return nil, nil, err
	}
	return withInfo(os.NewFile(uintptr(fd), filepath.Join(root, p)))
}

// readlinkIn is os.Readlink of the host path p under the host root root,
// the directories on the way resolved as the host resolves them (an
// absolute link among them, /var/lib/kubelet -> /data/kubelet, under root:
// openat2's RESOLVE_IN_ROOT), the link itself not followed. With root "/"
// (or "") it is os.Readlink(p); where openat2 is refused, os.Readlink of p
// under root (openNoWaitIn's fallback).
func readlinkIn(root, p string) (string, error) {
	if root == "" || root == "/" {
		return os.Readlink(p)
	}
	fd, refused, err := hostio.OpenInRoot(root, p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, "readlink")
	switch {
	case refused:
		return os.Readlink(filepath.Join(root, p))
	case err != nil:
		return "", err
	}
	defer unix.Close(fd)
	for n := 256; ; n *= 2 {
		buf := make([]byte, n)
		// An empty path: the link the O_PATH descriptor is (readlinkat(2)).
		m, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: filepath.Join(root, p), Err: err}
		}
		if m < n {
			return string(buf[:m]), nil
		}
	}
}
