package tamper

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/syself/autopilot-health/report"
)

// StateFileName is the tamper state under the daemon's state directory,
// root-only (0600), apart from state.json (rewritten on every condition
// change, and readable): the baseline of this boot, the findings since the
// last clear, and the recorded root hashes first seen in this boot.
const StateFileName = "tamper.json"

// stateVersion is raised for a change an older build would misread or
// refuse: a field it knows changing meaning, a new entry kind, a field the
// baseline's digest covers (an older build's digest would not match, and a
// file that fails its digest loses its findings). An older build keeps the
// findings of a file of a higher version (NewerError); their fields never
// change. A field added elsewhere leaves it as it is: older builds ignore it,
// except those before 5040d15, which refuse the whole file (moved aside: a
// BaselineCorrupt finding, its findings lost); a field the daemon writes
// while it runs must then be one they know, or omitted while it is empty
// (TestStateReadByBuildsThatRefuseUnknownFields).
const stateVersion = 1

// MaxFindings caps the findings kept; beyond it the oldest make room (each
// condition keeping its latest) and are counted
// (State.FindingsDropped).
const MaxFindings = 64

// The sealed-layer finding kinds.
const (
	HashMismatch  ChangeKind = "root-hash-mismatch"
	LayerMissing  ChangeKind = "layer-missing"
	RecordAltered ChangeKind = "recorded-hash-altered"
)

// Finding is one change seen: a protected file that differs from the
// baseline, a corrupt baseline, or a sealed layer whose hash does not match.
// Findings stay until an operator clears them.
type Finding struct {
	// Condition is the condition the finding sets.
	Condition string     `json:"condition"`
	Path      string     `json:"path"`
	Kind      ChangeKind `json:"kind"`
	At        time.Time  `json:"at"`
	BootID    string     `json:"bootID"`
	Detail    string     `json:"detail,omitempty"`
}

// findingJSON is a Finding as JSON holds it: a path or detail that is not
// valid UTF-8 (a name in another encoding) is also written as its bytes
// (rawPath, rawDetail, base64) and read back from them, so a finding read
// back is the one recorded (a run after a restart that sees the same
// change again adds nothing); JSON alone would make it U+FFFD.
type findingJSON struct {
	plainFinding
	RawPath   []byte `json:"rawPath,omitempty"`
	RawDetail []byte `json:"rawDetail,omitempty"`
}

type plainFinding Finding

