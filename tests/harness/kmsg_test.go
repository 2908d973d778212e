package harness

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// HoldExt4Errors holds its lock against another open of the file (as
// another test binary's) until the test that took it ends, and only then.
func TestHoldExt4ErrorsHoldsUntilTheTestEnds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("run by make test as root: the lock lives in /run")
	}
	other := func() error {
		f, err := os.OpenFile(Ext4ErrorsLock, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	t.Run("holding", func(t *testing.T) {
		HoldExt4Errors(t)
		if err := other(); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("another open took the lock while it was held: %v", err)
		}
	})
	if err := other(); err != nil {
		t.Fatalf("the lock not released at the test's end: %v", err)
	}
}
