package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The state directory's lock: one daemon per state_dir. Two daemons whose
// configurations name different control sockets but the same state_dir
// (one run by hand beside the unit's, a copy of the unit under another
// name) each saved state.json and tamper.json, the last save won, and the
// loser's view came back at the next start (a condition that flapped
// across a restart, a false BaselineCorrupt). The daemon takes an
// exclusive flock of a lock file in state_dir before it reads or writes
// any state there and holds it for its life; the kernel releases it when
// the process ends, however (SIGKILL included), so no lock is ever stale.
// The one-shot commands (check, status, tamper status and clear) never
// take it: they write no state (check's tamper keeper is read-only,
// tamper status reads tamper.json, status and tamper clear ask the
// daemon).

// StateLockName is the lock file's name in state_dir. It is never
// removed: a removed lock file and a new one at the same path would be
// two locks.
const StateLockName = "daemon.lock"

// maxLockHolder bounds what is read of the lock file (a PID and a newline).
const maxLockHolder = 64

// StateLockedError is the refusal of a start whose state_dir another
// daemon holds.
type StateLockedError struct {
	Dir, LockFile string
	// PID is the holder's, as /proc/locks lists it (lockHolder), else as
	// it wrote it in the lock file (PIDFromFile); 0 where neither says.
	PID int
	// PIDFromFile: /proc/locks named no holder this process can see (the
	// holder in another PID namespace, /proc/locks hidden:
	// ProcSubset=pid), and PID is the lock file's, which a daemon that is
	// gone may have left there.
	PIDFromFile bool
}

func (e *StateLockedError) Error() string {
	who := "another autopilot-health daemon"
	switch {
	case e.PID > 0 && e.PIDFromFile:
		who += fmt.Sprintf(" (pid %d as its lock file says, maybe stale: /proc/locks names no holder this process can see)", e.PID)
	case e.PID > 0:
		who += fmt.Sprintf(" (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s: %s uses this state directory (its lock file %s is locked); stop it, or give this one a state_dir of its own", e.Dir, who, e.LockFile)
}

// lockState takes the exclusive flock of dir's lock file without waiting,
// writes this process's PID in it, and returns its release. Held, it is
// another daemon's: a *StateLockedError naming the directory, the lock
// file and the holder's PID where the file holds one. A lock that cannot
// be taken for another reason (the directory absent and not creatable, a
// read-only file system with no lock file yet, something not a regular
// file at its path, flock not supported: ENOLCK, EOPNOTSUPP) is gone
// without, as the control socket's directory lock is (lockStart): a daemon
// that refused to start would leave the node without health reporting, on
// exactly the day /var is read-only. That is logged, once (a warning
// naming the lock file and the error). A lock file that exists on a file
// system that is read-only now is locked read-only (flock needs no write
// access), without the PID.
func lockState(dir string, log *slog.Logger) (func(), error) {
	path := filepath.Join(dir, StateLockName)
	goOn := func(err error) (func(), error) {
		log.Warn("state directory: its lock file cannot be locked, so the start goes on without the lock (a second daemon on this state directory would not be refused)", "lock_file", path, "err", err)
		return func() {}, nil
	}
	// The state writer's mode for the directory (report.WriteFileAtomic);
	// an error is the open's below.
	_ = os.MkdirAll(dir, 0o755)
	// No symlink followed (the PID written there would truncate its
	// target), and a FIFO not waited on.
	const how = syscall.O_NOFOLLOW | syscall.O_NONBLOCK
	writable := true
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|how, 0o600)
	if errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrPermission) {
		first := err
		f, err = os.OpenFile(path, os.O_RDONLY|how, 0)
		writable = false
		if errors.Is(err, fs.ErrNotExist) {
			// No lock file yet: why none could be made is the
			// first open's ("read-only file system"), not this one's.
			err = first
		}
	}
	if fi, lerr := os.Lstat(path); errors.Is(err, syscall.ELOOP) && lerr == nil && fi.Mode().Type() == fs.ModeSymlink {
		// O_NOFOLLOW's error: the kernel's words, "too many levels of
		// symbolic links", would send an operator looking for a loop.
		err = errors.New("it is a symbolic link, not followed (the PID written there would truncate its target): remove it")
	}
	if err != nil {
		return goOn(err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
		}
		return goOn(err)
	}
	switch err := flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		pid, fromFile := lockHolder(f)
		f.Close()
		return nil, &StateLockedError{Dir: dir, LockFile: path, PID: pid, PIDFromFile: fromFile}
	case err != nil:
		f.Close()
		return goOn(err)
	}
	if writable {
		// For the message of a start refused while this one holds it.
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err != nil {
			log.Debug("state directory: the PID not written in its lock file (a refused start will not name it)", "lock_file", path, "err", err)
		}
	}
	return func() { f.Close() }, nil
}

// lockHolder is the PID of the process that holds the lock on f, as the
// kernel lists it in /proc/locks, where it lists it; else the PID the
// holder wrote in the lock file; 0 where there is none to read. The
// file's PID alone may be another's: a daemon that is gone wrote it, and
// the holder could not write its own (the file opened read-only on a file
// system that is read-only now, or the holder between its lock and its
// write), and "stop it" would name a process that has nothing to do with
// the lock: fromFile says the PID is the file's, for the refusal to say so.
func lockHolder(f *os.File) (pid int, fromFile bool) {
	if pid := procLocksHolder(f, procLocks); pid > 0 {
		return pid, false
	}
	b, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, maxLockHolder), maxLockHolder))
	if err != nil {
		return 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// procLocks is the kernel's list of the locks held (the daemon's own
// /proc, not the host_root's: the lock is the daemon's); a variable for
// tests (a /proc that hides it: ProcSubset=pid).
var procLocks = "/proc/locks"

// maxProcLocks bounds what is read of /proc/locks (a line is about 50
// bytes).
const maxProcLocks = 4 << 20

// procLocksHolder is the PID /proc/locks gives for the FLOCK held on f's
// inode, 0 where it lists none (the file unreadable, a holder in a PID
// namespace this process does not see, which the kernel lists as 0 or
// -1). A line is "N: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF",
// the device's numbers in hex; a waiter's is "N: -> FLOCK ...".
func procLocksHolder(f *os.File, locks string) int {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0
	}
	return procLocksHolderOf(&st, locks)
}

// StateLockHolder is the PID of the daemon that holds the lock of the
// state directory dir (its lock file's FLOCK, as /proc/locks lists it): a
// daemon runs on dir, from before its state is read at start until its
// final saves are done at its stop. 0 where none does, or it cannot be
// told (the lock file not there or not reachable: state_dir is root's;
// a holder in a PID namespace this process does not see). The clients of
// the daemon's sockets (status, reload, tamper clear) ask it when nothing
// answers on a socket, and do not take the lock.
func StateLockHolder(dir string) int {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, StateLockName), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	return procLocksHolderOf(&st, procLocks)
}

// procLocksHolderOf is procLocksHolder for the file st describes.
func procLocksHolderOf(st *syscall.Stat_t, locks string) int {
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	lf, err := os.Open(locks)
	if err != nil {
		return 0
	}
	defer lf.Close()
	sc := bufio.NewScanner(io.LimitReader(lf, maxProcLocks))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}
