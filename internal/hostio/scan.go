package hostio

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Kind is what a protected path is.
type Kind string

const (
	KindFile    Kind = "file"
	KindDir     Kind = "dir"
	KindSymlink Kind = "symlink"
	KindOther   Kind = "other"
	// KindUnreadable: the scan could not read the path (its Error says
	// why; a path longer than PATH_MAX, an I/O error): recorded as such
	// rather than stopping the scan, so one path nobody can read neither
	// hides a change elsewhere nor keeps the baseline from being taken.
	KindUnreadable Kind = "unreadable"
)

// Entry is one protected path as the baseline holds it: what a change to
// its content, mode, owner or link target alters.
type Entry struct {
	Path string `json:"path"`
	Kind Kind   `json:"kind"`
	// Mode is the permission bits with setuid, setgid and sticky.
	Mode uint32 `json:"mode"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Size int64  `json:"size,omitempty"`
	// SHA256 is the content digest of a regular file.
	SHA256 string `json:"sha256,omitempty"`
	// Target is a symlink's target, as written (not followed).
	Target string `json:"target,omitempty"`
	// TooLarge: a regular file over MaxFileSize, recorded by size, mode
	// and owner without a digest (not read).
	TooLarge bool `json:"too_large,omitempty"`
	// Error is why a KindUnreadable path could not be read (not compared:
	// the kind is).
	Error string `json:"error,omitempty"`
}

// entryJSON is an Entry as JSON holds it. JSON strings are UTF-8: a name
// in another encoding (a byte such as 0xe9, Latin-1's "é") would be written
// as U+FFFD and read back as another name, so a path or target that is not
// valid UTF-8 is also written as its bytes (rawPath, rawTarget, base64),
// and those are read back. A valid one is written as before, nothing
// added: a baseline of such names keeps its digest.
type entryJSON struct {
	plainEntry
	RawPath   []byte `json:"rawPath,omitempty"`
	RawTarget []byte `json:"rawTarget,omitempty"`
}

type plainEntry Entry

// MarshalJSON writes e with its path and target exactly (entryJSON).
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{plainEntry: plainEntry(e)}
	if !utf8.ValidString(e.Path) {
		j.RawPath = []byte(e.Path)
	}
	if !utf8.ValidString(e.Target) {
		j.RawTarget = []byte(e.Target)
	}
	if j.RawPath == nil && j.RawTarget == nil {
		return json.Marshal(j.plainEntry)
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes: the exact path and target
// where their bytes are given.
func (e *Entry) UnmarshalJSON(b []byte) error {
	if !bytes.Contains(b, []byte(`"raw`)) { // the usual entry: no raw bytes
		*e = Entry{}
		return json.Unmarshal(b, (*plainEntry)(e))
	}
	var j entryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*e = Entry(j.plainEntry)
	if j.RawPath != nil {
		e.Path = string(j.RawPath)
	}
	if j.RawTarget != nil {
		e.Target = string(j.RawTarget)
	}
	return nil
}

// Limits bound a scan: a pattern that matches a huge tree (a typo such as
// "/var") stops at MaxEntries (a *LimitError, with the entries within the
// cap), and a file over MaxFileSize is recorded without its digest.
const (
	MaxEntries  = 10000
	MaxFileSize = 64 << 20
)

// Spec says which host paths are protected.
type Spec struct {
	// Patterns are absolute paths or globs (path.Match syntax, in any
	// component). A matched directory is protected with its whole tree.
	Patterns []string
	// Exclude are globs of paths (and trees) left out.
	Exclude []string
	// MaxEntries bounds the scan (0: the package's MaxEntries).
	MaxEntries int
}

// LimitError: the protected patterns match more than Limit paths. Scan
// returns it with the first Limit entries it read. With Bytes, the cap is
// the size of the baseline instead (the tamper state file's bound): the
// first Limit paths in the scan's order fit in Bytes, At does not.
type LimitError struct {
	Limit int
	// At is the first path beyond the cap.
	At    string
	Bytes int `json:",omitempty"`
}

func (e *LimitError) Error() string {
	if e.Bytes > 0 {
		return fmt.Sprintf("the protected paths' baseline is larger than %d bytes (at %s): narrow the patterns", e.Bytes, e.At)
	}
	return fmt.Sprintf("more than %d protected paths (at %s): narrow the patterns", e.Limit, e.At)
}

