package testenv

import (
	"encoding/binary"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ThreadOrdinarySyscalls runs fn on one thread, locked, and counts the
// ordinary system calls that thread makes while fn runs: those made through
// syscall.Syscall (os, net, unix.Open), which enter the runtime's system-call
// state (runtime.entersyscall, runtime.entersyscallblock) and so wake the
// runtime's monitor thread when it sleeps; a raw system call
// (syscall.RawSyscall, package rawsys) is not counted. It counts by uprobes
// on the test binary's runtime.reentersyscall (entersyscall's body) and
// runtime.entersyscallblock (perf_event_open(2) of the kernel's uprobe PMU
// on this thread). It needs root or kernel.perf_event_paranoid=-1 and the
// binary on disk; where either is missing the test
// is skipped (Skip). fn must not call t.Fatal.
func ThreadOrdinarySyscalls(t testing.TB, fn func()) int64 {
	t.Helper()
	n, err := CountOrdinarySyscalls(fn)
	if err != nil {
		Skip(t, err.Error())
	}
	return n
}

// CountOrdinarySyscalls is ThreadOrdinarySyscalls with an error where the
// counters cannot be had.
func CountOrdinarySyscalls(fn func()) (int64, error) {
	exe, offs, err := entryOffsets()
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile("/sys/bus/event_source/devices/uprobe/type")
	if err != nil {
		return 0, fmt.Errorf("no uprobe PMU: %w", err)
	}
	typ, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, err
	}
	path := append([]byte(exe), 0)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var fds []int
	for _, off := range offs {
		attr := unix.PerfEventAttr{Type: uint32(typ), Bits: unix.PerfBitDisabled,
			Ext1: uint64(uintptr(unsafe.Pointer(&path[0]))), Ext2: off}
		attr.Size = uint32(binary.Size(attr))
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		runtime.KeepAlive(path)
		if err != nil {
			return 0, fmt.Errorf("perf_event_open of a uprobe on this thread: %w (needs root or kernel.perf_event_paranoid=-1)", err)
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
	}
	c, err := countLessIoctls(fds, fn)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, x := range c {
		n += x
	}
	return n, nil
}

//go:linkname entersyscall runtime.entersyscall
func entersyscall()

//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

// entryOffsets are the places of runtime.entersyscall and
// runtime.entersyscallblock in this process's binary (its path and their
// file offsets, from /proc/self/maps: no symbols needed; go test strips
// its binaries).
func entryOffsets() (exe string, offs []uint64, err error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return "", nil, err
	}
	for _, fn := range []func(){entersyscall, entersyscallblock} {
		pc := uint64(reflect.ValueOf(fn).Pointer())
		found := false
		for _, line := range strings.Split(string(maps), "\n") {
			// start-end perms offset dev inode path
			f := strings.Fields(line)
			if len(f) < 6 {
				continue
			}
			lo, hi, ok := strings.Cut(f[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			off, err3 := strconv.ParseUint(f[2], 16, 64)
			if !ok || err1 != nil || err2 != nil || err3 != nil || pc < start || pc >= end {
				continue
			}
			exe, found = f[5], true
			offs = append(offs, pc-start+off)
		}
		if !found {
			return "", nil, fmt.Errorf("the runtime's entersyscall (%#x) in no file mapping of /proc/self/maps", pc)
		}
	}
	return exe, offs, nil
}
