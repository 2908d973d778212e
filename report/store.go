package report

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Store holds the condition state. It is safe for concurrent use.
type Store struct {
	mu    sync.Mutex
	conds map[string]Condition
	parts map[string]map[string]Condition // condition type -> part -> evaluation
	// restoredParts are the parts Load restored that their source has not
	// set since (condition type -> part names).
	restoredParts map[string][]string
	bootID        string
	observers     []Observer
	changed       chan struct{} // closed and replaced on every change
	notifyMu      sync.Mutex    // serializes observer calls
	partMu        sync.Mutex    // serializes SetPart: combining and setting are one step
	// bootStart is when this boot began (wall time): a condition held until
	// reboot that the Node shows True since then belongs to this boot.
	bootStart time.Time
	// memos are the saved values of this boot (see Keep and Memo); keepers
	// produce the current ones at each Save.
	memos   map[string]json.RawMessage
	keepers map[string]func() any
	// last are the keys whose keepers run after the others (KeepLast).
	last map[string]bool
	// onWritten are the hooks told of the end of each write (OnWritten);
	// inWrite, the values their keepers returned into the writes encoded
	// and not ended yet (by generation, the last few: a write whose end
	// is never told, an encoding that failed, is dropped in time);
	// writesReported: whoever writes the state file tells the store of
	// each write's end (ReportWrites, Save).
	onWritten      map[string]func(v any, err error)
	inWrite        []encodedWrite
	writeGen       uint64
	writesReported bool
	// dirty gets a token when something the state file holds changed in a
	// way that must be saved soon (Touch), later one when the change may
	// wait (TouchLater); the persister drains both.
	dirty, later chan struct{}
	// released: conditions held once True whose next Set may lower them,
	// with when they were cleared (a run started before that does not
	// spend the release)
	// (an operator's clear); cleared: when each was last cleared, so Adopt
	// does not take back a True from before the clear.
	released map[string]time.Time
	cleared  map[string]time.Time
	// observed: the condition types whose lastTransitionTime is a change
	// of status the store saw, from one decided status (True, False) to
	// another, not its first sighting of the condition (a start without
	// the state file) nor its first decision after Unknown (a placeholder):
	// Adopt keeps such a time when it is later than the Node's (kept in
	// the state file).
	observed map[string]bool
	// evaluatedHere: the condition types this process evaluated (a Set
	// since its start, not a state file's nor the Node's word);
	// changedHere: those whose observed change this process saw. Either is
	// later than anything the Node holds, which an earlier run of the
	// daemon wrote, whatever the wall clock says: Adopt keeps them even
	// where the Node's time reads later (the clock was stepped back since
	// the Node's write, or this boot's clock is behind the last boot's).
	evaluatedHere, changedHere map[string]bool
	// notEvaluated are the parts whose source does not run here
	// (ForgetPart, RemovePart; condition type -> part names): the Node's
	// word does not set them again (seedPartsLocked) until their source
	// sets them (SetPart: a reload enabled it again).
	notEvaluated map[string][]string
	// clock is the wall clock (SetClock): a transition time read back
	// (Adopt, Load) that lies after it is taken as now. Nil: times are
	// taken as they are.
	clock func() time.Time
	// aside: the conditions read back with a reason this build does not
	// know (see asideCond), until the first Set of their type.
	aside map[string]asideCond
}

// NewStore returns an empty store for the given boot.
func NewStore(bootID string) *Store {
	return &Store{conds: map[string]Condition{}, parts: map[string]map[string]Condition{}, bootID: bootID,
		changed: make(chan struct{}), memos: map[string]json.RawMessage{}, keepers: map[string]func() any{}, last: map[string]bool{}, onWritten: map[string]func(any, error){},
		dirty: make(chan struct{}, 1), later: make(chan struct{}, 1), released: map[string]time.Time{}, cleared: map[string]time.Time{}, observed: map[string]bool{},
		evaluatedHere: map[string]bool{}, changedHere: map[string]bool{}}
}

// Release lets a Set of a condition that is held once True (a tamper
// condition) lower it, and records when it was cleared (SetCleared): an
// operator's deliberate clear, never automatic. The hold applies again
// after the first Set that is not True.
func (s *Store) Release(condType string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released[condType] = at
	s.cleared[condType] = at
}

// SetCleared records when a condition was last cleared by an operator:
// Adopt ignores a True on the Node whose transition is not after it.
func (s *Store) SetCleared(condType string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleared[condType] = at
}

// SetBootStart records when this boot began (wall time), for Adopt.
func (s *Store) SetBootStart(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bootStart = t
}

// SetClock sets the wall clock by which Adopt and Load judge a transition
// time read back from the Node or the state file: one more than futureSlack
// after now was written while the clock was ahead, and is taken as now.
func (s *Store) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = now
}

