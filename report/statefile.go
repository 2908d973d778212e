package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/syself/autopilot-health/internal/hostio"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// stateFile is the on-disk form of the store.
type stateFile struct {
	Version    int         `json:"version"`
	BootID     string      `json:"bootID"`
	SavedAt    time.Time   `json:"savedAt"`
	Conditions []Condition `json:"conditions"`
	// Parts are the parts of the conditions that several sources evaluate
	// (Store.SetPart), by condition type and part name: restored with
	// their condition in the same boot, so that the part that reports
	// first after a restart does not decide alone (a flap: the other
	// part's True lowered until it runs again).
	Parts map[string]map[string]Condition `json:"parts,omitempty"`
	// Memos are the values registered with Keep (this boot's only).
	Memos map[string]json.RawMessage `json:"memos,omitempty"`
	// Observed are the condition types whose transition time is a change
	// the store saw (Store.observed).
	Observed []string `json:"transitionsObserved,omitempty"`
}

// stateVersion is the state file's format. It has been 1 in every build,
// and every build ignores the fields it does not know: a build adds fields
// without raising it (an older build, after a rollback, reads the rest), and
// raises it only for a change an older build would misread, which every
// build before moves aside as corrupt (the conditions then taken over from
// the Node, the kept values lost).
const stateVersion = 1

// StateFileName is the file under the state directory.
const StateFileName = "state.json"

// snapshot returns the conditions and the kept values as of one instant:
// the keepers run under the same lock as the copy of the conditions.
func (s *Store) snapshot() ([]Condition, map[string]map[string]Condition, map[string]any, []string, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	conds := make([]Condition, 0, len(s.conds))
	var observed []string
	for _, c := range s.conds {
		conds = append(conds, c)
		if s.observed[c.Type] {
			observed = append(observed, c.Type)
		}
	}
	var parts map[string]map[string]Condition
	for t, ps := range s.parts {
		if len(ps) == 0 {
			continue
		}
		if parts == nil {
			parts = map[string]map[string]Condition{}
		}
		parts[t] = maps.Clone(ps)
	}
	asideConds, asideObserved := s.savedAsideLocked()
	conds = append(conds, asideConds...)
	observed = append(observed, asideObserved...)
	slices.SortFunc(conds, func(a, b Condition) int { return strings.Compare(a.Type, b.Type) })
	slices.Sort(observed)
	memos := make(map[string]any, len(s.memos)+len(s.keepers))
	for k, raw := range s.memos { // restored, and not (yet) kept by anyone: carried on
		memos[k] = raw
	}
	for k, fn := range s.keepers {
		if !s.last[k] {
			memos[k] = fn()
		}
	}
	for k := range s.last { // after the others (KeepLast)
		memos[k] = s.keepers[k]()
	}
	return conds, parts, memos, observed, s.encodedLocked(memos)
}

// Save writes the conditions and the kept values atomically (temp file,
// fsync, rename, fsync of the directory) to dir.
func (s *Store) Save(dir string, now time.Time) error {
	s.ReportWrites()
	b, gen, err := s.EncodeWrite(now)
	if err != nil {
		return err
	}
	err = WriteFileAtomic(filepath.Join(dir, StateFileName), b, 0o644)
	s.WriteEnded(gen, err)
	return err
}

// Encode returns what Save writes to the state file (StateFileName),
// saved at now: the daemon's state writer encodes under the store's lock
// and writes the file on a goroutine of its own (a write that blocks in
// the kernel then holds nothing but that goroutine).
func (s *Store) Encode(now time.Time) ([]byte, error) {
	b, _, err := s.EncodeWrite(now)
	return b, err
}

// EncodeWrite is Encode for a write whose end its writer tells WriteEnded
// with the generation returned here (see OnWritten).
func (s *Store) EncodeWrite(now time.Time) ([]byte, uint64, error) {
	conds, parts, memos, observed, gen := s.snapshot()
	sf := stateFile{Version: stateVersion, BootID: s.bootID, SavedAt: now, Conditions: conds, Parts: parts, Observed: observed}
	if len(memos) > 0 {
		sf.Memos = make(map[string]json.RawMessage, len(memos))
		for k, v := range memos {
			b, err := marshalState(v, false)
			if err != nil {
				return nil, gen, fmt.Errorf("state %s: %w", k, err)
			}
			sf.Memos[k] = b
		}
	}
	b, err := marshalState(sf, true)
	if err != nil {
		return nil, gen, err
	}
	return b, gen, nil
}

