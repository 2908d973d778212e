package tamper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syself/autopilot-health/report"
)

// The conditions a finding sets.
const (
	CondNode   = "NodeTampered"
	CondSealed = "SealedOSTampered"
)

// Keeper holds the tamper state of both tamper checks and keeps it in the
// state file (StateFileName in dir, 0600). Safe for concurrent use.
type Keeper struct {
	dir      string
	readOnly bool
	bootID   string

	load    sync.Once
	loadErr error

	mu    sync.Mutex
	state State
	// layers is the latest comparison of the sealed layers (not kept: it is
	// read again on every run).
	layers []LayerReport
	// pending says why this boot has no baseline yet ("" once it has one).
	pending string
	// unsettled says why the baseline of digest unsettledFor was taken
	// before it settled ("" why: it settled). Not in the tamper state
	// file: the daemon keeps it in its own (checks.TamperUnsettledMemoKey).
	// It is the keeper's, not a check instance's: a reload's new instance,
	// built while the old one's run takes the baseline, says it too.
	unsettled, unsettledFor string
	// clearTrusted: the clear in the state is one this process performed,
	// or one the daemon published to the Node before (TrustClear). Only
	// such a clear is reported: the state file alone could be forged.
	clearTrusted bool
	// onDisk is the digest of the baseline in the state file as last read
	// or written ("" when it holds none); clearing: a clear is being
	// prepared (PrepareClear) and not applied yet. KeptDigest reads both.
	onDisk   string
	clearing bool

	// The writer (save): the state is marshalled under mu and written
	// outside it, on a goroutine of its own, one write at a time. The
	// write is report.WriteFileAtomic, as the daemon's state file's; the
	// bookkeeping around it is this file's own (the daemon's stateWriter
	// says why the two differ).
	// write replaces report.WriteFileAtomic (SetWrite, tests); onBlocked is
	// told when a write is found blocked in I/O and when it returns
	// (OnWriteBlocked).
	write     func(path string, data []byte, perm os.FileMode) error
	onBlocked func(since time.Time, blocked bool, err error)
	// hookMu keeps onBlocked's calls in order (taken before mu).
	hookMu sync.Mutex
	// gen counts the changes to save; written is the gen of the last write
	// that returned, writeErr its error.
	gen, written uint64
	writeErr     error
	// writing: a write is in flight, begun at writeSince; writeBlocked: it
	// has not returned within WriteBlockedAfter. wrote is closed when a
	// write returns (and replaced).
	writing      bool
	writeSeq     uint64
	writeSince   time.Time
	writeBlocked bool
	wrote        chan struct{}
}

// WriteBlockedAfter is how long a write of the tamper state may take
// before it counts as blocked in I/O (a failing or hung disk under the
// state directory), as the daemon's state file's.
const WriteBlockedAfter = 10 * time.Second

// SaveWait bounds how long Update waits for the write of its change: a
// write of a few hundred KiB and two fsyncs takes milliseconds. Past it,
// the change is kept in memory and saved when the write returns
// (NotSavedError); the tamper checks and the operator's clear do not wait
// on the disk.
const SaveWait = 5 * time.Second

// NotSavedError: the change is made in memory (the tamper checks report
// it), but the write of the tamper state has not returned: it is saved
// once that write returns, with every change made meanwhile.
type NotSavedError struct {
	Path  string
	Since time.Time
}

func (e *NotSavedError) Error() string {
	return fmt.Sprintf("not saved yet: the write of %s has not returned since %s (a failing or hung disk?); the change is kept in memory and saved once the write returns",
		e.Path, e.Since.UTC().Format(time.RFC3339))
}

// SetWrite replaces the write of the state file (report.WriteFileAtomic;
// tests). Call it before the keeper is used.
func (k *Keeper) SetWrite(write func(path string, data []byte, perm os.FileMode) error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.write = write
}