// Dirty returns a channel that receives a token after a change the state
// file must take soon: a new condition, a new status or reason, a removal,
// or a value registered with Keep (Touch). It has one reader: the loop that
// saves the state.
func (s *Store) Dirty() <-chan struct{} { return s.dirty }

// Touch says that a value registered with Keep changed. It never blocks and
// does not allocate, so a reader may call it for every record it handles.
func (s *Store) Touch() { signal(s.dirty) }

// signal leaves a token on c (capacity 1) unless one is waiting already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Later returns a channel that receives a token after TouchLater: a change
// that the state file may take a while later (the persister's
// persistLater), or with the next save for any reason. Like Dirty, it has
// one reader.
func (s *Store) Later() <-chan struct{} { return s.later }

// TouchLater says that something the state file holds changed where losing
// the change to a crash costs little: the kernel log's cursor moving past
// records that are handled again after a restart at no cost but their
// events, a condition's new message with its status and reason unchanged.
// It never blocks and does not allocate.
func (s *Store) TouchLater() { signal(s.later) }

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
func (s *Store) Set(c Condition, now time.Time) bool { return s.SetRun(c, now, now) }

// SetRun is Set of the result of a run that started at started. After an
// operator's clear (Release) the first Set of a run started at or after the
// clear spends the release, whatever its status: its False lowers the
// condition, its True keeps it held (a later failed run, Unknown, does not
// lower it). A run started before the clear (in flight during it) spends
// the release only with a status that is not True.
func (s *Store) SetRun(c Condition, started, now time.Time) bool {
	if desc, ok := Lookup(c.Type); !ok {
		panic(fmt.Sprintf("report: Set of unknown condition %q", c.Type))
	} else if !desc.ValidReason(c.Status, c.Reason) {
		panic(fmt.Sprintf("report: condition %s: reason %q is not in the catalog for status %s", c.Type, c.Reason, c.Status))
	}
	c.Message = CapMessage(c.Message)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	prev, had := s.conds[c.Type]
	aside, hadAside := s.takeAsideLocked(c.Type)
	// The release lasts until a Set lowers the condition: a run that was
	// in flight during the clear may still set True first.
	relAt, released := s.released[c.Type]
	if released && (c.Status != StatusTrue || !started.Before(relAt)) {
		delete(s.released, c.Type)
	}
	if had && prev.Status == StatusTrue && c.Status != StatusTrue && !released {
		if desc, _ := Lookup(c.Type); desc.Hold != HoldWhileTrue {
			prev.LastUpdateTime = now
			s.conds[c.Type] = prev
			s.evaluatedHere[c.Type] = true
			s.mu.Unlock()
			return false
		}
	}
	c.LastUpdateTime = now
	c.LastTransitionTime = now
	if had && prev.Status == c.Status {
		c.LastTransitionTime = prev.LastTransitionTime
	}
	switch {
	case !had && hadAside && aside.c.Status == c.Status:
		// Read back with a reason this build does not know (an upgrade
		// past a renamed reason, a rollback past an added one): the
		// status holds since the time read, as it would have with the
		// reason known.
		c.LastTransitionTime = aside.c.LastTransitionTime
		s.observed[c.Type] = aside.observed
		delete(s.changedHere, c.Type)
	case !had, prev.Status == StatusUnknown && prev.Status != c.Status:
		// First seen, or decided after Unknown (the kernel log monitor's
		// placeholder, a check that could not run): when the status
		// became what it is is not known.
		delete(s.observed, c.Type)
		delete(s.changedHere, c.Type)
	case prev.Status != c.Status:
		s.observed[c.Type] = true
		s.changedHere[c.Type] = true
	}
	s.conds[c.Type] = c
	s.evaluatedHere[c.Type] = true
	changed := !had || prev.Status != c.Status || prev.Reason != c.Reason || prev.Message != c.Message
	obs := s.observers
	if changed {
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()
	if changed {
		// A new message alone (a count, a percentage) may wait for the
		// state file: after a crash the next evaluation writes it again.
		// A new status or reason, and the transition time, may not.
		if had && prev.Status == c.Status && prev.Reason == c.Reason {
			s.TouchLater()
		} else {
			s.Touch()
		}
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

// Remove drops a condition that is no longer evaluated on this node (its
// check disabled by a reload): it leaves the store, the state file at the
// next save and, through the reporter, the Node; observers that are
// Removers are told. It reports whether the store held it.
func (s *Store) Remove(condType string) bool {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	c, had := s.conds[condType]
	_, hadAside := s.takeAsideLocked(condType)
	delete(s.conds, condType)
	delete(s.parts, condType)
	delete(s.observed, condType)
	delete(s.evaluatedHere, condType)
	delete(s.changedHere, condType)
	obs := s.observers
	if had {
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()
	if !had {
		if hadAside {
			s.Touch()
		}
		return false
	}
	s.Touch()
	for _, o := range obs {
		if r, ok := o.(Remover); ok {
			r.ConditionRemoved(c)
		}
	}
	return true
}
