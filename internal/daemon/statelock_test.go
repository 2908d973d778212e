package daemon

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// Two daemons whose configurations name different control sockets but the
// same state_dir (one run by hand beside the unit's): the second refuses
// to start, naming the directory, the lock file and the first's PID,
// before it touches the first's files, and its control socket goes with
// it; once the first stops, a daemon on that directory starts. Before, both
// ran and each saved state.json and tamper.json over the other's.
func TestSecondDaemonOnTheSameStateDirRefuses(t *testing.T) {
	cfg := testConfig(t)
	sock1 := filepath.Join(t.TempDir(), "run", "control.sock")
	sock2 := filepath.Join(t.TempDir(), "run", "control.sock")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	first, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, ControlSocket: sock1})
	if err != nil {
		t.Fatal(err)
	}
	stop := startDaemon(t, first)
	await(t, first, "the first daemon's first pass", first.readyNow)
	inFlight := filepath.Join(cfg.StateDir, "state.json.tmp4242")
	if err := os.WriteFile(inFlight, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}

	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln2.Close()
	_, err = New(cfg, quietLog(), Options{Version: "test", Listener: ln2, ControlSocket: sock2})
	var locked *StateLockedError
	if !errors.As(err, &locked) {
		t.Fatalf("a second daemon on the same state_dir: %v; want a refusal, the directory locked", err)
	}
	lockFile := filepath.Join(cfg.StateDir, StateLockName)
	want := "another autopilot-health daemon (pid " + strconv.Itoa(os.Getpid()) + ") uses this state directory"
	for _, s := range []string{cfg.StateDir, lockFile, want} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the refusal %q does not say %q", err, s)
		}
	}
	if _, err := os.Stat(inFlight); err != nil {
		t.Errorf("the refused daemon removed the first's temp file: %v", err)
	}
	if _, err := os.Lstat(sock2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused daemon left its control socket %s: %v", sock2, err)
	}
	fi, err := os.Stat(lockFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the lock file's mode: %v; want 0600", fi.Mode().Perm())
	}

	// The first stops: the directory is free, and the lock file stays.
	stop()
	ln3, _ := net.Listen("tcp", "127.0.0.1:0")
	next, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln3, ControlSocket: sock2})
	if err != nil {
		t.Fatalf("a daemon on the state_dir after the first stopped: %v", err)
	}
	startDaemon(t, next)()
}

// The lock file's path holds a symlink (or anything not a regular file):
// it is not followed (the PID written there would truncate its target),
// and the start goes on without the lock, saying so once, as it does on a
// file system without flock.
func TestStateLockNotTakenGoesOnWithOneWarning(t *testing.T) {
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(t.TempDir(), "precious")
		if err := os.WriteFile(target, []byte("keep me\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(dir, StateLockName)); err != nil {
			t.Fatal(err)
		}
		assertGoesOnWithOneWarning(t, dir, "it is a symbolic link, not followed")
		if b, _ := os.ReadFile(target); string(b) != "keep me\n" {
			t.Errorf("the symlink's target was written: %q", b)
		}
	})
	t.Run("ENOLCK", func(t *testing.T) {
		flock = func(int, int) error { return syscall.ENOLCK }
		t.Cleanup(func() { flock = syscall.Flock })
		assertGoesOnWithOneWarning(t, t.TempDir(), syscall.ENOLCK.Error())
	})
}

func assertGoesOnWithOneWarning(t *testing.T, dir, cause string) {
	t.Helper()
	var logs bytes.Buffer
	release, err := lockState(dir, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("a start whose state directory cannot be locked did not go on: %v", err)
	}
	release()
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], filepath.Join(dir, StateLockName)) || !strings.Contains(lines[0], cause) {
		t.Fatalf("the log: %q; want one warning naming the lock file and %q", logs.String(), cause)
	}
}

// The lock file names a PID that is not the holder's: one a daemon that is
// gone wrote there, left by a holder that could not write its own (the
// file opened read-only on a file system that is read-only now, or the
// holder between its lock and its write). The refusal names the process
// that holds the lock, as the kernel lists it in /proc/locks, not the
// file's PID: "stop it" with the file's PID would have an operator kill a
// process that has nothing to do with the lock (the PID reused), or look
// for one that is gone. Before, the refusal named the file's PID.
func TestStateLockRefusalNamesTheHolderNotAStalePID(t *testing.T) {
	// PID 1 in the file: a process that exists and is not the holder.
	locked, err := refusalOfALockHeldReadOnly(t)
	if locked.PID != os.Getpid() {
		t.Fatalf("the refusal names pid %d (%v); want the holder's, %d, not the file's 1", locked.PID, err, os.Getpid())
	}
}

// A state directory on a file system that is read-only, without the lock
// file yet (a node whose /var went read-only before the daemon's first
// start): the start goes on without the lock, and its one warning says why,
// "read-only file system". Before, it gave the error of the read-only open
// tried after it, "no such file or directory", which sent an operator to
// look for a missing directory. A real read-only bind mount, in a mount
// namespace of the test's own.
func TestStateLockOnAReadOnlyFileSystemSaysSo(t *testing.T) {
	if !testenv.InMountNamespace(t, "a read-only bind mount") {
		return
	}
	dir := t.TempDir()
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	assertGoesOnWithOneWarning(t, dir, "read-only file system")
}

// The holder not in /proc/locks as this process sees it (a holder in
// another PID namespace, listed as pid 0; /proc/locks hidden by a drop-in's
// ProcSubset=pid), and the lock file holding a PID that may be a gone
// daemon's: the refusal says the PID is the file's and may be stale, not
// "(pid 1)" as though the kernel had named it ("stop it" would send an
// operator to stop PID 1). Here /proc/locks is a path that does not exist,
// as ProcSubset=pid leaves it.
func TestStateLockRefusalSaysAPIDIsTheFilesWhereProcLocksNamesNone(t *testing.T) {
	defer func(p string) { procLocks = p }(procLocks)
	procLocks = filepath.Join(t.TempDir(), "locks")
	locked, err := refusalOfALockHeldReadOnly(t)
	const want = "another autopilot-health daemon (pid 1 as its lock file says, maybe stale: /proc/locks names no holder this process can see) uses this state directory"
	if locked.PID != 1 || !locked.PIDFromFile || !strings.Contains(err.Error(), want) {
		t.Fatalf("the refusal: %q (PID %d, from the file %v); want %q", err, locked.PID, locked.PIDFromFile, want)
	}
}

// refusalOfALockHeldReadOnly is lockState's refusal of a state directory
// whose lock file says "1" and is held by this process through a file
// opened read-only, its PID not written (as a daemon on a read-only file
// system holds it): the refusal and its error.
func refusalOfALockHeldReadOnly(t *testing.T) (*StateLockedError, error) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, StateLockName)
	if err := os.WriteFile(path, []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	_, err = lockState(dir, quietLog())
	var locked *StateLockedError
	if !errors.As(err, &locked) {
		t.Fatalf("lockState on a held lock: %v; want a refusal", err)
	}
	return locked, err
}