// OnWriteBlocked sets fn, called when a write of the state file has not
// returned within WriteBlockedAfter (blocked true) and when that write
// returns (false, with its error); called without the keeper's lock.
func (k *Keeper) OnWriteBlocked(fn func(since time.Time, blocked bool, err error)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onBlocked = fn
}

// WriteBlocked reports the write of the state file blocked in I/O: since
// when; false while none is.
func (k *Keeper) WriteBlocked() (since time.Time, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.writing || !k.writeBlocked {
		return time.Time{}, false
	}
	return k.writeSince, true
}

// TrustClear marks the state's clear as genuine when it is the clear the
// daemon published in the tamper report on the Node (at, read back at
// start); it reports whether it matched.
func (k *Keeper) TrustClear(at time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.state.Cleared; c != nil && c.At.Equal(at) {
		k.clearTrusted = true
	}
	return k.clearTrusted
}

// NewKeeper returns the keeper of the tamper state in dir for a boot.
// readOnly: the state is read but never written (the one-shot check reads
// the daemon's baseline).
func NewKeeper(dir, bootID string, readOnly bool) *Keeper {
	return &Keeper{dir: dir, bootID: bootID, readOnly: readOnly}
}

// BootID is the boot the keeper belongs to.
func (k *Keeper) BootID() string { return k.bootID }

// ReadOnly reports whether the keeper never writes.
func (k *Keeper) ReadOnly() bool { return k.readOnly }

// Path is the state file.
func (k *Keeper) Path() string { return filepath.Join(k.dir, StateFileName) }

// Load reads the state file once. A corrupt file is itself a finding of
// NodeTampered (the file was moved aside, never deleted, and the baseline
// is not silently taken again: the finding stays until cleared); the error
// is returned, once, for the log. The findings of a file a newer build
// wrote in a higher version (a rollback) are kept before that finding. A keeper that writes first removes the
// temp files of the state file a crash left (report.RemoveTemps; under its
// lock, and only while no write of its own is in flight); a read-only one (the one-shot
// check beside a running daemon) leaves them, and leaves a file it cannot
// read where it is, without a finding: the file is the daemon's (which may
// be newer, or readable to root only), and the error is returned.
func (k *Keeper) Load(now time.Time) error {
	k.load.Do(func() {
		if k.readOnly {
			s, err := LoadStateReadOnly(k.dir)
			k.mu.Lock()
			defer k.mu.Unlock()
			if s != nil {
				k.state = *s
			}
			k.loadErr = err
			return
		}
		k.mu.Lock()
		if !k.writing { // a write of its own is done outside the lock
			report.RemoveTemps(k.Path())
		}
		k.mu.Unlock()
		s, err := LoadState(k.dir)
		k.mu.Lock()
		defer k.mu.Unlock()
		if s != nil {
			k.state = *s
			k.onDisk = baselineDigest(*s)
		}
		var ce *CorruptError
		if errors.As(err, &ce) {
			for _, f := range ce.Findings {
				k.state.AddFinding(f)
			}
			k.state.AddFinding(Finding{Condition: CondNode, Path: ce.Path, Kind: Corrupt, At: now.UTC(), BootID: k.bootID, Detail: ce.Err.Error()})
			k.waitLocked(k.saveLocked()) // SaveWait at most: the finding is in memory
		}
		k.loadErr = err
	})
	return k.loadErr
}

// Update changes the state under the keeper's lock and, when fn reports a
// change, saves it: the file is written outside the lock (readers never
// wait for the disk), one write at a time, and a change made while a write
// is in flight is saved by the next one, begun when it returns. Update
// waits for the write of its change SaveWait at most, from that write's
// start, and returns its error; a *NotSavedError when it has not returned
// by then (the change is kept, and saved once it does).
func (k *Keeper) Update(fn func(s *State) bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !fn(&k.state) || k.readOnly {
		return nil
	}
	return k.waitLocked(k.saveLocked())
}

