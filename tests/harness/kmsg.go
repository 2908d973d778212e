package harness

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// WriteKmsg writes one line to the real kernel log at level 5 (notice), as
// user space can: the record gets facility user. It opens the device once
// per line, because the kernel accepts only a burst of 10 lines per open
// file (printk_devkmsg=ratelimit), and ends the line with a newline (without
// it the record stays invisible).
func WriteKmsg(line string) error { return WriteKmsgLevel(5, line) }

// WriteKmsgLevel is WriteKmsg at a level of the kernel's (0 KERN_EMERG to
// 7 KERN_DEBUG): what the kernel prints a line at. The facility stays user:
// the kernel gives every record written from user space that facility
// (devkmsg_write), so a test's line never passes for the kernel's own.
func WriteKmsgLevel(level int, line string) error {
	f, err := os.OpenFile("/dev/kmsg", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte("<" + strconv.Itoa(level&7) + ">" + line + "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Token returns a unique token to tell this test's lines from everything
// else in the machine-wide kernel log.
func Token() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

// Ext4ErrorsLock is the file whose lock (flock, exclusive) a test holds
// while real ext4 errors of its own may reach the kernel log, or while it
// wants only its own ext4 lines there: the kernel's "EXT4-fs (loopN):
// Remounting filesystem read-only" carries no token, and a daemon reading
// the shared log acts on every one. Across processes: two test binaries
// run at once (another package's, a developer's second run) are held
// apart too.
const Ext4ErrorsLock = "/run/autopilot-health-tests-ext4-errors.lock"

// HoldExt4Errors takes Ext4ErrorsLock, waiting for it, until t ends (the
// kernel remounts read-only from a work queue, after the error's own
// line: the test's end is where its lines have all been printed).
func HoldExt4Errors(t testing.TB) { holdLock(t, Ext4ErrorsLock) }

// holdLock takes the lock (flock, exclusive) of the file at path, waiting
// for it, until t ends.
func holdLock(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("the ext4 errors lock: %v", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("the ext4 errors lock %s: %v", path, err)
	}
	t.Cleanup(func() { f.Close() }) // closing the last descriptor releases it
}
