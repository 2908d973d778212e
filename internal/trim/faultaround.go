package trim

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kernel's userfaultfd interface (linux/userfaultfd.h); x/sys/unix
// has only the system call's number.
const (
	uffdAPI             = 0xAA
	uffdioAPI           = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister      = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdFeatureWPAsync  = 1 << 15    // Linux 6.7 (x86_64)
	uffdRegisterModeWP  = 1 << 1
	uffdUserModeOnly    = 1 // Linux 5.11: what a process without CAP_SYS_PTRACE may ask for
	uffdFlags           = unix.O_CLOEXEC | unix.O_NONBLOCK | uffdUserModeOnly
	errNoFaultAroundFmt = "userfaultfd (asynchronous write protection: Linux 6.7 or later on x86_64, and the system call allowed): %s: %w"
)

var (
	noFaultAroundOnce sync.Once
	noFaultAroundErr  error
)

// NoFaultAround makes a page fault in the binary's read-only mappings map
// that one page. Without it, the kernel maps the 64 KiB around a faulting
// page of a file (fault-around; fault_around_bytes in debugfs, for the
// whole system), so that each place the idle daemon touches again after a
// trim costs 16 pages of its resident set or more, most of them never read
// (README, "What the daemon's RssFile is").
//
// The kernel skips fault-around in a mapping registered with a userfaultfd
// for write protection (should_fault_around in mm/memory.c asks
// uffd_disable_fault_around, include/linux/userfaultfd_k.h). The mappings
// are registered in the asynchronous mode (a write would be let through by
// the kernel, no thread of ours handles a fault), user mode only, and never
// written: code and read-only data. Reads fault as before, from the page
// cache, a page at a time; khugepaged no longer collapses them into huge
// pages (only kernels with CONFIG_READ_ONLY_THP_FOR_FS would).
//
// Only the first call does the work. Where the kernel or the system call filter does not allow it
// (asynchronous write protection came with Linux 6.7 on x86_64, later on
// other architectures; a kernel without CONFIG_USERFAULTFD; a filter
// without the userfaultfd system call) it returns an error and changes
// nothing: fault-around stays on.
func NoFaultAround() error {
	noFaultAroundOnce.Do(func() {
		noFaultAroundErr = registerNoFaultAround("/proc/self/exe", "/proc/self/smaps")
	})
	return noFaultAroundErr
}

func registerNoFaultAround(exeLink, smapsPath string) error {
	cands, err := readOnly(exeLink, smapsPath)
	if err != nil {
		return err
	}
	if len(cands) == 0 {
		return errors.New("no read-only mapping of an executable of type EXEC")
	}
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, uffdFlags, 0, 0)
	if errno != 0 {
		return fmt.Errorf(errNoFaultAroundFmt, "userfaultfd", errno)
	}
	// On success the descriptor stays open for the process's life:
	// closing it would end the registration. On failure it is closed,
	// and with it any mapping registered before: none stays so.
	ok := false
	defer func() {
		if !ok {
			unix.Close(int(fd))
		}
	}()
	api := struct{ api, features, ioctls uint64 }{api: uffdAPI, features: uffdFeatureWPAsync}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
		return fmt.Errorf(errNoFaultAroundFmt, "UFFDIO_API with UFFD_FEATURE_WP_ASYNC", errno)
	}
	for _, m := range cands {
		reg := struct{ start, len, mode, ioctls uint64 }{start: m.start, len: m.end - m.start, mode: uffdRegisterModeWP}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
			return fmt.Errorf(errNoFaultAroundFmt, fmt.Sprintf("UFFDIO_REGISTER %#x-%#x", m.start, m.end), errno)
		}
	}
	ok = true
	return nil
}
