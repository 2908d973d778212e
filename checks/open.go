package checks

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
	dir, err := os.Open(root)
	if err != nil {
		return nil, nil, err
	}
	defer dir.Close()
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT}
	rel := strings.TrimLeft(p, "/")
	var fd int
	for range 8 { // EAGAIN: a rename raced the resolution
		fd, err = unix.Openat2(int(dir.Fd()), rel, &how)
		if err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	switch {
	case err == unix.ENOSYS || err == unix.EPERM:
		return openNoWait(filepath.Join(root, p))
	case err != nil:
		return nil, nil, &fs.PathError{Op: "open", Path: filepath.Join(root, p), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(root, p))
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}