// marshalState encodes v for the state file: '<', '>' and '&' as they are,
// not as the 6 bytes of \u003c an HTML page needs (json.Marshal's): a
// kernel line of them took 6 times its length in the file, which its
// maxStateFile bound did not hold (JSON decoders read both forms, so every
// build reads the file either way). indented: two spaces, and a newline at
// the end.
func marshalState(v any, indented bool) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indented {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	if !indented {
		b = bytes.TrimSuffix(b, []byte("\n"))
	}
	return b, nil
}

// WriteFileAtomic replaces path with data so that a crash at any moment
// leaves either the old file or the new one, whole: a temp file in the same
// directory, fsync, rename, fsync of the directory.
//
// The temp file and the directory are opened by x/sys/unix, not os: os
// registers every file it opens with the runtime's poller, which for a
// regular file or a directory is four fcntl(2) and an epoll_ctl(2) that the
// kernel refuses, and os.CreateTemp's deferred os.Remove tried unlink(2) and
// rmdir(2) of the name already renamed: 14 system calls of the 24 of a save
// (the idle daemon saves its state file one to two times a minute;
// TestWriteFileAtomicSystemCalls). The calls are ordinary ones (a disk's
// fsync may wait).
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fd, tmp, err := createTemp(dir, filepath.Base(path)+".tmp")
	if err != nil {
		return err
	}
	renamed := false
	defer func() {
		if !renamed {
			unix.Unlink(tmp)
		}
	}()
	if err := writeFD(fd, data); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "write", Path: tmp, Err: err}
	}
	if err := ignoringEINTR(func() error { return unix.Fchmod(fd, uint32(perm.Perm())) }); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "chmod", Path: tmp, Err: err}
	}
	if err := ignoringEINTR(func() error { return unix.Fsync(fd) }); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "sync", Path: tmp, Err: err}
	}
	if err := unix.Close(fd); err != nil {
		return &os.PathError{Op: "close", Path: tmp, Err: err}
	}
	if err := os.Rename(tmp, path); err != nil {
		// Named by the file replaced, not the temp file (a new name each
		// time): the same failure reads the same in every retry's log.
		var le *os.LinkError
		if errors.As(err, &le) {
			err = &os.PathError{Op: "rename", Path: path, Err: le.Err}
		}
		return err
	}
	renamed = true
	var d int
	if err := ignoringEINTR(func() (err error) {
		d, err = unix.Open(dir, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECTORY, 0)
		return err
	}); err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	if err := ignoringEINTR(func() error { return unix.Fsync(d) }); err != nil {
		return &os.PathError{Op: "sync", Path: dir, Err: err}
	}
	return nil
}

// createTemp creates a new file in dir named prefix followed by digits, as
// os.CreateTemp(dir, prefix+"*") does (mode 0600, O_EXCL), and returns its
// descriptor and name.
func createTemp(dir, prefix string) (int, string, error) {
	for try := 0; ; try++ {
		name := filepath.Join(dir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10))
		var fd int
		err := ignoringEINTR(func() (err error) {
			fd, err = unix.Open(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
			return err
		})
		if err == nil {
			return fd, name, nil
		}
		if err == unix.EEXIST && try < 10000 {
			continue
		}
		return -1, "", &os.PathError{Op: "createtemp", Path: filepath.Join(dir, prefix+"*"), Err: err}
	}
}

// writeFD writes all of data to fd.
func writeFD(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		data = data[n:]
	}
	return nil
}

// ignoringEINTR calls fn until it returns anything but EINTR.
func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}

// RemoveTemps removes the temp files WriteFileAtomic left next to path
// (a crash between their creation and the rename): the regular files
// named <base of path>.tmp followed by digits, os.CreateTemp's names. Anything
// else is left alone, a symlink of that name too (never followed). It
// returns how many it removed. For the start of the only process that
// writes path: a save running meanwhile would lose its temp file.
func RemoveTemps(path string) (int, error) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return 0, err
	}
	prefix := filepath.Base(path) + ".tmp"
	n := 0
	var firstErr error
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(filepath.Dir(path), e.Name())); err != nil {
			if firstErr == nil && !errors.Is(err, fs.ErrNotExist) {
				firstErr = err
			}
			continue
		}
		n++
	}
	return n, firstErr
}

