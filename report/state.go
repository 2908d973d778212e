package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// MaxMessageLen caps a condition or event message (bytes).
const MaxMessageLen = 1024

// Condition is the current state of one condition the daemon owns.
type Condition struct {
	Type               string    `json:"type"`
	Status             Status    `json:"status"`
	Reason             Reason    `json:"reason"`
	Message            string    `json:"message"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
	// LastUpdateTime is when the condition was last evaluated.
	LastUpdateTime time.Time `json:"lastUpdateTime"`
}

// Event is a one-shot problem (temp rule).
type Event struct {
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

// Observer is told about every condition change and event. Calls are made
// with the store's lock released, in the order the changes happened.
type Observer interface {
	ConditionChanged(prev *Condition, cur Condition)
	// ConditionRestored is called for each condition Load restored from the
	// state file: it is the state before the restart, not a new change.
	ConditionRestored(c Condition)
	EventEmitted(e Event)
}

// Store holds the condition state. It is safe for concurrent use.
type Store struct {
	mu        sync.Mutex
	conds     map[string]Condition
	parts     map[string]map[string]Condition // condition type -> part -> evaluation
	bootID    string
	observers []Observer
	changed   chan struct{} // closed and replaced on every change
	notifyMu  sync.Mutex    // serializes observer calls
	// bootStart is when this boot began (wall time): a condition held until
	// reboot that the Node shows True since then belongs to this boot.
	bootStart time.Time
	// memos are the saved values of this boot (see Keep and Memo); keepers
	// produce the current ones at each Save.
	memos   map[string]json.RawMessage
	keepers map[string]func() any
	// dirty gets a token whenever something the state file holds changed
	// (a condition or a kept value); the persister drains it.
	dirty chan struct{}
}

// NewStore returns an empty store for the given boot.
func NewStore(bootID string) *Store {
	return &Store{conds: map[string]Condition{}, parts: map[string]map[string]Condition{}, bootID: bootID,
		changed: make(chan struct{}), memos: map[string]json.RawMessage{}, keepers: map[string]func() any{},
		dirty: make(chan struct{}, 1)}
}

// SetBootStart records when this boot began (wall time), for Adopt.
func (s *Store) SetBootStart(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bootStart = t
}

// Dirty returns a channel that receives a token after something the state
// file holds changed: a condition, or a value registered with Keep (Touch).
// It has one reader: the loop that saves the state.
func (s *Store) Dirty() <-chan struct{} { return s.dirty }

// Touch says that a value registered with Keep changed. It never blocks and
// does not allocate, so a reader may call it for every record it handles.
func (s *Store) Touch() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

// Keep registers fn, whose value is saved in the state file under key at
// every Save, in the same atomic write as the conditions. fn is called with
// the store's lock held, so what it returns is consistent with the
// conditions saved beside it: a producer that updates its value only after
// the Set calls its input caused (the kernel log cursor after a record's
// conditions) can never have a saved value that runs ahead of the saved
// conditions. fn must not call the Store, and must return a value that
// later changes do not alter (a copy). Kept values belong to one boot: Load
// restores them only when the boot is the same.
func (s *Store) Keep(key string, fn func() any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepers[key] = fn
}

// Memo decodes the value saved under key in this boot (by Load) into v and
// reports whether there was one that decoded.
func (s *Store) Memo(key string, v any) bool {
	s.mu.Lock()
	raw, ok := s.memos[key]
	s.mu.Unlock()
	return ok && json.Unmarshal(raw, v) == nil
}

// Observe registers an observer. Register observers before the first Set.
func (s *Store) Observe(o Observer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observers = append(s.observers, o)
}

// Changed returns a channel closed at the next change.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Get returns one condition.
func (s *Store) Get(condType string) (Condition, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.conds[condType]
	return c, ok
}

// All returns every condition, sorted by type.
func (s *Store) All() []Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Condition, 0, len(s.conds))
	for _, c := range s.conds {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Condition) int {
		switch {
		case a.Type < b.Type:
			return -1
		case a.Type > b.Type:
			return 1
		}
		return 0
	})
	return out
}

// Set records a new evaluation of a condition at time now. The transition
// time changes only when the status changes. A condition held until reboot or
// forever (kernel and tamper conditions) stays True once set: a later False
// does not clear it. Set reports whether status, reason or message changed.
func (s *Store) Set(c Condition, now time.Time) bool {
	if desc, ok := Lookup(c.Type); !ok {
		panic(fmt.Sprintf("report: Set of unknown condition %q", c.Type))
	} else if !desc.ValidReason(c.Status, c.Reason) {
		panic(fmt.Sprintf("report: condition %s: reason %q is not in the catalog for status %s", c.Type, c.Reason, c.Status))
	}
	c.Message = capMessage(c.Message)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	prev, had := s.conds[c.Type]
	if had && prev.Status == StatusTrue && c.Status != StatusTrue {
		if desc, _ := Lookup(c.Type); desc.Hold != HoldWhileTrue {
			prev.LastUpdateTime = now
			s.conds[c.Type] = prev
			s.mu.Unlock()
			return false
		}
	}
	c.LastUpdateTime = now
	c.LastTransitionTime = now
	if had && prev.Status == c.Status {
		c.LastTransitionTime = prev.LastTransitionTime
	}
	s.conds[c.Type] = c
	changed := !had || prev.Status != c.Status || prev.Reason != c.Reason || prev.Message != c.Message
	obs := s.observers
	if changed {
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()
	if changed {
		s.Touch()
		var p *Condition
		if had {
			p = &prev
		}
		for _, o := range obs {
			o.ConditionChanged(p, c)
		}
	}
	return changed
}

// SetPart records the evaluation by src of its part of a condition that
// several sources evaluate (the catalog row's Parts: DisksFailure's kernel
// I/O errors and NVMe SMART), and sets the condition from all parts seen so
// far: True when any part is True (the reason of the first True part in the
// row's order; the messages of the True parts joined); else Unknown when a
// part could not decide (its reason); else False when a part is False; else
// (every part found nothing to check, e.g. no NVMe drives and no kernel log
// monitor) Unknown/NothingToCheck. A part with nothing to check never makes
// the condition False by itself. It panics when the row gives src no part.
func (s *Store) SetPart(src Source, c Condition, now time.Time) bool {
	desc, _ := Lookup(c.Type)
	part, ok := desc.Part(src)
	if !ok {
		panic(fmt.Sprintf("report: SetPart of %q by %s: the catalog gives it no part from that source", c.Type, src))
	}
	s.mu.Lock()
	if s.parts[c.Type] == nil {
		s.parts[c.Type] = map[string]Condition{}
	}
	s.parts[c.Type][part.Name] = c
	var trues, falses, undecided, nothing []Condition
	for _, n := range desc.Parts {
		p, seen := s.parts[c.Type][n.Name]
		if !seen {
			continue
		}
		switch {
		case p.Status == StatusTrue:
			trues = append(trues, p)
		case p.Status == StatusFalse:
			falses = append(falses, p)
		case p.Reason == ReasonNothingToCheck:
			nothing = append(nothing, p)
		default:
			undecided = append(undecided, p)
		}
	}
	s.mu.Unlock()
	// A part that found nothing to check (no NVMe drives) neither makes the
	// condition healthy nor undecided: the other parts decide, and when no
	// part checked anything, neither does the condition.
	out := Condition{Type: c.Type}
	var pick []Condition
	switch {
	case len(trues) > 0:
		out.Status, out.Reason, pick = StatusTrue, trues[0].Reason, trues
	case len(undecided) > 0:
		out.Status, out.Reason, pick = StatusUnknown, undecided[0].Reason, append(undecided, falses...)
	case len(falses) > 0:
		out.Status, out.Reason, pick = StatusFalse, desc.HealthyReason, append(falses, nothing...)
	default:
		out.Status, out.Reason, pick = StatusUnknown, ReasonNothingToCheck, nothing
	}
	msgs := make([]string, 0, len(pick))
	for _, p := range pick {
		if p.Message != "" {
			msgs = append(msgs, p.Message)
		}
	}
	out.Message = strings.Join(msgs, "; ")
	return s.Set(out, now)
}

// Emit records a one-shot event.
func (s *Store) Emit(e Event) {
	if _, ok := LookupEvent(e.Reason); !ok {
		panic(fmt.Sprintf("report: Emit of unknown event reason %q", e.Reason))
	}
	e.Message = capMessage(e.Message)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	obs := s.observers
	s.mu.Unlock()
	for _, o := range obs {
		o.EventEmitted(e)
	}
}

func capMessage(m string) string {
	if len(m) <= MaxMessageLen {
		return m
	}
	const ell = "...(truncated)"
	cut := MaxMessageLen - len(ell)
	for cut > 0 && !utf8Start(m[cut]) {
		cut--
	}
	return m[:cut] + ell
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// stateFile is the on-disk form of the store.
type stateFile struct {
	Version    int         `json:"version"`
	BootID     string      `json:"bootID"`
	SavedAt    time.Time   `json:"savedAt"`
	Conditions []Condition `json:"conditions"`
	// Memos are the values registered with Keep (this boot's only).
	Memos map[string]json.RawMessage `json:"memos,omitempty"`
}

const stateVersion = 1

// StateFileName is the file under the state directory.
const StateFileName = "state.json"

// snapshot returns the conditions and the kept values as of one instant:
// the keepers run under the same lock as the copy of the conditions.
func (s *Store) snapshot() ([]Condition, map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	conds := make([]Condition, 0, len(s.conds))
	for _, c := range s.conds {
		conds = append(conds, c)
	}
	slices.SortFunc(conds, func(a, b Condition) int { return strings.Compare(a.Type, b.Type) })
	memos := make(map[string]any, len(s.memos)+len(s.keepers))
	for k, raw := range s.memos { // restored, and not (yet) kept by anyone: carried on
		memos[k] = raw
	}
	for k, fn := range s.keepers {
		memos[k] = fn()
	}
	return conds, memos
}

// Save writes the conditions and the kept values atomically (temp file,
// fsync, rename, fsync of the directory) to dir.
func (s *Store) Save(dir string, now time.Time) error {
	conds, memos := s.snapshot()
	sf := stateFile{Version: stateVersion, BootID: s.bootID, SavedAt: now, Conditions: conds}
	if len(memos) > 0 {
		sf.Memos = make(map[string]json.RawMessage, len(memos))
		for k, v := range memos {
			b, err := json.Marshal(v)
			if err != nil {
				return fmt.Errorf("state %s: %w", k, err)
			}
			sf.Memos[k] = b
		}
	}
	b, err := json.MarshalIndent(sf, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dir, StateFileName), append(b, '\n'), 0o644)
}

// WriteFileAtomic replaces path with data so that a crash at any moment
// leaves either the old file or the new one, whole: a temp file in the same
// directory, fsync, rename, fsync of the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// LoadResult says what Load restored.
type LoadResult struct {
	Restored int // conditions restored
	Dropped  int // conditions dropped: held until reboot, and the boot changed; or no longer in the catalog
	// Corrupt is set when the file could not be read; it was moved aside to
	// CorruptPath and the store starts empty.
	Corrupt     error
	CorruptPath string
}

// Load restores the store from dir. A missing file is not an error. Kernel
// conditions (held until reboot) are restored only when the boot is the same;
// conditions held forever and check conditions are always restored, so that a
// restart neither flaps them nor resets their transition times. A corrupt file
// is moved aside (never deleted) and reported in the result.
func (s *Store) Load(dir string) (LoadResult, error) {
	path := filepath.Join(dir, StateFileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return LoadResult{}, nil
	}
	if err != nil {
		return LoadResult{}, err
	}
	var sf stateFile
	err = json.Unmarshal(b, &sf)
	if err == nil && sf.Version != stateVersion {
		err = fmt.Errorf("unsupported state version %d", sf.Version)
	}
	if err != nil {
		aside := path + ".corrupt"
		if rerr := os.Rename(path, aside); rerr != nil {
			return LoadResult{}, fmt.Errorf("state file %s unreadable (%v) and cannot be moved aside: %w", path, err, rerr)
		}
		return LoadResult{Corrupt: err, CorruptPath: aside}, nil
	}
	var res LoadResult
	var restored []Condition
	s.mu.Lock()
	for _, c := range sf.Conditions {
		desc, ok := Lookup(c.Type)
		if !ok || !desc.ValidReason(c.Status, c.Reason) {
			res.Dropped++
			continue
		}
		if desc.Hold == HoldUntilReboot && sf.BootID != s.bootID {
			res.Dropped++
			continue
		}
		s.conds[c.Type] = c
		restored = append(restored, c)
	}
	if sf.BootID == s.bootID {
		for k, raw := range sf.Memos {
			s.memos[k] = raw
		}
	}
	obs := s.observers
	s.mu.Unlock()
	res.Restored = len(restored)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	for _, c := range restored {
		for _, o := range obs {
			o.ConditionRestored(c)
		}
	}
	return res, nil
}

// bootSlack absorbs the Node's one-second resolution of transition times.
const bootSlack = 2 * time.Second

// Adopt merges a condition read back from the Node when the daemon starts,
// so a restart (even one that lost the state file) neither flaps a condition
// nor resets the timers of anything that watches it:
//   - not in the store: taken over as it is (observers see a restore);
//   - same status in the store: the Node's lastTransitionTime wins, because
//     it is the one watchers have been timing;
//   - a condition held until reboot (the kernel's) that the Node shows True
//     since this boot began, or one held forever (tamper) that the Node shows
//     True: taken over even when the store says otherwise, because such a
//     condition never turns False by itself; the store lost it (a start
//     without its state file, or a kernel line the ring buffer no longer
//     holds);
//   - a kernel condition the Node shows True from an earlier boot: ignored
//     (a reboot clears kernel conditions);
//
// Which boot a True kernel condition on the Node belongs to: nodeBoot is
// the boot ID of the Node's report annotations, which the daemon writes only
// after it has written the conditions of that boot; when it is this boot,
// every condition on the Node is this boot's. Without one (a Node written by
// an older version), the transition time is compared with this boot's start
// (wall clock; a clock stepped since can misjudge it).
//   - another status in the store: the store wins; it holds a change the
//     API server has not seen yet.
//
// A condition type or reason outside the catalog is ignored. Adopt reports
// whether the store changed.
func (s *Store) Adopt(c Condition, nodeBoot string) bool {
	desc, ok := Lookup(c.Type)
	if !ok || !desc.ValidReason(c.Status, c.Reason) {
		return false
	}
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	thisBoot := s.bootStart.IsZero() || !c.LastTransitionTime.Before(s.bootStart.Add(-bootSlack))
	if nodeBoot != "" {
		thisBoot = nodeBoot == s.bootID
	}
	held := c.Status == StatusTrue && (desc.Hold == HoldForever || desc.Hold == HoldUntilReboot && thisBoot)
	prev, had := s.conds[c.Type]
	switch {
	case desc.Hold == HoldUntilReboot && c.Status == StatusTrue && !thisBoot:
		s.mu.Unlock()
		return false
	case !had:
		s.conds[c.Type] = c
	case prev.Status == c.Status && !prev.LastTransitionTime.Equal(c.LastTransitionTime) && !c.LastTransitionTime.IsZero():
		prev.LastTransitionTime = c.LastTransitionTime
		s.conds[c.Type] = prev
		s.mu.Unlock()
		s.Touch()
		return true
	case held && prev.Status != StatusTrue:
		c.LastUpdateTime = prev.LastUpdateTime
		s.conds[c.Type] = c
		close(s.changed)
		s.changed = make(chan struct{})
	default:
		s.mu.Unlock()
		return false
	}
	obs := s.observers
	s.mu.Unlock()
	s.Touch()
	for _, o := range obs {
		o.ConditionRestored(c)
	}
	return true
}
