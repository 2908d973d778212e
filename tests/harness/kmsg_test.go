package harness

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// HoldExt4Errors holds its lock against another open of the file (as
// another test binary's) until the test that took it ends, and only then.
// The test holds a lock file of its own, not Ext4ErrorsLock: make test
// runs this package beside tests/, whose tests hold Ext4ErrorsLock, and
// the look after the end found the lock taken by one of them (or the
// subtest waited for it).
func TestHoldExt4ErrorsHoldsUntilTheTestEnds(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "ext4-errors.lock")
	other := func() error {
		f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	t.Run("holding", func(t *testing.T) {
		holdLock(t, lock)
		if err := other(); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("another open took the lock while it was held: %v", err)
		}
	})
	if err := other(); err != nil {
		t.Fatalf("the lock not released at the test's end: %v", err)
	}
}
