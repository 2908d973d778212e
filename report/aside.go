package report

import (
	"slices"
	"time"
)

// asideCond is a condition of a known type read back (the state file, the
// Node) with a reason this build does not know: an upgrade past a renamed
// or removed reason, a rollback past an added one. It is not in the store:
// not shown, not written to the Node, not counted, since this build cannot
// name its reason. Its status and transition time go to the first Set of
// its type (asideTimeLocked): a True that stays True keeps the time its
// watchers (a MachineHealthCheck's timeout, an alert's `for:`) have been
// timing; another status is a real transition, now.
type asideCond struct {
	// c holds the status and the times (a time in the future taken as
	// now, as for a restored condition); its reason is not this build's.
	c Condition
	// observed: c's transition time is a change a store saw (the state
	// file's transitionsObserved), not the Node's word.
	observed bool
	// saved is the condition as the state file held it (its message
	// capped), saved back until the first Set of its type, so that a
	// restart before that keeps it and a build that knows the reason finds
	// it; nil when only the Node had it. savedObserved: it was in the
	// file's transitionsObserved.
	saved         *Condition
	savedObserved bool
}

// heldUnderAKnownReason returns c, a condition read back (the state file,
// the Node), under a reason this build knows when c is a held True (a
// kernel condition's, until the reboot; a tamper condition's, until a
// clear) whose reason it does not know: the type's first problem reason,
// the other build's reason named in the message. Such a True is not set
// aside: nothing this build evaluates may lower it (a kernel condition's
// line lies behind the saved cursor and is not read again; a tamper
// condition's findings may be gone with tamper.json), and the first Set of
// its type would (the kernel log monitor's start placeholder, a False).
// ok is false, and c returned as it is, for any other condition.
func heldUnderAKnownReason(desc ConditionDesc, c Condition) (Condition, bool) {
	if c.Status != StatusTrue || desc.Hold == HoldWhileTrue || len(desc.ProblemReasons) == 0 || desc.ValidReason(c.Status, c.Reason) {
		return c, false
	}
	c.Message = "reported by another build as " + string(c.Reason) + ": " + c.Message
	c.Reason = desc.ProblemReasons[0]
	return c, true
}

// knownStatus reports whether st is one of the three statuses.
func knownStatus(st Status) bool {
	return st == StatusTrue || st == StatusFalse || st == StatusUnknown
}

// loadAsideLocked sets aside c, read from the state file as it was
// (raw) and with its times as Load takes them (c).
func (s *Store) loadAsideLocked(raw, c Condition, observed bool) {
	raw.Message = CapMessage(raw.Message)
	if s.aside == nil {
		s.aside = map[string]asideCond{}
	}
	s.aside[c.Type] = asideCond{c: c, observed: observed, saved: &raw, savedObserved: observed}
}

// adoptAsideLocked merges the Node's c (its time as Adopt takes it; was, as
// written) into what is aside for its type, by Adopt's rules for a
// condition the store holds: the same status takes the Node's time (the one
// watchers have been timing) unless the state file saw a change to it after
// that; another status takes the Node's when it is the later word
// (nodeIsNewer) or a held True.
func (s *Store) adoptAsideLocked(desc ConditionDesc, c Condition, was time.Time, held, future bool) {
	if s.aside == nil {
		s.aside = map[string]asideCond{}
	}
	a, ok := s.aside[c.Type]
	switch {
	case !ok:
		c.LastUpdateTime = c.LastTransitionTime
		s.aside[c.Type] = asideCond{c: c}
	case a.c.Status == c.Status:
		if was.IsZero() || a.observed &&
			a.c.LastTransitionTime.Truncate(time.Second).After(c.LastTransitionTime.Truncate(time.Second)) {
			return
		}
		a.c.LastTransitionTime, a.observed = c.LastTransitionTime, false
		s.aside[c.Type] = a
	case held && a.c.Status != StatusTrue, nodeIsNewer(desc, a.c, c, false, future):
		c.LastUpdateTime = a.c.LastUpdateTime
		if c.LastUpdateTime.Before(c.LastTransitionTime) {
			c.LastUpdateTime = c.LastTransitionTime
		}
		a.c, a.observed = c, false
		s.aside[c.Type] = a
	}
}

// takeAsideLocked removes what is aside for condType (its first Set, its
// removal) and returns it.
func (s *Store) takeAsideLocked(condType string) (asideCond, bool) {
	a, ok := s.aside[condType]
	delete(s.aside, condType)
	return a, ok
}

// savedAsideLocked returns the conditions set aside from the state file as
// read, for the next save, and which of them were observed transitions.
func (s *Store) savedAsideLocked() (conds []Condition, observed []string) {
	for t, a := range s.aside {
		if a.saved == nil {
			continue
		}
		if _, ok := s.conds[t]; ok {
			continue
		}
		conds = append(conds, *a.saved)
		if a.savedObserved {
			observed = append(observed, t)
		}
	}
	return conds, observed
}

// Aside returns the condition types read back with a reason this build
// does not know and not evaluated since (sorted): not in the store, their
// status and transition time kept for their first Set. Remove drops one.
func (s *Store) Aside() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.aside))
	for t := range s.aside {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}
