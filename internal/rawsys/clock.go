package rawsys

import (
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SinceBoot is CLOCK_BOOTTIME (the time since the kernel booted, time
// suspended included), by a raw clock_gettime(2): x/sys's ClockGettime is
// an ordinary system call, which enters the runtime's system-call state
// (and so may wake its monitor thread, or hand the processor to another
// thread), for a call that only reads the kernel's clock. Go's vDSO reads
// only CLOCK_MONOTONIC and CLOCK_REALTIME (MonotonicMicros).
func SinceBoot() (time.Duration, error) {
	var ts unix.Timespec
	if _, _, e := syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_BOOTTIME, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, e
	}
	return time.Duration(ts.Nano()), nil
}

// Adjtimex is adjtimex(2) made raw: the kernel's clock discipline, read
// (tx.Modes 0) or set, in memory; it returns the clock's state
// (unix.TIME_OK, unix.TIME_ERROR, ...), as x/sys's Adjtimex does.
func Adjtimex(tx *unix.Timex) (int, error) {
	r, _, e := syscall.RawSyscall(unix.SYS_ADJTIMEX, uintptr(unsafe.Pointer(tx)), 0, 0)
	if e != 0 {
		return int(r), e
	}
	return int(r), nil
}