// waitLocked waits for the write of change gen SaveWait at most from that
// write's start, and returns its error (a *NotSavedError when it has not
// returned). Called with mu held; it is released while waiting.
func (k *Keeper) waitLocked(gen uint64) error {
	for k.written < gen {
		wait := SaveWait - time.Since(k.writeSince)
		if wait <= 0 {
			return &NotSavedError{Path: k.Path(), Since: k.writeSince}
		}
		wrote := k.wrote
		k.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-wrote:
		case <-t.C:
		}
		t.Stop()
		k.mu.Lock()
	}
	return k.writeErr
}

// saveLocked marks the state changed and starts its write unless one is in
// flight (whose return starts the next); it returns the change's number.
func (k *Keeper) saveLocked() uint64 {
	k.gen++
	if !k.writing && !k.readOnly {
		k.startLocked()
	}
	return k.gen
}

// startLocked begins a write of the state as it is now, on a goroutine of
// its own; when it returns, the changes made meanwhile are written by the
// next. A write that has not returned within WriteBlockedAfter is marked
// blocked in I/O (WriteBlocked, onBlocked).
func (k *Keeper) startLocked() {
	gen := k.gen
	b, err := k.state.Marshal()
	digest := baselineDigest(k.state)
	write := k.write
	if write == nil {
		write = report.WriteFileAtomic
	}
	k.writeSeq++
	k.writing, k.writeSince, k.writeBlocked = true, time.Now(), false
	if k.wrote == nil {
		k.wrote = make(chan struct{})
	}
	seq, since := k.writeSeq, k.writeSince
	go func() {
		t := time.AfterFunc(WriteBlockedAfter, func() {
			k.hookMu.Lock()
			defer k.hookMu.Unlock()
			k.mu.Lock()
			mine := k.writing && k.writeSeq == seq
			k.writeBlocked = k.writeBlocked || mine
			fn := k.onBlocked
			k.mu.Unlock()
			if mine && fn != nil {
				fn(since, true, nil)
			}
		})
		if err == nil {
			err = write(k.Path(), b, 0o600)
		}
		t.Stop()
		k.hookMu.Lock()
		defer k.hookMu.Unlock()
		k.mu.Lock()
		blocked, fn := k.writeBlocked, k.onBlocked
		k.written, k.writeErr = gen, err
		if err == nil {
			k.onDisk = digest
		}
		k.writing, k.writeBlocked = false, false
		close(k.wrote)
		k.wrote = make(chan struct{})
		if k.gen > gen {
			k.startLocked()
		}
		k.mu.Unlock()
		if blocked && fn != nil {
			fn(since, false, err)
		}
	}()
}

// Flush waits, wait at most, for every change made so far to be written,
// and returns the last write's error; a *NotSavedError when a write has
// not returned by then (the daemon's stop: it does not wait for a disk
// that hangs). Changes whose write failed (a full or read-only state_dir)
// are not written yet: Flush writes them again (the disk may have been
// freed since), rather than report the old failure.
func (k *Keeper) Flush(wait time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	if k.writeErr != nil && !k.writing && !k.readOnly {
		k.saveLocked()
	}
	for k.written < k.gen {
		wrote := k.wrote
		k.mu.Unlock()
		select {
		case <-wrote:
			k.mu.Lock()
		case <-t.C:
			k.mu.Lock()
			return &NotSavedError{Path: k.Path(), Since: k.writeSince}
		}
	}
	return k.writeErr
}

// State returns a copy of the state.
func (k *Keeper) State() State {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.copyLocked()
}

func (k *Keeper) copyLocked() State {
	s := k.state
	s.Findings = slices.Clone(s.Findings)
	s.Tolerated = slices.Clone(s.Tolerated)
	if s.Baseline != nil {
		b := *s.Baseline
		s.Baseline = &b
	}
	return s
}

// SetPending records why this boot has no baseline yet ("" when it has).
func (k *Keeper) SetPending(why string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pending = why
}

// SetUnsettled records why the baseline of digest was taken before it
// settled ("" why: it settled), and reports whether that changed.
func (k *Keeper) SetUnsettled(digest, why string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	changed := k.unsettledFor != digest || k.unsettled != why
	k.unsettledFor, k.unsettled = digest, why
	return changed
}