// LoadResult says what Load restored.
type LoadResult struct {
	Restored int // conditions restored
	Dropped  int // conditions dropped: held until reboot, and the boot changed; or a type (or status) not in the catalog
	// Aside counts the conditions of a known type whose reason this build
	// does not know: not restored, their status and transition time kept
	// for the first evaluation of their type (asideCond).
	Aside int
	// Corrupt is set when the file could not be read or parsed; the store
	// starts empty. It was moved aside to CorruptPath (MoveAside); when it
	// could not be, CorruptPath is empty and MoveErr says why.
	Corrupt     error
	CorruptPath string
	MoveErr     error
	// AsideRemoved are the older files moved aside that MoveAside removed
	// to keep KeepAside; AsideRemoveErr why one could not be.
	AsideRemoved   []string
	AsideRemoveErr error
	// TempsRemoved counts the temp files of the state file a save left
	// (RemoveTemps); TempsErr says why the directory could not be cleaned.
	TempsRemoved int
	TempsErr     error
}

// maxStateFile bounds the state file Load reads: the daemon writes a few
// KiB (one entry per catalog condition, messages capped at MaxMessageLen,
// a few kept values), so a larger file is not one it wrote.
const maxStateFile = 4 << 20

// Load restores the store from dir. A missing file is not an error. Kernel
// conditions (held until reboot) are restored only when the boot is the same;
// conditions held forever and check conditions are always restored, so that a
// restart neither flaps them nor resets their transition times; a time more
// than futureSlack after the store's clock (saved while the clock was ahead)
// is taken as now, and Redaters are told; a missing (zero) one is taken as
// the file's save time, and Redaters are told too. Anything
// else at the path that is not a state file of this version (a read error,
// a directory, a symlink, a FIFO, a file over maxStateFile, JSON that does
// not parse) is moved aside (MoveAside: never over an earlier one, the
// newest KeepAside kept) and reported in the result, and the store starts empty: a daemon that
// refused to start would leave the node without health reporting. Temp
// files of the state file that a crash left are removed first
// (RemoveTemps). The error is always nil.
func (s *Store) Load(dir string) (LoadResult, error) {
	path := filepath.Join(dir, StateFileName)
	removed, rerr := RemoveTemps(path)
	b, err := ReadRegular(path, maxStateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return LoadResult{TempsRemoved: removed, TempsErr: rerr}, nil
	}
	var sf stateFile
	if err == nil {
		err = json.Unmarshal(b, &sf)
		if err == nil && sf.Version != stateVersion {
			err = fmt.Errorf("unsupported state version %d", sf.Version)
		}
	}
	if err != nil {
		aside, merr := MoveAside(path)
		return LoadResult{Corrupt: err, CorruptPath: aside.To, MoveErr: merr, AsideRemoved: aside.Removed, AsideRemoveErr: aside.RemoveErr,
			TempsRemoved: removed, TempsErr: rerr}, nil
	}
	res := LoadResult{TempsRemoved: removed, TempsErr: rerr}
	var restored []Condition
	type redate struct {
		c   Condition // as restored
		was time.Time // its transition time as saved
	}
	var redates []redate
	s.mu.Lock()
	for _, c := range sf.Conditions {
		desc, ok := Lookup(c.Type)
		if !ok || !knownStatus(c.Status) {
			res.Dropped++
			continue
		}
		if desc.Hold == HoldUntilReboot && sf.BootID != s.bootID {
			res.Dropped++
			continue
		}
		// A held True (a kernel condition of this boot, a tamper
		// condition) is restored under a reason this build knows.
		c, _ = heldUnderAKnownReason(desc, c)
		raw := c
		unknownReason := !desc.ValidReason(c.Status, c.Reason)
		// Capped as Set caps it: a state file the daemon did not write
		// as it is (by hand, another build) must not put a longer
		// message on the Node.
		c.Message = CapMessage(c.Message)
		// Times saved while the clock was ahead are taken as now.
		was := c.LastTransitionTime
		var future bool
		c.LastTransitionTime, future = s.notFutureLocked(was)
		c.LastUpdateTime, _ = s.notFutureLocked(c.LastUpdateTime)
		observed := slices.Contains(sf.Observed, c.Type)
		if was.IsZero() {
			// No transition time (a file edited by hand, the field
			// dropped): the status held when the file was saved, since
			// when is not known. Taken as the save time (now, when that
			// is missing), the latest it can be, once: the next save
			// keeps it. Not a change the store saw: the Node's time for
			// the same status is the better word (Adopt). Before, the
			// zero time stayed while the status held, and the Node's
			// condition was written without one.
			c.LastTransitionTime = s.savedAtLocked(sf.SavedAt)
			if c.LastUpdateTime.Before(c.LastTransitionTime) {
				c.LastUpdateTime = c.LastTransitionTime
			}
			observed, future = false, true
		}
		if unknownReason {
			// Not restored (this build cannot name it), but its status
			// and transition time go to the first Set of its type, and
			// it is saved back as read until then (asideCond).
			if _, ok := s.conds[c.Type]; ok {
				res.Dropped++ // the type twice: the known reason stays
				continue
			}
			if _, ok := s.aside[c.Type]; !ok {
				res.Aside++
			}
			s.loadAsideLocked(raw, c, observed)
			continue
		}
		if _, ok := s.aside[c.Type]; ok {
			delete(s.aside, c.Type) // the type twice: the known reason stays
			res.Aside--
			res.Dropped++
		}
		s.conds[c.Type] = c
		s.observed[c.Type] = observed
		delete(s.evaluatedHere, c.Type)
		delete(s.changedHere, c.Type)
		restored = append(restored, c)
		if future {
			redates = append(redates, redate{c, was})
		}
	}
	if sf.BootID == s.bootID {
		for k, raw := range sf.Memos {
			s.memos[k] = raw
		}
		// The parts of a restored condition, this boot's only (the
		// kernel's part is about this boot's log).
		for t, ps := range sf.Parts {
			desc, _ := Lookup(t)
			if _, ok := s.conds[t]; !ok {
				continue
			}
			for name, pc := range ps {
				if pc.Type != t || !desc.ValidReason(pc.Status, pc.Reason) ||
					!slices.ContainsFunc(desc.Parts, func(p Part) bool { return p.Name == name }) {
					continue
				}
				if s.parts[t] == nil {
					s.parts[t] = map[string]Condition{}
				}
				pc.Message = CapMessage(pc.Message)
				s.parts[t][name] = pc
				if s.restoredParts == nil {
					s.restoredParts = map[string][]string{}
				}
				s.restoredParts[t] = append(s.restoredParts[t], name)
			}
		}
	}
	// A condition with parts restored without them (a state file of an
	// earlier version, or of another boot): its parts are what it says,
	// as when the Node's word replaces it (seedPartsLocked), so the part
	// that reports first does not decide alone; they count as restored.
	for _, c := range restored {
		desc, _ := Lookup(c.Type)
		if len(desc.Parts) == 0 || len(s.parts[c.Type]) > 0 {
			continue
		}
		s.seedPartsLocked(desc, c)
		if s.restoredParts == nil {
			s.restoredParts = map[string][]string{}
		}
		for _, p := range desc.Parts {
			s.restoredParts[c.Type] = append(s.restoredParts[c.Type], p.Name)
		}
	}
	obs := s.observers
	s.mu.Unlock()
	res.Restored = len(restored)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	for _, r := range redates {
		redated(obs, r.c, r.was, "state file")
	}
	for _, c := range restored {
		for _, o := range obs {
			o.ConditionRestored(c)
		}
	}
	return res, nil
}

