package kmsg

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openDevice opens the kernel log without blocking (a FIFO or a device
// that would block the open cannot hold up the daemon or its shutdown) and
// refuses what is not a character device: a directory, a regular file or a
// FIFO is never the kernel log.
func openDevice(path string) (Device, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && st.Mode()&os.ModeCharDevice == 0 {
		kind := "a " + st.Mode().Type().String()
		switch {
		case st.IsDir():
			kind = "a directory"
		case st.Mode().IsRegular():
			kind = "a regular file"
		case st.Mode()&os.ModeNamedPipe != 0:
			kind = "a FIFO"
		}
		err = fmt.Errorf("%s is %s, not a character device (the kernel log is /dev/kmsg)", path, kind)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); err == nil && ok {
		if maj, mnr := unix.Major(uint64(sys.Rdev)), unix.Minor(uint64(sys.Rdev)); maj != 1 || mnr != 11 {
			err = fmt.Errorf("%s is the character device %d:%d, not the kernel log (/dev/kmsg is 1:11)", path, maj, mnr)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return newKmsgFile(f)
}

// kmsgFile is the kernel log opened without blocking, read one record per
// read(2) as the ABI has it, each read a raw system call. os.File.Read
// enters the runtime's syscall state for every read, and that wakes the
// runtime's monitor thread (sysmon) when it sleeps, which then polls every
// 20 µs for a millisecond: with a kernel line every millisecond that was
// the largest part of the daemon's CPU (perf on a flood paced at 1,000
// lines/s: sysmon 29 %, waking it 5 %). A read of the non-blocking device
// never blocks, so the raw form is safe. When no record is ready, Read
// waits in the runtime's poller until one is or the read deadline passes,
// as os.File.Read does; every record that is ready is read without waiting.
type kmsgFile struct {
	*os.File
	rc syscall.RawConn
	// The read in progress (fields rather than a closure's captures, so
	// that a read does not allocate).
	readFn func(fd uintptr) bool
	p      []byte
	n      int
	errno  syscall.Errno
}

func newKmsgFile(f *os.File) (*kmsgFile, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	kf := &kmsgFile{File: f, rc: rc}
	kf.readFn = kf.readNow
	return kf, nil
}

// Read reads one record (EPIPE after an overrun, like the device).
func (f *kmsgFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f.p, f.n, f.errno = p, 0, 0
	if err := f.rc.Read(f.readFn); err != nil {
		return 0, err
	}
	if f.errno != 0 {
		return 0, &os.PathError{Op: "read", Path: f.Name(), Err: f.errno}
	}
	return f.n, nil
}

// readNow is one non-blocking read; false (wait in the poller) when no
// record is ready.
func (f *kmsgFile) readNow(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&f.p[0])), uintptr(len(f.p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		f.n, f.errno = int(r), e
		return true
	}
}
