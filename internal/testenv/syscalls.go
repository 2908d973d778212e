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

// FewestThreadSyscalls is ThreadSyscalls run three times, each counter's
// fewest: the runtime's own calls on the thread (a signal's rt_sigreturn,
// a stack or heap grown, an mmap) only ever add, and a test that bounds
// all of fn's calls would fail on a run that met one or two of them (CI at
// 74e3ade: a state file save, 11 calls its own, counted 16). fn runs three
// times, so it must be one that can.
func FewestThreadSyscalls(t testing.TB, fn func()) (all, epollCtl int64) {
	t.Helper()
	all, epollCtl = 1<<62, 1<<62
	for range 3 {
		a, e := ThreadSyscalls(t, fn)
		all, epollCtl = min(all, a), min(epollCtl, e)
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
	c, err := countLessIoctls(fds[:], fn)
	if err != nil {
		return 0, 0, err
	}
	return c[0], c[1], nil
}

// countLessIoctls runs fn with the perf counters fds enabled on this
// thread and returns each counter's count, less the enabling and disabling
// ioctls' own: the fewest of three empty runs, counter by counter (a
// signal to the thread in one of them, the runtime's preemption, a
// rt_sigreturn more, would make fn's count that much too low, and a caller
// that takes the fewest of its runs would keep that one: CI at 1fbf058, 2
// system calls counted for ReadPseudoFile's 5).
func countLessIoctls(fds []int, fn func()) ([]int64, error) {
	count := func(fn func()) ([]int64, error) {
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
		c := make([]int64, len(fds))
		for i, fd := range fds {
			var b [8]byte
			if n, err := unix.Read(fd, b[:]); err != nil || n != 8 {
				return nil, fmt.Errorf("reading a perf counter: %d bytes, %v", n, err)
			}
			c[i] = int64(binary.NativeEndian.Uint64(b[:]))
		}
		return c, nil
	}
	var base []int64
	for range 3 {
		b, err := count(func() {})
		if err != nil {
			return nil, err
		}
		if base == nil {
			base = b
		}
		for i := range base {
			base[i] = min(base[i], b[i])
		}
	}
	c, err := count(fn)
	if err != nil {
		return nil, err
	}
	for i := range c {
		c[i] -= base[i]
	}
	return c, nil
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