// RestoreUnsettled records a note read back from where it was kept (a
// daemon restart), unless one is recorded already (a reload: the keeper's
// is the latest).
func (k *Keeper) RestoreUnsettled(digest, why string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.unsettledFor == "" {
		k.unsettledFor, k.unsettled = digest, why
	}
}

// Unsettled returns the digest of the baseline the note is about and why
// it was taken before it settled ("" why: it settled, or no note).
func (k *Keeper) Unsettled() (digest, why string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.unsettledFor, k.unsettled
}

// SetLayers records the latest comparison of the sealed layers.
func (k *Keeper) SetLayers(ls []LayerReport) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.layers = slices.Clone(ls)
}

// baselineDigest is the digest of s's baseline, "" when it has none.
func baselineDigest(s State) string {
	if s.Baseline == nil {
		return ""
	}
	return s.Baseline.Digest
}

// KeptDigest is the digest of this boot's baseline that the daemon's state
// file may keep (NodeTampered compares it with the tamper state at the
// next start: a baseline gone or replaced within the boot is a finding).
// It is "" unless the baseline in memory is also the one the state file
// holds on disk, and while a clear is prepared: the state file never
// names a baseline the tamper state file does not hold (a restart at any
// point of a clear, or of a write of the tamper state that failed, finds
// no false BaselineCorrupt), and names the new baseline once it is
// written.
func (k *Keeper) KeptDigest() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.state.Baseline
	if k.clearing || b == nil || b.BootID != k.bootID || b.Digest != k.onDisk {
		return ""
	}
	return b.Digest
}

// PrepareClear makes KeptDigest "" until the clear (ClearAll) is applied
// and a new baseline written: the daemon saves its state file so, and
// waits for it, before the clear's write drops the baseline from the
// tamper state file.
func (k *Keeper) PrepareClear() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.clearing = true
}

// ClearAll drops every finding and the baseline (taken again at the next
// run, of the files as they are now) and forgets the recorded hashes first
// seen (read again at the next run): the operator has looked at the node
// and accepts it as it is.
func (k *Keeper) ClearAll(c Clear) error {
	return k.Update(func(s *State) bool {
		s.Findings, s.FindingsDropped = nil, 0
		s.Tolerated, s.ToleratedDropped = nil, 0
		s.Baseline, s.Sealed = nil, nil
		c.At = c.At.UTC()
		s.Cleared = &c
		s.Retake, s.RetakeBoot = true, k.bootID
		k.clearTrusted = true
		k.clearing = false // the baseline is gone: KeptDigest stays "" until the next is written
		return true
	})
}

// LayerReport is one sealed layer in the report.
type LayerReport struct {
	Name string `json:"name"`
	// Expected is the recorded root hash (as first seen in this boot);
	// Enforced the one in the kernel's verity table.
	Expected string `json:"expected,omitempty"`
	Enforced string `json:"enforced,omitempty"`
	Status   string `json:"status"`
}

// Report is the tamper domain of the health report.
type Report struct {
	BootID   string          `json:"bootID"`
	Baseline *BaselineReport `json:"baseline,omitempty"`
	// BaselinePending says why this boot has no baseline yet.
	BaselinePending string         `json:"baselinePending,omitempty"`
	Changes         []ChangeReport `json:"changes"`
	ChangesOmitted  int            `json:"changesOmitted,omitempty"`
	// Tolerated are changes of tolerated paths (known writers, which set
	// no condition), the most recent last.
	Tolerated        []ChangeReport `json:"tolerated,omitempty"`
	ToleratedOmitted int            `json:"toleratedOmitted,omitempty"`
	SealedLayers     []LayerReport  `json:"sealedLayers"`
	// SealedLayersOmitted counts the layers left out to fit the document.
	SealedLayersOmitted int    `json:"sealedLayersOmitted,omitempty"`
	Cleared             *Clear `json:"cleared,omitempty"`

	// taken orders the reports of a keeper (Taken).
	taken uint64
}