// savedAtLocked is the time a state file saved at t says its conditions
// held: t, or now when t is zero or lies in the future (notFutureLocked).
func (s *Store) savedAtLocked(t time.Time) time.Time {
	if !t.IsZero() {
		t, _ = s.notFutureLocked(t)
		return t
	}
	return s.nowLocked()
}

// nowLocked is the store's clock (SetClock), or the wall clock.
func (s *Store) nowLocked() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

// KeepAside bounds what MoveAside keeps of the files it moved aside: the
// newest KeepAside, the older ones removed. A state file corrupted at every
// start (a bad disk, a crash loop) would otherwise fill the state directory,
// up to the largest file a load accepts at each start.
const KeepAside = 5

// Aside is what MoveAside did: To is where p went; Removed are the older
// files moved aside that it removed to keep KeepAside, oldest first, and
// RemoveErr why one of them could not be removed (a directory that is not
// empty: it is kept, and the next oldest removed in its place).
type Aside struct {
	To        string
	Removed   []string
	RemoveErr error
}

// MoveAside moves whatever is at p (a file, a directory, a symlink, a FIFO)
// to <p>.corrupt, or <p>.corrupt.<n> for n one past the highest number
// taken (<p>.corrupt being 0), so that the numbers say the order they were
// moved in. It never replaces anything: an earlier file moved aside is kept
// (it may be evidence) until KeepAside newer ones are, then it is removed
// (asideNames: only names of that form; a directory only when empty).
func MoveAside(p string) (Aside, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return Aside{}, err
	}
	names, err := asideNames(p)
	if err != nil {
		return Aside{}, err
	}
	next := 0
	if len(names) > 0 {
		next = names[len(names)-1] + 1
	}
	var dst string
	for ; ; next++ {
		dst = asideName(p, next)
		err := renameNoReplace(p, dst, fi.Mode().IsRegular())
		if errors.Is(err, fs.ErrExist) { // a name asideNames does not count (a race, or "corrupt.01")
			continue
		}
		if err != nil {
			return Aside{}, err
		}
		break
	}
	a := Aside{To: dst}
	// KeepAside in all with it: the oldest go first; one that cannot be
	// removed is kept, and counts.
	excess := len(names) - (KeepAside - 1)
	for _, n := range names {
		if excess <= 0 {
			break
		}
		old := asideName(p, n)
		if err := os.Remove(old); err != nil {
			if a.RemoveErr == nil {
				a.RemoveErr = err
			}
			continue
		}
		a.Removed = append(a.Removed, old)
		excess--
	}
	return a, nil
}

