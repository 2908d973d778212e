package kmsg

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// The once-a-minute read of kernel.hung_task_warnings and the sysfs reads
// of an NVMe controller's transport make no epoll_ctl(2)
// (rawsys.ReadPseudoFile): os.ReadFile registered the sysctl, pollable and
// ready, with the runtime's poller, which woke the thread waiting there.
func TestPseudoFileReadsMakeNoEpollCtl(t *testing.T) {
	path := "/proc/" + hungWarningsPath
	var err error
	_, epoll := testenv.ThreadSyscalls(t, func() { _, err = readHungWarnings(path) })
	if errors.Is(err, fs.ErrNotExist) {
		testenv.Skip(t, "no kernel.hung_task_warnings: a kernel without CONFIG_DETECT_HUNG_TASK")
	}
	if err != nil {
		t.Fatal(err)
	}
	if epoll != 0 {
		t.Errorf("readHungWarnings: %d epoll_ctl, want none: read by os", epoll)
	}
	ctrls, _ := filepath.Glob("/sys/class/nvme/nvme*")
	for _, c := range ctrls {
		_, epoll := testenv.ThreadSyscalls(t, func() { readTransport(c) })
		if epoll != 0 {
			t.Errorf("readTransport(%s): %d epoll_ctl, want none: read by os", c, epoll)
		}
	}
}