// reportsTaken numbers the reports given (Report.Taken), of every keeper
// (a daemon keeps one; the count holds were it ever another).
var reportsTaken atomic.Uint64

// Taken orders the reports: one with a greater number was taken later, of
// its keeper's state as it was then (under the keeper's lock, so that of
// one keeper's reports the later taken has every change the earlier had)
// (report.Snapshot). Both
// tamper checks carry the keeper's report: the later taken is the tamper
// document's, whichever check's result is recorded last.
func (r Report) Taken() uint64 { return r.taken }

// Shrink returns the report with at most limit changes (the most recent)
// and sealed layers, for a document over its size limit
// (report.Shrinker).
func (r Report) Shrink(limit int) any {
	if n := len(r.Changes) - limit; n > 0 {
		r.Changes = slices.Clone(r.Changes[n:])
		r.ChangesOmitted += n
	}
	if n := len(r.Tolerated) - limit; n > 0 {
		r.Tolerated = slices.Clone(r.Tolerated[n:])
		r.ToleratedOmitted += n
	}
	if n := len(r.SealedLayers) - limit; n > 0 {
		r.SealedLayers = slices.Clone(r.SealedLayers[:limit])
		r.SealedLayersOmitted += n
	}
	return r
}

// MaxReportedText caps a path or the clear's reason in the report (bytes,
// "…" included).
const MaxReportedText = 256

// clip cuts s to MaxReportedText bytes on a rune boundary, ending in "…"
// when cut.
func clip(s string) string { return report.Cut(s, MaxReportedText, "…") }

// BaselineReport describes the baseline of this boot.
type BaselineReport struct {
	TakenAt time.Time `json:"takenAt"`
	Digest  string    `json:"digest"`
	Files   int       `json:"files"`
}

// ChangeReport is one finding in the report.
type ChangeReport struct {
	// Condition is the condition the change set; none for a tolerated one.
	Condition string     `json:"condition,omitempty"`
	Path      string     `json:"path"`
	Kind      ChangeKind `json:"kind"`
	At        time.Time  `json:"at"`
}

// MaxReportedChanges caps the changes in the report (the most recent are
// shown; the number left out is changesOmitted): a report document is
// limited to 8 KiB.
const MaxReportedChanges = 16

// Report returns the tamper domain of the health report.
func (k *Keeper) Report() Report {
	k.mu.Lock()
	defer k.mu.Unlock()
	// The pending message names a baseline_after glob, of any length:
	// cut as a path is, so the document keeps room for the rest.
	r := Report{BootID: k.bootID, BaselinePending: clip(k.pending), Changes: []ChangeReport{}, SealedLayers: slices.Clone(k.layers), taken: reportsTaken.Add(1)}
	if c := k.state.Cleared; c != nil && k.clearTrusted {
		r.Cleared = &Clear{At: c.At, Reason: clip(c.Reason), By: clip(c.By)}
	}
	if r.SealedLayers == nil {
		r.SealedLayers = []LayerReport{}
	}
	if b := k.state.Baseline; b != nil && b.BootID == k.bootID {
		r.Baseline = &BaselineReport{TakenAt: b.TakenAt, Digest: b.Digest, Files: len(b.Entries)}
	}
	fs := k.state.Findings
	if n := len(fs) - MaxReportedChanges; n > 0 {
		r.ChangesOmitted = n
		fs = fs[n:]
	}
	r.ChangesOmitted += k.state.FindingsDropped
	for _, f := range fs {
		r.Changes = append(r.Changes, ChangeReport{Condition: f.Condition, Path: clip(f.Path), Kind: f.Kind, At: f.At})
	}
	r.ToleratedOmitted = k.state.ToleratedDropped
	for _, f := range k.state.Tolerated {
		r.Tolerated = append(r.Tolerated, ChangeReport{Path: clip(f.Path), Kind: f.Kind, At: f.At})
	}
	return r
}
