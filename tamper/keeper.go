package tamper

import (
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

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
	// clearTrusted: the clear in the state is one this process performed,
	// or one the daemon published to the Node before (TrustClear). Only
	// such a clear is reported: the state file alone could be forged.
	clearTrusted bool
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
// lock, so no save of its own is under way); a read-only one (the one-shot
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
		report.RemoveTemps(k.Path())
		k.mu.Unlock()
		s, err := LoadState(k.dir)
		k.mu.Lock()
		defer k.mu.Unlock()
		if s != nil {
			k.state = *s
		}
		var ce *CorruptError
		if errors.As(err, &ce) {
			for _, f := range ce.Findings {
				k.state.AddFinding(f)
			}
			k.state.AddFinding(Finding{Condition: CondNode, Path: ce.Path, Kind: Corrupt, At: now.UTC(), BootID: k.bootID, Detail: ce.Err.Error()})
			k.saveLocked()
		}
		k.loadErr = err
	})
	return k.loadErr
}

// Update changes the state under the keeper's lock and saves it when fn
// reports a change.
func (k *Keeper) Update(fn func(s *State) bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !fn(&k.state) {
		return nil
	}
	return k.saveLocked()
}

func (k *Keeper) saveLocked() error {
	if k.readOnly {
		return nil
	}
	b, err := k.state.Marshal()
	if err != nil {
		return err
	}
	return report.WriteFileAtomic(k.Path(), b, 0o600)
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

// SetLayers records the latest comparison of the sealed layers.
func (k *Keeper) SetLayers(ls []LayerReport) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.layers = slices.Clone(ls)
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
		s.Retake = true
		k.clearTrusted = true
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
}

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
func clip(s string) string {
	if len(s) <= MaxReportedText {
		return s
	}
	const ell = "…"
	cut := MaxReportedText - len(ell)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ell
}

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
	r := Report{BootID: k.bootID, BaselinePending: k.pending, Changes: []ChangeReport{}, SealedLayers: slices.Clone(k.layers)}
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