// MarshalJSON writes f with its path and detail exactly (findingJSON).
func (f Finding) MarshalJSON() ([]byte, error) {
	j := findingJSON{plainFinding: plainFinding(f)}
	if !utf8.ValidString(f.Path) {
		j.RawPath = []byte(f.Path)
	}
	if !utf8.ValidString(f.Detail) {
		j.RawDetail = []byte(f.Detail)
	}
	if j.RawPath == nil && j.RawDetail == nil {
		return json.Marshal(j.plainFinding)
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (f *Finding) UnmarshalJSON(b []byte) error {
	var j findingJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*f = Finding(j.plainFinding)
	if j.RawPath != nil {
		f.Path = string(j.RawPath)
	}
	if j.RawDetail != nil {
		f.Detail = string(j.RawDetail)
	}
	return nil
}

// Baseline is the protected files as they were when it was taken.
type Baseline struct {
	BootID  string    `json:"bootID"`
	TakenAt time.Time `json:"takenAt"`
	Entries []Entry   `json:"entries"`
	// Patterns and Exclude are the scope the baseline was taken with
	// (Spec's): a baseline compared under another scope (the protected
	// paths changed by a reload or a restart within the boot) is compared
	// only where both scopes reach. Absent in a baseline taken before they
	// were recorded: compared everywhere.
	Patterns []string `json:"patterns,omitempty"`
	Exclude  []string `json:"exclude,omitempty"`
	// Digest is "sha256:<hex>" of the canonical JSON of bootID, takenAt and
	// entries; the report publishes it, so a baseline swapped behind the
	// daemon's back shows as a new digest.
	Digest string `json:"digest"`
}

// ComputeDigest returns the digest of the baseline's content.
func (b *Baseline) ComputeDigest() string {
	raw, _ := json.Marshal(struct {
		BootID   string    `json:"bootID"`
		TakenAt  time.Time `json:"takenAt"`
		Entries  []Entry   `json:"entries"`
		Patterns []string  `json:"patterns,omitempty"`
		Exclude  []string  `json:"exclude,omitempty"`
	}{b.BootID, b.TakenAt.UTC(), b.Entries, b.Patterns, b.Exclude})
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// NewBaseline builds a baseline of the entries a scan with spec read,
// with its digest.
func NewBaseline(bootID string, at time.Time, spec Spec, entries []Entry) *Baseline {
	b := &Baseline{BootID: bootID, TakenAt: at.UTC().Truncate(time.Second), Entries: entries,
		Patterns: slices.Clone(spec.Patterns), Exclude: slices.Clone(spec.Exclude)}
	if b.Patterns == nil {
		b.Patterns = []string{}
	}
	if b.Entries == nil {
		b.Entries = []Entry{}
	}
	b.Digest = b.ComputeDigest()
	return b
}

// State is the content of the tamper state file.
type State struct {
	Version  int       `json:"version"`
	Baseline *Baseline `json:"baseline,omitempty"`
	Findings []Finding `json:"findings"`
	// FindingsDropped counts the findings that made room beyond MaxFindings.
	FindingsDropped int `json:"findingsDropped,omitempty"`
	// Tolerated are changes of tolerated paths (known writers): reported,
	// setting no condition; the MaxTolerated most recent, older ones
	// counted (ToleratedDropped).
	Tolerated        []Finding `json:"tolerated,omitempty"`
	ToleratedDropped int       `json:"toleratedDropped,omitempty"`
	// Sealed are the recorded root hashes first seen in a boot, per layer.
	Sealed *SealedSeen `json:"sealed,omitempty"`
	// Cleared is the last clear by an operator.
	Cleared *Clear `json:"cleared,omitempty"`
	// Retake: the next baseline is taken at once, without settling (after
	// an operator's clear: the node is running, and accepted as it is),
	// when it is taken in RetakeBoot, the boot of the clear. A clear whose
	// baseline a reboot came before accepted the files of its boot, not
	// the next's: that boot's baseline waits for baseline_after and
	// settles as every boot's (a file of an earlier build, without
	// RetakeBoot, is so too).
	Retake     bool   `json:"retake,omitempty"`
	RetakeBoot string `json:"retakeBoot,omitempty"`
}

// RetakeNow reports whether this boot's baseline is to be taken at once,
// without baseline_after and settling: an operator's clear in this boot
// dropped it (State.Retake).
func (s *State) RetakeNow(bootID string) bool { return s.Retake && s.RetakeBoot == bootID }

// SealedSeen is the recorded hashes as first read in one boot.
type SealedSeen struct {
	BootID   string            `json:"bootID"`
	Recorded map[string]string `json:"recorded"`
}

// Clear is an operator's clear of the tamper conditions.
type Clear struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	// By says who asked: the uid and pid of the peer, the login user.
	By string `json:"by"`
}

// AddFinding records f unless the same condition, path and kind is the last
// finding of that path; it reports whether it was added.
func (s *State) AddFinding(f Finding) bool {
	f = f.bounded()
	for i := len(s.Findings) - 1; i >= 0; i-- {
		if g := s.Findings[i]; g.Condition == f.Condition && g.Path == f.Path {
			if g.Kind == f.Kind && g.BootID == f.BootID && g.Detail == f.Detail {
				return false
			}
			break
		}
	}
	if len(s.Findings) >= MaxFindings {
		// Full: the oldest finding of a condition that has another one
		// makes room, so that every condition keeps its latest findings
		// and a new one always counts (dropping it instead let 64 files
		// added under a protected path hide a swapped sealed layer:
		// SealedOSTampered is decided from its findings).
		i := s.oldestSpare()
		s.Findings = slices.Delete(s.Findings, i, i+1)
		s.FindingsDropped++
	}
	s.Findings = append(s.Findings, f)
	return true
}

// oldestSpare is the index of the oldest finding whose condition has a
// later one too (the list is full, and of two conditions at most, so there
// is one).
func (s *State) oldestSpare() int {
	n := map[string]int{}
	for _, g := range s.Findings {
		n[g.Condition]++
	}
	for i, g := range s.Findings {
		if n[g.Condition] > 1 {
			return i
		}
	}
	return 0
}

// MaxTolerated caps the tolerated changes kept (the most recent).
const MaxTolerated = 16

// AddTolerated records a change of a tolerated path unless it is the last
// one recorded for that path; it reports whether it was added. Kept apart
// from the findings, so that a busy tolerated writer can never push a
// finding out of the capped list.
func (s *State) AddTolerated(f Finding) bool {
	f = f.bounded()
	for i := len(s.Tolerated) - 1; i >= 0; i-- {
		if g := s.Tolerated[i]; g.Path == f.Path {
			if g.Kind == f.Kind && g.BootID == f.BootID && g.Detail == f.Detail {
				return false
			}
			break
		}
	}
	s.Tolerated = append(s.Tolerated, f)
	if n := len(s.Tolerated) - MaxTolerated; n > 0 {
		s.Tolerated = slices.Delete(s.Tolerated, 0, n)
		s.ToleratedDropped += n
	}
	return true
}

// FindingsFor returns the findings that set a condition.
func (s *State) FindingsFor(cond string) []Finding {
	var out []Finding
	for _, f := range s.Findings {
		if f.Condition == cond {
			out = append(out, f)
		}
	}
	return out
}

// Marshal encodes the state; never one larger than MaxStateFileSize,
// which LoadState would refuse (an error instead: the state is not written).
func (s *State) Marshal() ([]byte, error) {
	s.Version = stateVersion
	if s.Findings == nil {
		s.Findings = []Finding{}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	if len(b)+1 > MaxStateFileSize {
		return nil, fmt.Errorf("the tamper state would be %d bytes, more than the %d it may be (not written)", len(b)+1, MaxStateFileSize)
	}
	return append(b, '\n'), nil
}

// MaxStateFileSize bounds the tamper state file, the one limit of its
// writer and its reader: the daemon never writes a larger one (the
// baseline is cut to MaxBaselineSize as the scan is to MaxEntries,
// FitBaseline, and the rest is bounded by its caps), and a larger one is
// not one it wrote (LoadState moves it aside). 16 MiB: what every earlier
// build reads, so a rollback reads what this one writes.
const MaxStateFileSize = 16 << 20

// MaxBaselineSize bounds the baseline's part of the state file, its JSON as
// Marshal writes it (a baseline of MaxEntries paths of a usual length is
// a few MiB). The rest, each part within its cap (MaxFindings and
// MaxTolerated findings of maxFindingJSON, the clear's texts clipped to
// maxClearText, the recorded hashes within maxSealedJSON, the boot of a
// retake within maxBootID), takes less than MaxStateFileSize -
// MaxBaselineSize (TestStateAtEveryCapFitsTheFile).
const MaxBaselineSize = 8 << 20

// maxFindingText caps a finding's path and detail (bytes, "…" included):
// PATH_MAX and a name, longer than any path the scan returns and any
// detail it writes (a symlink's target is under PATH_MAX); a longer one,
// which only a file the daemon did not write holds, is cut.
const maxFindingText = 4096 + 256

// maxFindingJSON bounds a finding's JSON: its path and detail within
// maxFindingText, each byte 6 at most (a \u escape) and the bytes of
// names that are not UTF-8 again in base64, its other fields short. A
// file with a longer one is not one the daemon wrote.
const maxFindingJSON = 2*maxFindingText*(6+2) + 1024

// maxClearText caps the clear's reason and who cleared (a control request
// is 8 KiB at most); a file's longer one is cut.
const maxClearText = 8 << 10

// maxSealedJSON bounds the recorded hashes first seen (a file of 64 KiB
// at most, of at most 64 layers); a file with more is not one the daemon
// wrote.
const maxSealedJSON = 1 << 20

// maxBootID bounds a boot ID kept (RetakeBoot; the kernel's are 36
// bytes); a file with a longer one is not one the daemon wrote.
const maxBootID = 256

// bounded returns f with its path and detail within maxFindingText.
func (f Finding) bounded() Finding {
	f.Path = clipTo(f.Path, maxFindingText)
	f.Detail = clipTo(f.Detail, maxFindingText)
	return f
}

// clipTo cuts s to n bytes, ending in "…" when cut (on a rune boundary
// where s is UTF-8 there).
func clipTo(s string, n int) string { return report.Cut(s, n, "…") }

// checkBounds checks what the baseline's digest does not cover against
// the caps the daemon writes within (MaxStateFileSize - MaxBaselineSize
// in all), cutting the texts it cuts itself (a file of an earlier build,
// which did not cut a finding's detail, reads as the same findings).
func (s *State) checkBounds() error {
	for _, l := range []*[]Finding{&s.Findings, &s.Tolerated} {
		for i, f := range *l {
			f = f.bounded()
			(*l)[i] = f
			if b, _ := json.Marshal(f); len(b) > maxFindingJSON {
				return fmt.Errorf("a finding of %d bytes, more than any the daemon writes (%d)", len(b), maxFindingJSON)
			}
		}
	}
	if c := s.Cleared; c != nil {
		c.Reason, c.By = clipTo(c.Reason, maxClearText), clipTo(c.By, maxClearText)
	}
	if s.Sealed != nil {
		if b, _ := json.Marshal(s.Sealed); len(b) > maxSealedJSON {
			return fmt.Errorf("recorded hashes of %d bytes, more than the daemon keeps (%d)", len(b), maxSealedJSON)
		}
	}
	if len(s.RetakeBoot) > maxBootID {
		return fmt.Errorf("a boot ID of %d bytes, more than %d", len(s.RetakeBoot), maxBootID)
	}
	return nil
}

// ParseState decodes a tamper state file and checks it: version, sorted
// unique entries, the baseline's digest. Any error means the file is not
// one the daemon wrote as it is now. Fields it does not know are ignored:
// a newer build adds fields without raising the version (it raises it only
// for a change an older build would misread), and the build it rolls back
// to reads the rest (refusing the file moved it aside, losing its findings
// and setting NodeTampered on every node rolled back). An unknown field
// gains a forger nothing: the baseline's digest covers the fields known,
// and a finding dropped from the file is not hidden by anything added.
func ParseState(b []byte) (*State, error) {
	if len(b) > MaxStateFileSize {
		return nil, fmt.Errorf("%d bytes, larger than any state the daemon writes (%d)", len(b), MaxStateFileSize)
	}
	var head struct {
		Version  int       `json:"version"`
		Findings []Finding `json:"findings"`
	}
	if json.Unmarshal(b, &head) == nil && head.Version > stateVersion {
		return nil, &NewerError{Version: head.Version, Findings: knownFindings(head.Findings)}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var s State
	if err := dec.Decode(&s); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data after the state")
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("unsupported version %d", s.Version)
	}
	if bl := s.Baseline; bl != nil {
		if bl.BootID == "" || bl.TakenAt.IsZero() {
			return nil, errors.New("baseline without boot ID or time")
		}
		if len(bl.Entries) > MaxEntries {
			return nil, fmt.Errorf("baseline has %d entries, more than %d", len(bl.Entries), MaxEntries)
		}
		for i, e := range bl.Entries {
			if e.Path == "" || e.Path[0] != '/' {
				return nil, fmt.Errorf("baseline entry %d: path %q is not absolute", i, e.Path)
			}
			if i > 0 && bl.Entries[i-1].Path >= e.Path {
				return nil, fmt.Errorf("baseline entry %d: %q is not sorted after %q", i, e.Path, bl.Entries[i-1].Path)
			}
			if !slices.Contains([]Kind{KindFile, KindDir, KindSymlink, KindOther, KindUnreadable}, e.Kind) {
				return nil, fmt.Errorf("baseline entry %s: unknown kind %q", e.Path, e.Kind)
			}
		}
		if got := bl.ComputeDigest(); got != bl.Digest {
			return nil, fmt.Errorf("baseline digest is %s, its content's is %s (the file was altered)", bl.Digest, got)
		}
	}
	if len(s.Findings) > MaxFindings {
		return nil, fmt.Errorf("%d findings, more than %d", len(s.Findings), MaxFindings)
	}
	if len(s.Tolerated) > MaxTolerated {
		return nil, fmt.Errorf("%d tolerated changes, more than %d", len(s.Tolerated), MaxTolerated)
	}
	if err := s.checkBounds(); err != nil {
		return nil, err
	}
	return &s, nil
}

// NewerError: the state file is of a higher version than this build's, one
// a newer build wrote (a rollback) over a change this build would misread.
// Findings are what the file's findings say: they keep their fields and
// meaning in every version, so that a rollback never drops one.
type NewerError struct {
	Version  int
	Findings []Finding
}

func (e *NewerError) Error() string {
	return fmt.Sprintf("unsupported version %d (a newer build's; this one reads %d)", e.Version, stateVersion)
}

// knownFindings returns the findings of the conditions this build sets, the
// most recent MaxFindings.
func knownFindings(fs []Finding) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.Condition == CondNode || f.Condition == CondSealed {
			out = append(out, f)
		}
	}
	if n := len(out) - MaxFindings; n > 0 {
		out = out[n:]
	}
	return out
}

// LoadState reads the state file in dir. A missing file is (nil, nil). An
// unreadable or altered file is moved aside (report.MoveAside: to
// <file>.corrupt, then <file>.corrupt.1, .2, ... in order; never over an
// earlier one, which is evidence too; the newest report.KeepAside kept) and returned as
// an error of type *CorruptError: that includes what the daemon never
// writes there (a symlink, a directory, a FIFO, a file over
// MaxStateFileSize), which would otherwise be an empty state that drops the
// findings unseen (and a directory would make every save fail).
func LoadState(dir string) (*State, error) {
	p := filepath.Join(dir, StateFileName)
	b, err := report.ReadRegular(p, MaxStateFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var s *State
	if err == nil {
		s, err = ParseState(b)
	}
	if err != nil {
		aside, merr := report.MoveAside(p)
		ce := &CorruptError{Path: p, MovedTo: aside.To, MoveErr: merr, Err: err, Removed: aside.Removed, RemoveErr: aside.RemoveErr}
		var ne *NewerError
		if errors.As(err, &ne) {
			ce.Findings = ne.Findings
		}
		return nil, ce
	}
	return s, nil
}

// StatePath is the state file in dir.
func StatePath(dir string) string { return filepath.Join(dir, StateFileName) }

// LoadStateReadOnly reads the state file in dir without moving a corrupt
// one aside (a reader beside the daemon). A missing file is (nil, nil).
func LoadStateReadOnly(dir string) (*State, error) {
	b, err := report.ReadRegular(StatePath(dir), MaxStateFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s, err := ParseState(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", StatePath(dir), err)
	}
	return s, nil
}

// CorruptError: the state file could not be trusted. It was moved aside
// to MovedTo; when it could not be, MovedTo is empty and MoveErr says why.
type CorruptError struct {
	Path, MovedTo string
	MoveErr       error
	Err           error
	// Removed are the older files moved aside that were removed to keep
	// report.KeepAside; RemoveErr why one could not be.
	Removed   []string
	RemoveErr error
	// Findings are the file's findings that could be read all the same
	// (a newer build's file: NewerError); Keeper.Load keeps them.
	Findings []Finding
}

func (e *CorruptError) Error() string {
	if e.MovedTo == "" {
		if e.MoveErr != nil {
			return fmt.Sprintf("%s: %v (could not be moved aside: %v)", e.Path, e.Err, e.MoveErr)
		}
		return fmt.Sprintf("%s: %v", e.Path, e.Err)
	}
	msg := fmt.Sprintf("%s: %v (moved aside to %s", e.Path, e.Err, e.MovedTo)
	if len(e.Removed) > 0 {
		msg += fmt.Sprintf("; removed %d older moved aside, keeping the newest %d", len(e.Removed), report.KeepAside)
	}
	if e.RemoveErr != nil {
		msg += fmt.Sprintf("; an older one not removed: %v", e.RemoveErr)
	}
	return msg + ")"
}

func (e *CorruptError) Unwrap() error { return e.Err }

// EntriesDigest is the digest of a set of entries (whether the protected
// files changed between two scans).
func EntriesDigest(es []Entry) string {
	raw, _ := json.Marshal(es)
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// Scope returns the spec the baseline was taken with, and false for a
// baseline that did not record it.
func (b *Baseline) Scope() (Spec, bool) {
	if b.Patterns == nil {
		return Spec{}, false
	}
	return Spec{Patterns: b.Patterns, Exclude: b.Exclude}, true
}

// InScope keeps the baseline's entries and the current ones where both the
// baseline's scope and the current spec reach: a path newly protected has
// no baseline to compare with, and one no longer protected is not read.
// A baseline without a recorded scope, or taken with the same one, is
// compared as it is. A path the current scan could not read that holds
// baseline entries both reach (a pattern's directory it cannot list,
// which no pattern covers: /etc/cni/net.d for /etc/cni/net.d/*.conflist)
// is kept: it is the difference, and Diff does not report removed the
// entries under it, which nobody read.
func InScope(b *Baseline, spec Spec, cur []Entry) (base, now []Entry, same bool) {
	old, ok := b.Scope()
	if !ok || (slices.Equal(old.Patterns, spec.Patterns) && slices.Equal(old.Exclude, spec.Exclude)) {
		return b.Entries, cur, true
	}
	for _, e := range b.Entries {
		if spec.Covers(e.Path) {
			base = append(base, e)
		}
	}
	for _, e := range cur {
		if old.Covers(e.Path) || e.Kind == KindUnreadable && holdsAny(e.Path, base) {
			now = append(now, e)
		}
	}
	return base, now, false
}

// holdsAny reports whether directory p holds one of es's paths.
func holdsAny(p string, es []Entry) bool {
	dir := strings.TrimSuffix(p, "/") + "/"
	return slices.ContainsFunc(es, func(e Entry) bool { return strings.HasPrefix(e.Path, dir) })
}

// FitBaseline cuts a scan's entries (cut at the path cap or not: over) to
// those a baseline of bootID and spec holds within MaxBaselineSize, as
// the path cap cuts the scan: the entries before the first, in the scan's
// order, that does not fit, and a *LimitError (Bytes) at that one, which
// the check reports as over-limit and compares within (DiffWithin). The
// same files cut at the same path at every run and after a restart.
// Entries that fit are returned as they are, with over.
func FitBaseline(bootID string, spec Spec, cur []Entry, over *LimitError) ([]Entry, *LimitError) {
	size := baselineFixedSize(bootID, spec)
	bound := size
	for _, e := range cur {
		bound += entrySizeBound(e)
	}
	if bound <= MaxBaselineSize {
		return cur, over
	}
	order := slices.Clone(cur)
	spec.SortScanOrder(order)
	for i, e := range order {
		if size += entrySize(e); size > MaxBaselineSize {
			kept := order[:i:i]
			slices.SortFunc(kept, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
			return kept, &LimitError{Limit: i, At: e.Path, Bytes: MaxBaselineSize}
		}
	}
	return cur, over
}

// baselineFixedSize is the size a baseline of bootID and spec takes in the
// state file without its entries (and the brackets and key around them).
func baselineFixedSize(bootID string, spec Spec) int {
	b := NewBaseline(bootID, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), spec, nil)
	raw, _ := json.MarshalIndent(b, "  ", "  ")
	return len(raw) + len("  \"baseline\": ,\n") + len("\n      ]")
}

// entrySize is the size an entry takes in the state file's baseline (at
// its indent, with the comma and newline after it).
func entrySize(e Entry) int {
	raw, _ := json.MarshalIndent(e, "      ", "  ")
	return len("      ") + len(raw) + len(",\n")
}

// entrySizeBound is at least entrySize(e), without encoding it: each byte
// of its texts 8 at most (a \u escape, and base64 again for a name that is
// not UTF-8), its other fields and keys 512.
func entrySizeBound(e Entry) int {
	return 8*(len(e.Path)+len(e.Target)+len(e.Error)+len(e.SHA256)+len(e.Kind)) + 512
}
