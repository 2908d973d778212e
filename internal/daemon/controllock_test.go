package daemon

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The control socket's directory cannot be locked for a reason other than
// another start holding it (a file system without locks: ENOLCK,
// EOPNOTSUPP): the start goes on without the lock, as before e45c3ce, and
// says so once, a warning naming the directory and the error. Before, it
// went on saying nothing, and two starts at once could again both take
// the socket unseen.
func TestControlSocketLockFailureIsLoggedOnce(t *testing.T) {
	flock = func(int, int) error { return syscall.ENOLCK }
	t.Cleanup(func() { flock = syscall.Flock })
	dir := filepath.Join(t.TempDir(), "run")
	var logs bytes.Buffer
	ln, err := listenControl(filepath.Join(dir, "control.sock"), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("a start whose directory cannot be locked did not go on: %v", err)
	}
	ln.Close()
	var warned []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, "level=WARN") {
			warned = append(warned, l)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "dir="+dir) || !strings.Contains(warned[0], syscall.ENOLCK.Error()) {
		t.Fatalf("the log: %q; want one warning naming %s and %q", logs.String(), dir, syscall.ENOLCK.Error())
	}
}
