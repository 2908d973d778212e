package testenv

import (
	"os"
	"syscall"
	"testing"
)

// ThreadOrdinarySyscalls counts a syscall.Syscall (os.Getwd's getcwd is
// one, os.Stat's newfstatat another) and not a syscall.RawSyscall.
func TestThreadOrdinarySyscalls(t *testing.T) {
	if n := ThreadOrdinarySyscalls(t, func() { os.Stat("/") }); n < 1 {
		t.Errorf("os.Stat: %d ordinary system calls counted, want at least 1", n)
	}
	if n := ThreadOrdinarySyscalls(t, func() { syscall.RawSyscall(syscall.SYS_GETPID, 0, 0, 0) }); n != 0 {
		t.Errorf("a raw getpid: %d ordinary system calls counted, want 0", n)
	}
}