// Scan reads every protected path under root (the host root) and returns the
// entries sorted by path. Paths are host paths (root not included). A path
// that vanishes while it is read is left out: the next scan sees it gone. A
// path that cannot be read (stat, listing, reading or readlink fails) is an
// entry of KindUnreadable, and the scan goes on. Past spec.MaxEntries it stops and returns the entries read so far, sorted,
// with a *LimitError.
func Scan(root string, spec Spec) ([]Entry, error) {
	es, _, err := ScanNoting(root, spec)
	return es, err
}

// ScanNotes are the lines of host input a scan skipped because it could
// not parse them, beside its entries: the lines of root's
// /proc/self/mountinfo that the hidden mounts' reading split and that do
// not split (hiddenMounts).
type ScanNotes struct {
	MalformedMountinfo int `json:"malformedMountinfo,omitempty"`
	// FirstMalformed is the first of them, by its number and text.
	FirstMalformed *MalformedMountinfoError `json:"firstMalformed,omitempty"`
}

// ScanNoting is Scan, and what it skipped of its host input (ScanNotes).
func ScanNoting(root string, spec Spec) ([]Entry, ScanNotes, error) {
	hidden, notes := hiddenMounts(root)
	es, err := scan(root, spec, hidden)
	return es, notes, err
}

func scan(root string, spec Spec, hidden []hiddenMount) ([]Entry, error) {
	seen := map[string]bool{}
	var out []Entry
	limit := spec.MaxEntries
	if limit <= 0 {
		limit = MaxEntries
	}
	// index of each path in out, to mark one unreadable after the fact
	// (a directory whose listing fails after its stat succeeded).
	index := map[string]int{}
	unreadable := func(hostPath string, err error) {
		e := Entry{Path: hostPath, Kind: KindUnreadable, Error: errText(err)}
		if i, ok := index[hostPath]; ok {
			out[i] = e
			return
		}
		if seen[hostPath] || len(out) >= limit {
			return // excluded, or past the cap (reported as such)
		}
		seen[hostPath] = true
		index[hostPath] = len(out)
		out = append(out, e)
	}
	add := func(hostPath string) error {
		if seen[hostPath] || excluded(hostPath, spec.Exclude) {
			return nil
		}
		seen[hostPath] = true
		if len(out) >= limit {
			return &LimitError{Limit: limit, At: hostPath}
		}
		e, err := readEntry(root, hostPath)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			e = Entry{Path: hostPath, Kind: KindUnreadable, Error: errText(err)}
		}
		index[hostPath] = len(out)
		out = append(out, e)
		return nil
	}
	for _, pat := range spec.Patterns {
		// A pattern under a mount the sandbox hides matches nothing there,
		// whatever the host holds: it is unreadable, not absent.
		if h, ok := hiddenBy(hidden, GlobBase(pat)); ok && !excluded(GlobBase(pat), spec.Exclude) {
			unreadable(GlobBase(pat), hiddenError(h))
			continue
		}
		matches, failed, err := glob(HostJoin(root, pat))
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", pat, err)
		}
		for _, f := range failed {
			if hp := hostRel(root, f.path); !excluded(hp, spec.Exclude) {
				unreadable(hp, f.err)
			}
		}
		for _, m := range matches {
			hp := hostRel(root, m)
			if err := add(hp); err != nil {
				return limited(out, err)
			}
			fi, err := os.Lstat(m)
			if err != nil || !fi.IsDir() {
				continue
			}
			err = filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
				hp := hostRel(root, p)
				if err != nil {
					if !errors.Is(err, fs.ErrNotExist) && !excluded(hp, spec.Exclude) {
						unreadable(hp, err)
					}
					if d != nil && d.IsDir() {
						return filepath.SkipDir
					}
					return nil
				}
				if d.IsDir() && excluded(hp, spec.Exclude) {
					return filepath.SkipDir
				}
				return add(hp)
			})
			if err != nil {
				return limited(out, err)
			}
		}
	}
	// A hidden mount inside a protected tree: its (empty) directory was
	// read, the host's tree there was not. So for one a pattern's wildcard
	// passes through ("/*/.ssh" through /root): it matched nothing there.
	for _, h := range hidden {
		if spec.Covers(h.point) || spec.reaches(h.point) {
			if _, err := os.Lstat(HostJoin(root, h.point)); err == nil {
				unreadable(h.point, hiddenError(h))
			}
		}
	}
	sortEntries(out)
	return out, nil
}

