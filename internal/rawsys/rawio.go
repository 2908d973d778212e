//go:build !race

package rawsys

import (
	"syscall"
	"unsafe"
)

// rawIO is read(2) or write(2) (nr) of p on fd, again after EINTR.
func rawIO(nr, fd uintptr, p []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(nr, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
		if e != syscall.EINTR {
			if e != 0 {
				return 0, e
			}
			return int(n), 0
		}
	}
}