// asideName is the n-th name MoveAside gives p.
func asideName(p string, n int) string {
	if n == 0 {
		return p + ".corrupt"
	}
	return p + ".corrupt." + strconv.Itoa(n)
}

// asideNames lists the numbers of the names MoveAside gave p that are
// there (asideName), in the order it gave them: <p>.corrupt (0), and
// <p>.corrupt.<n> with n written as strconv.Itoa writes it (no sign, no
// leading zero).
func asideNames(p string) ([]int, error) {
	ents, err := os.ReadDir(filepath.Dir(p))
	if err != nil {
		return nil, err
	}
	base := filepath.Base(p) + ".corrupt"
	var out []int
	for _, e := range ents {
		name := e.Name()
		if name == base {
			out = append(out, 0)
			continue
		}
		rest, ok := strings.CutPrefix(name, base+".")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(rest)
		if err != nil || n <= 0 || strconv.Itoa(n) != rest {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// renameNoReplace renames src to dst, failing with an error that matches
// fs.ErrExist when dst exists. A regular file is hard-linked, then unlinked
// (link never replaces); a directory, a symlink, a FIFO, or a file on a file
// system without hard links is renamed when dst does not exist (rename would
// replace it; only the daemon writes in its state directory, so nothing
// creates dst in between).
func renameNoReplace(src, dst string, regular bool) error {
	if regular {
		err := os.Link(src, dst)
		if err == nil {
			if err := os.Remove(src); err != nil {
				os.Remove(dst)
				return err
			}
			return nil
		}
		if errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if _, err := os.Lstat(dst); err == nil {
		return &os.PathError{Op: "rename", Path: dst, Err: fs.ErrExist}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Rename(src, dst)
}

// ErrNotRegular: the path names something other than a regular file.
var ErrNotRegular = hostio.ErrNotRegular

// OpenRegular opens p for reading only if it is a regular file
// (hostio.OpenRegular).
func OpenRegular(p string) (*os.File, error) { return hostio.OpenRegular(p) }

// ReadRegular reads at most max bytes of the regular file p (OpenRegular);
// a longer file is an error. For the daemon's own state files: what it
// never writes there is no state.
func ReadRegular(p string, max int64) ([]byte, error) {
	f, err := OpenRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", p, max)
	}
	return b, nil
}
