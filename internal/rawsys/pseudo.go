package rawsys

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ReadPseudoFile returns the content of the file at path, which must hold
// at most max bytes (a larger one is an error), read by raw system calls
// when the file is on procfs or sysfs: openat(2) (O_RDONLY, O_CLOEXEC,
// O_NONBLOCK), fstatfs(2) to see the file system, read(2) to the end,
// close(2). os.ReadFile of such a file costs the idle daemon a wake-up or
// two: os registers every file it opens with the runtime's poller, and
// where a regular file on ext4 is refused, procfs' sysctl files and sysfs'
// attributes can be polled, so epoll_ctl adds one, ready, and that wakes
// the thread waiting in epoll_pwait; its close then enters the runtime's
// syscall state, which wakes the monitor thread (sysmon) when it sleeps
// (see the package doc). The files of both are made in memory when read,
// so the raw calls do not wait; O_NONBLOCK keeps a file that would (a
// FIFO in a fixture tree) from holding the thread in its open.
//
// A file on any other file system (a fixture tree, a host root that is
// not the host's own procfs and sysfs) is closed again and read the
// ordinary way, by os, with the same limit: a disk's read may wait, and
// a raw call that waits holds the daemon's one processor. The lookup of
// path is the raw openat's, which stays in memory for /proc and /sys
// (and for the directories above them, in use all the time).
//
// An error is an *os.PathError, as os.ReadFile's (errors.Is(err,
// fs.ErrNotExist) holds for a missing file; a directory's is EISDIR in a
// "read"); a file larger than max is ErrTooLarge in one.
func ReadPseudoFile(path string, max int) ([]byte, error) {
	if max < 0 {
		max = 0
	}
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var fd uintptr
	for {
		r, _, e := syscall.RawSyscall6(unix.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(p)),
			unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return nil, &os.PathError{Op: "open", Path: path, Err: e}
		}
		fd = r
		break
	}
	if !pseudo(fd) {
		rawClose(fd)
		return readOrdinary(path, max)
	}
	b, err := readFD(fd, path, max)
	rawClose(fd)
	return b, err
}

// ErrTooLarge is the error of ReadPseudoFile for a file larger than its
// limit.
var ErrTooLarge = errors.New("file larger than the limit")

// pseudo reports whether fd is a file of procfs or sysfs.
func pseudo(fd uintptr) bool {
	var fs unix.Statfs_t
	for {
		_, _, e := syscall.RawSyscall(unix.SYS_FSTATFS, fd, uintptr(unsafe.Pointer(&fs)), 0)
		if e == syscall.EINTR {
			continue
		}
		return e == 0 && (fs.Type == unix.PROC_SUPER_MAGIC || fs.Type == unix.SYSFS_MAGIC)
	}
}

// rawClose closes fd. It is not retried: on Linux the descriptor is gone
// even when close says EINTR.
func rawClose(fd uintptr) { syscall.RawSyscall(unix.SYS_CLOSE, fd, 0, 0) }

// readFD reads fd to its end, at most max bytes (a byte more is
// ErrTooLarge). A sysfs attribute is at most a page and a sysctl a line:
// the first buffer is 512 bytes, doubled as needed (the whole of
// /proc/stat on a host with many interrupts).
func readFD(fd uintptr, path string, max int) ([]byte, error) {
	buf := make([]byte, 0, min(512, max+1))
	for {
		if len(buf) == cap(buf) {
			if len(buf) > max {
				return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, max)}
			}
			buf = append(buf, 0)[:len(buf)]
			if cap(buf) > max+1 {
				buf = buf[: len(buf) : max+1]
			}
		}
		n, e := rawIO(unix.SYS_READ, fd, buf[len(buf):cap(buf)])
		if e != 0 {
			return nil, &os.PathError{Op: "read", Path: path, Err: e}
		}
		if n == 0 {
			if len(buf) > max {
				return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, max)}
			}
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// readOrdinary is ReadPseudoFile's read of a file that is not on procfs
// or sysfs: by os, with the same limit.
func readOrdinary(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, max)}
	}
	return b, nil
}

// ReadFileNoPoll returns the content of the file at path, opened with
// O_RDONLY|O_CLOEXEC and flags, read to its end by ordinary open(2) and
// read(2) calls (x/sys/unix): not by os, which registers every file it
// opens with the runtime's poller (fcntl(2) calls, an epoll_ctl(2) the
// kernel refuses for a regular file or, for a file of procfs that can be
// polled, adds, waking the thread in the poller), and not by raw calls,
// which would hold the daemon's one processor where a read waits (a disk;
// the mount table, made under the mount namespace's lock). The first
// buffer holds size bytes, grown as needed; limit < 0 is no limit, else a
// file larger than limit is ErrTooLarge in an *os.PathError "read". EINTR
// is retried; any other error is an *os.PathError.
func ReadFileNoPoll(path string, flags, size, limit int) ([]byte, error) {
	var fd int
	for {
		var err error
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|flags, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		break
	}
	defer unix.Close(fd)
	if limit >= 0 {
		size = min(size, limit+1)
	}
	buf := make([]byte, 0, max(size, 1))
	for {
		if len(buf) == cap(buf) {
			if limit >= 0 && len(buf) > limit {
				return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)}
			}
			buf = append(buf, 0)[:len(buf)]
			if limit >= 0 && cap(buf) > limit+1 {
				buf = buf[: len(buf) : limit+1]
			}
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			if limit >= 0 && len(buf) > limit {
				return nil, &os.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%d bytes)", ErrTooLarge, limit)}
			}
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}
