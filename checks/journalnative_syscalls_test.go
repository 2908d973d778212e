package checks

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// KubeletHeartbeatFailed's native journal read (every 5 minutes) registers
// nothing with the runtime's poller: /etc/machine-id and each journal file
// are opened by x/sys/unix, not os, whose open of a regular file was two
// fcntl(2) to set O_NONBLOCK, an epoll_ctl(2) add the kernel refuses and
// two fcntl to clear it again, per file (the idle daemon's strace: 28
// fcntl in one read). The directories are read by os.ReadDir, which does
// not register them. On the fixture's three files and a machine ID it
// still reads what journalctl read.
func TestNativeJournalReadSystemCalls(t *testing.T) {
	root, want := nativeJournalRoot(t)
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/machine-id"), []byte("dce1f06da5a54401aefd867f2ac7f6b0\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	readNative(t, root, journalQuery{After: want[len(want)-2].Cursor}) // the page cache and the heap warm
	var got []journalEntry
	var err error
	all, epoll := testenv.FewestThreadSyscalls(t, func() {
		got, _, err = readNative(t, root, journalQuery{After: want[len(want)-2].Cursor})
	})
	if err != nil || len(got) != 1 || got[0].Cursor != want[len(want)-1].Cursor {
		t.Fatalf("after the last but one: %d entries (%v), want the last", len(got), err)
	}
	t.Logf("a read after a cursor, 3 files: %d system calls, %d epoll_ctl", all, epoll)
	// 47 on this fixture, 68 by os (4 fcntl and an epoll_ctl for each of
	// the 4 files), a runtime call or two of the thread's own at times.
	if epoll != 0 || all > 52 {
		t.Errorf("a read made %d system calls, %d of them epoll_ctl; want at most 52 (47 its own) and none: a file opened by os", all, epoll)
	}
}
