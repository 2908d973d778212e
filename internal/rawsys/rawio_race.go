//go:build race

package rawsys

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawIO under the race detector is syscall.Read and Write: a raw system
// call tells the detector nothing of what the kernel wrote into p or of the
// order the descriptor makes, so `make test-race` would report races that
// are none and miss those on the buffers. The raw form is the build's.
func rawIO(nr, fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		var n int
		var err error
		if nr == unix.SYS_READ {
			n, err = syscall.Read(int(fd), p)
		} else {
			n, err = syscall.Write(int(fd), p)
		}
		var e syscall.Errno
		if err != nil && !errors.As(err, &e) {
			e = syscall.EIO
		}
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return n, 0
		}
	}
}