// globFailure is a path glob could not read, and why.
type globFailure struct {
	path string
	err  error
}

// absent reports whether err says a path names nothing: it is not there
// (ENOENT), or a component on the way is not a directory (ENOTDIR). Any
// other error (EACCES, EIO, ELOOP) says nothing of what is there.
func absent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

// glob is filepath.Glob (the same matches, in the same order) that tells a
// path it cannot read from one that is not there: filepath.Glob reads any
// error of a stat, open or listing as "no match", so a protected file
// behind a directory it may not search, or a glob's directory it may not
// list, would be absent (reported removed, or left out of a baseline that
// then vouches for it). failed are the paths that could not be read (the
// pattern where it has no wildcard, else a directory it passes through)
// with the error; a path that is absent is neither matched nor failed.
func glob(pattern string) (matches []string, failed []globFailure, err error) {
	if _, err := filepath.Match(pattern, ""); err != nil {
		return nil, nil, err
	}
	if !hasMeta(pattern) {
		if _, err := os.Lstat(pattern); err != nil {
			if !absent(err) {
				failed = append(failed, globFailure{pattern, err})
			}
			return nil, failed, nil
		}
		return []string{pattern}, nil, nil
	}
	dir, file := filepath.Split(pattern)
	if dir == "" {
		dir = "."
	} else if dir != string(filepath.Separator) {
		dir = dir[:len(dir)-1] // the trailing separator
	}
	dirs := []string{dir}
	if hasMeta(dir) {
		if dir == pattern {
			return nil, nil, filepath.ErrBadPattern
		}
		if dirs, failed, err = glob(dir); err != nil {
			return nil, nil, err
		}
	}
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err == nil && fi.IsDir() {
			var names []string
			var f *os.File
			if f, err = os.Open(d); err == nil {
				names, err = f.Readdirnames(-1)
				f.Close()
			}
			slices.Sort(names)
			for _, n := range names {
				ok, merr := filepath.Match(file, n)
				if merr != nil {
					return nil, nil, merr
				}
				if ok {
					matches = append(matches, filepath.Join(d, n))
				}
			}
		}
		// A directory not there, or not a directory, holds no match; one
		// that cannot be stat'ed, opened or listed (whole) is unreadable.
		if err != nil && !absent(err) {
			failed = append(failed, globFailure{d, err})
		}
	}
	return matches, failed, nil
}

