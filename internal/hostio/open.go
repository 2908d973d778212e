package hostio

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotRegular: the path names something other than a regular file.
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens p for reading without following a symlink in its last
// component and without blocking on a FIFO or device (O_NOFOLLOW|O_NONBLOCK),
// and fails unless it is a regular file (checked on the open descriptor, so
// a swap after an Lstat cannot slip a FIFO in). A missing file is an error
// that matches fs.ErrNotExist.
func OpenRegular(p string) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w (mode %#o)", p, ErrNotRegular, st.Mode&unix.S_IFMT)
	}
	return os.NewFile(uintptr(fd), p), nil
}
