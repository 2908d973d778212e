package logsink

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
)

// A line logged just before the process crashes (a panic no one recovers, a
// fatal error: the runtime writes its report to fd 2 itself and exits) is
// in the journal, before the crash's report: under the shipped unit stderr
// is journald's stream socket, which takes it at once, and the daemon runs
// with GOMAXPROCS=1, where the Sink's goroutine does not get to run before
// the crash ends the process.
func TestLineBeforeACrashIsNotLost(t *testing.T) {
	if os.Getenv("LOGSINK_CRASH_CHILD") == "1" {
		runtime.GOMAXPROCS(1)
		s := New(os.Stderr, DefaultBytes)
		s.Write([]byte("the last words before the crash\n"))
		panic("boom")
	}
	// stderr as under systemd: a stream socket (journald's).
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "journal"), os.NewFile(uintptr(fds[1]), "stderr")
	defer ours.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLineBeforeACrashIsNotLost$")
	cmd.Env = append(os.Environ(), "LOGSINK_CRASH_CHILD=1")
	cmd.Stderr = theirs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	out, _ := io.ReadAll(ours)
	err = cmd.Wait()
	if _, ok := err.(*exec.ExitError); !ok {
		t.Fatalf("the child did not crash: %v\n%s", err, out)
	}
	line, crash := bytes.Index(out, []byte("the last words before the crash\n")), bytes.Index(out, []byte("panic: boom"))
	if line < 0 || crash < 0 || line > crash {
		t.Fatalf("stderr of a process that logged a line, then crashed: the line at %d, the crash at %d; want the line, then the crash:\n%s", line, crash, out)
	}
}
