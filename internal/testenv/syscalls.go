package testenv

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// ThreadSyscalls runs fn on one thread, locked, and counts the system calls
// that thread enters while fn runs (the kernel's raw_syscalls:sys_enter
// tracepoint) and, of them, the epoll_ctl(2) ones
// (syscalls:sys_enter_epoll_ctl): what os does that a raw system call does
// not (os registers each file it opens with the runtime's poller). Those of
// other threads (the runtime's monitor, the thread waiting in the poller)
// are not counted. It needs perf_event_open(2) on tracepoints (root, or
// kernel.perf_event_paranoid=-1) and tracefs; where either is missing the
// test is skipped (Skip). fn must not call t.Fatal.
func ThreadSyscalls(t testing.TB, fn func()) (all, epollCtl int64) {
	t.Helper()
	all, epollCtl, err := CountSyscalls(fn)
	if err != nil {
		Skip(t, err.Error())
	}
	return all, epollCtl
}

// CountSyscalls is ThreadSyscalls with an error where the counters cannot
// be had, for a benchmark that reports them where it can.
func CountSyscalls(fn func()) (all, epollCtl int64, err error) {
	ids := make([]uint64, 2)
	for i, ev := range []string{"raw_syscalls/sys_enter", "syscalls/sys_enter_epoll_ctl"} {
		id, err := tracepointID(ev)
		if err != nil {
			return 0, 0, fmt.Errorf("no tracepoint %s: %w", ev, err)
		}
		ids[i] = id
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var fds [2]int
	for i, id := range ids {
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: id, Bits: unix.PerfBitDisabled}
		attr.Size = uint32(binary.Size(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			return 0, 0, fmt.Errorf("perf_event_open of a tracepoint on this thread: %w (needs root or kernel.perf_event_paranoid=-1)", err)
		}
		defer unix.Close(fd)
		fds[i] = fd
	}
	count := func(fn func()) (c [2]int64, err error) {
		for _, fd := range fds {
			unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_RESET, 0)
		}
		for _, fd := range fds {
			unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0)
		}
		fn()
		for _, fd := range fds {
			unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_DISABLE, 0)
		}
		for i, fd := range fds {
			var b [8]byte
			if n, err := unix.Read(fd, b[:]); err != nil || n != 8 {
				return c, fmt.Errorf("reading a perf counter: %d bytes, %v", n, err)
			}
			c[i] = int64(binary.NativeEndian.Uint64(b[:]))
		}
		return c, nil
	}
	// The enabling and disabling ioctls, the fewest of three: a signal
	// to the thread in one of them (the runtime's preemption, a
	// rt_sigreturn more) would make fn's count that much too low, and a
	// caller that takes the fewest of its runs would keep that one (CI
	// at 1fbf058: 2 system calls counted for ReadPseudoFile's 5).
	var base [2]int64
	for i := range 3 {
		b, err := count(func() {})
		if err != nil {
			return 0, 0, err
		}
		if i == 0 {
			base = b
		}
		base = [2]int64{min(base[0], b[0]), min(base[1], b[1])}
	}
	c, err := count(fn)
	if err != nil {
		return 0, 0, err
	}
	return c[0] - base[0], c[1] - base[1], nil
}

// tracepointID is the id of a tracepoint (category/name) in tracefs.
func tracepointID(ev string) (uint64, error) {
	var err error
	for _, dir := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		var b []byte
		if b, err = os.ReadFile(dir + "/events/" + ev + "/id"); err == nil {
			return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return 0, err
}