// hasMeta reports whether p holds a glob character (as filepath.Glob's).
func hasMeta(p string) bool { return strings.ContainsAny(p, `*?[\`) }

// hiddenMount is a mount point of this process's mount namespace over
// which the sandbox put something of its own; private: PrivateTmp='s
// directory, else one of systemd's inaccessible nodes.
type hiddenMount struct {
	point   string
	private bool
}

// hiddenMounts returns the mount points of this process's mount namespace
// (root's /proc/self/mountinfo) where systemd mounted one of its
// inaccessible nodes (/run/systemd/inaccessible/*): ProtectHome=yes does so
// on /home, /root and /run/user in both units, InaccessiblePaths= on each of
// its paths; and those where it mounted the unit's private temporary
// directory (<tmp>/systemd-private-<boot id>-<unit>-<random>/tmp):
// PrivateTmp=yes does so on /tmp and /var/tmp in both units. What the host
// has there is out of this process's sight: it finds an empty directory, or
// the unit's own files. None where mountinfo cannot be read (a fixture tree
// without one). A line that may be one and does not split is skipped and
// counted in the notes.
func hiddenMounts(root string) ([]hiddenMount, ScanNotes) {
	var notes ScanNotes
	b, err := os.ReadFile(HostJoin(root, "/proc/self/mountinfo"))
	if err != nil {
		return nil, notes
	}
	var out []hiddenMount
	for n, line := range MountinfoLines(b) {
		// A node's namespace holds thousands of pod mounts: split only
		// the few lines that can be one.
		if !bytes.Contains(line, []byte(" /systemd/inaccessible/")) && !bytes.Contains(line, []byte("/systemd-private-")) {
			continue
		}
		// Split by the one mountinfo reader: at each space, as the
		// kernel writes the fields (it escapes only space, tab, newline
		// and backslash in a path, so a \v or U+00A0 is the path's). A
		// line the kernel does not write is skipped, and counted.
		f, ok := SplitMountinfo(line)
		if !ok {
			if notes.MalformedMountinfo++; notes.FirstMalformed == nil {
				notes.FirstMalformed = &MalformedMountinfoError{Line: n, Text: string(line)}
			}
			continue
		}
		mroot, mp := UnescapeMountinfo(string(f.Root)), path.Clean(UnescapeMountinfo(string(f.MountPoint)))
		switch {
		case strings.HasPrefix(mroot, "/systemd/inaccessible/"):
			out = append(out, hiddenMount{point: mp})
		case (mp == "/tmp" || mp == "/var/tmp") && path.Base(mroot) == "tmp" && strings.HasPrefix(path.Base(path.Dir(mroot)), "systemd-private-"):
			out = append(out, hiddenMount{point: mp, private: true})
		}
	}
	return out, notes
}

// hiddenBy returns the hidden mount at or above host path p, if any.
func hiddenBy(hidden []hiddenMount, p string) (hiddenMount, bool) {
	for _, h := range hidden {
		if p == h.point || strings.HasPrefix(p, h.point+"/") {
			return h, true
		}
	}
	return hiddenMount{}, false
}

func hiddenError(h hiddenMount) error {
	if h.private {
		return fmt.Errorf("hidden by the sandbox: %s is the unit's private %s in this mount namespace, as PrivateTmp= makes", h.point, h.point)
	}
	return fmt.Errorf("hidden by the sandbox: %s is a systemd inaccessible mount in this mount namespace, as ProtectHome= and InaccessiblePaths= make", h.point)
}

// WildcardDirs returns the directories under root (host paths, sorted)
// that a pattern's wildcard passes through on the way to its last
// component: for "/etc/systemd/system/*.d/*.conf", each directory matching
// /etc/systemd/system/*.d, a symlink to a directory included (the scan's
// glob follows it from this process's "/", and reads the drop-ins in its
// target). A protected file appears in one that no entry names yet (a
// drop-in directory created empty, or a link's target holding none), so it
// is watched too.
// Excluded directories are left out, and at most MaxEntries are returned
// (a pattern whose wildcard matches a huge tree).
func WildcardDirs(root string, spec Spec) []string {
	set := map[string]bool{}
	for _, pat := range spec.Patterns {
		parts := components(pat)
		for k := range len(parts) - 1 {
			prefix := "/" + strings.Join(parts[:k+1], "/")
			if !strings.ContainsAny(prefix, `*?[\`) {
				continue
			}
			matches, _ := filepath.Glob(HostJoin(root, prefix))
			for _, m := range matches {
				hp := hostRel(root, m)
				if len(set) >= MaxEntries || excluded(hp, spec.Exclude) {
					continue
				}
				// Stat, not Lstat: a match that is a symlink to a
				// directory (kubelet.service.d -> /srv/dropins) is listed
				// by the glob through the link, as the kernel follows it,
				// and watched the same way (tamper.Watcher follows it).
				if fi, err := os.Stat(m); err == nil && fi.IsDir() {
					set[hp] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for d := range set {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// components are a host path's names, root first ("/etc/cni/" ->
// [etc cni]).
func components(p string) []string { return strings.Split(strings.Trim(path.Clean(p), "/"), "/") }

// GlobBase is a pattern up to its first component with a glob character
// ("/home/*/.ssh" -> "/home"), the whole pattern where it has none.
func GlobBase(p string) string {
	parts := strings.Split(path.Clean(p), "/")
	for i, c := range parts {
		if strings.ContainsAny(c, `*?[\`) {
			return path.Clean("/" + strings.Join(parts[:i], "/"))
		}
	}
	return path.Clean(p)
}

// errText is why a path could not be read, without the path (stable from
// one scan to the next).
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

func sortEntries(out []Entry) {
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
}

// limited returns the entries read so far with a *LimitError, and nothing
// with any other error.
func limited(out []Entry, err error) ([]Entry, error) {
	var le *LimitError
	if errors.As(err, &le) {
		sortEntries(out)
		return out, err
	}
	return nil, err
}

// reaches reports whether a pattern's wildcard goes on below host path p:
// p's components match its first ones, it has more, and its fixed prefix
// is above p (the pattern "/*/.ssh" reaches /root; "/root/.ssh" is under
// it, which Scan records as such), p not excluded.
func (s Spec) reaches(p string) bool {
	p = path.Clean(p)
	pc := strings.Split(strings.Trim(p, "/"), "/")
	for _, pat := range s.Patterns {
		tc := components(pat)
		if base := GlobBase(pat); len(tc) <= len(pc) || base == p || strings.HasPrefix(base, p+"/") {
			continue
		}
		ok := true
		for i := range pc {
			if m, _ := path.Match(tc[i], pc[i]); !m {
				ok = false
				break
			}
		}
		if ok && !excluded(p, s.Exclude) {
			return true
		}
	}
	return false
}

// Covers reports whether a scan with s reads host path p where it exists:
// p matches a pattern or lies in the tree of one, and neither p nor a
// directory between the match and p is excluded.
func (s Spec) Covers(p string) bool { return s.firstCovering(p) >= 0 }

// firstCovering is the index of the first pattern whose match or tree
// holds host path p, neither p nor a directory between the match and p
// excluded; -1 when none does.
func (s Spec) firstCovering(p string) int {
	pc := components(p)
	for j, pat := range s.Patterns {
		tc := components(pat)
		if len(tc) > len(pc) {
			continue
		}
		ok := true
		for i := range tc {
			if m, _ := path.Match(tc[i], pc[i]); !m {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		for k := len(tc); k <= len(pc) && ok; k++ {
			ok = !excluded("/"+strings.Join(pc[:k], "/"), s.Exclude)
		}
		if ok {
			return j
		}
	}
	return -1
}

// ReadBefore reports whether a scan with s that stopped at the cap at
// host path at (LimitError.At) had read where host path p is: Scan reads
// the patterns in order, and a pattern's matches and their trees in path
// order, name by name (filepath.Glob sorts its matches, WalkDir walks a
// directory's names sorted), a path met twice read at its first pattern.
// So p was read when the first pattern that covers it comes before at's,
// or is at's and p comes before at in that order. A path no pattern
// covers is not.
func (s Spec) ReadBefore(p, at string) bool {
	ip, ia := s.firstCovering(p), s.firstCovering(at)
	if ip < 0 || ia < 0 {
		return false
	}
	return ip < ia || ip == ia && comparePathOrder(p, at) < 0
}

// SortScanOrder sorts entries in the order Scan reads them (ReadBefore:
// the patterns in order, a pattern's paths name by name); entries no
// pattern covers come first, by path.
func (s Spec) SortScanOrder(es []Entry) {
	rank := make(map[string]int, len(es))
	for _, e := range es {
		rank[e.Path] = s.firstCovering(e.Path)
	}
	slices.SortStableFunc(es, func(a, b Entry) int {
		if c := rank[a.Path] - rank[b.Path]; c != 0 {
			return c
		}
		if rank[a.Path] < 0 {
			return strings.Compare(a.Path, b.Path)
		}
		return comparePathOrder(a.Path, b.Path)
	})
}

// comparePathOrder orders host paths as a walk meets them: name by name,
// a directory before what it holds.
func comparePathOrder(a, b string) int {
	ac := components(a)
	bc := components(b)
	for i := range min(len(ac), len(bc)) {
		if c := strings.Compare(ac[i], bc[i]); c != 0 {
			return c
		}
	}
	return len(ac) - len(bc)
}

func excluded(hostPath string, exclude []string) bool {
	for _, x := range exclude {
		if ok, _ := path.Match(x, hostPath); ok {
			return true
		}
	}
	return false
}

// HostJoin is host path p under root ("" or "/": p itself).
func HostJoin(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	return filepath.Join(root, p)
}

func hostRel(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return "/" + r
}

// afterLstat, where set (tests), runs between readEntry's Lstat and its
// read of the file: a writer's change in that moment.
var afterLstat func(full string)

func readEntry(root, hostPath string) (Entry, error) {
	full := HostJoin(root, hostPath)
	fi, err := os.Lstat(full)
	if err != nil {
		return Entry{}, err
	}
	if afterLstat != nil {
		afterLstat(full)
	}
	e := Entry{Path: hostPath, Mode: uint32(fi.Mode().Perm())}
	if fi.Mode()&fs.ModeSetuid != 0 {
		e.Mode |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		e.Mode |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		e.Mode |= 0o1000
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
	}
	switch {
	case fi.Mode().IsRegular():
		e.Kind, e.Size = KindFile, fi.Size()
		if fi.Size() > MaxFileSize {
			e.TooLarge = true
			break
		}
		sum, size, err := fileDigest(full)
		switch {
		case errors.Is(err, ErrNotRegular):
			// Swapped for something else since the Lstat: recorded as
			// such, the next scan reads it again.
			e.Kind, e.Size = KindOther, 0
		case err != nil:
			return Entry{}, err
		case size > MaxFileSize:
			e.Size, e.TooLarge = size, true
		default:
			// The size of the bytes digested, not the Lstat's: a file
			// that grew or shrank in between would record a size and a
			// digest of two contents, and a later scan that reads one
			// content would find it changed.
			e.SHA256, e.Size = sum, size
		}
	case fi.IsDir():
		e.Kind = KindDir
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Kind = KindSymlink
		if e.Target, err = os.Readlink(full); err != nil {
			return Entry{}, err
		}
	default:
		e.Kind = KindOther
	}
	return e, nil
}

// fileDigest returns the SHA-256 of the regular file p and the bytes read
// (MaxFileSize+1 at most: a file that grew past the cap has no digest).
func fileDigest(p string) (string, int64, error) {
	f, err := OpenRegular(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if err := notPseudo(f); err != nil {
		return "", 0, err
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return "", 0, err
	}
	if n > MaxFileSize {
		return "", n, nil
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Describe is a short form of what the entry is now (a finding's detail).
func (e Entry) Describe() string {
	if e.Kind == KindUnreadable {
		return "unreadable: " + e.Error
	}
	s := fmt.Sprintf("%s mode %04o owner %d:%d", e.Kind, e.Mode, e.UID, e.GID)
	if e.SHA256 != "" {
		s += " sha256 " + e.SHA256
	}
	if e.TooLarge {
		s += fmt.Sprintf(" size %d (over %d bytes, not digested)", e.Size, MaxFileSize)
	}
	if e.Kind == KindSymlink {
		s += " -> " + e.Target
	}
	return s
}

// Relevant reports whether a change at host path p can change what the
// patterns protect: p matches a pattern, lies in a protected tree, or is a
// directory on the way to one.
func (s Spec) Relevant(p string) bool {
	pc := components(p)
	for _, pat := range s.Patterns {
		tc := components(pat)
		n := min(len(pc), len(tc))
		ok := true
		for i := range n {
			if m, _ := path.Match(tc[i], pc[i]); !m {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// pseudoFS are the kernel's own filesystems, by statfs magic: their
// "regular files" are interfaces, and some reads act (a read of /proc/kmsg
// takes records from the kernel log).
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC: "proc", unix.SYSFS_MAGIC: "sysfs", unix.DEBUGFS_MAGIC: "debugfs",
	unix.TRACEFS_MAGIC: "tracefs", unix.SECURITYFS_MAGIC: "securityfs", unix.CGROUP_SUPER_MAGIC: "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2", unix.BPF_FS_MAGIC: "bpf", unix.EFIVARFS_MAGIC: "efivarfs",
	unix.PSTOREFS_MAGIC: "pstore", 0x62656570: "configfs",
}

// ErrPseudoFile: a file of the kernel's own filesystems (proc, sysfs...),
// which the scan neither reads nor digests, however it was reached (a
// symlink in a directory on the way included).
var ErrPseudoFile = errors.New("a file of a kernel filesystem, not read")

func notPseudo(f *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstatfs", Path: f.Name(), Err: err}
	}
	if name, ok := pseudoFS[int64(st.Type)]; ok {
		return fmt.Errorf("%s: %w (%s)", f.Name(), ErrPseudoFile, name)
	}
	return nil
}
