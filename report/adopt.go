package report

import (
	"time"
)

// bootSlack absorbs the Node's one-second resolution of transition times.
const bootSlack = 2 * time.Second

// futureSlack is how far after now a transition time read back from the
// Node or the state file may lie and still be taken as it is (SetClock).
const futureSlack = time.Minute

// Adopt merges a condition read back from the Node when the daemon starts,
// so a restart (even one that lost the state file) neither flaps a condition
// nor resets the timers of anything that watches it:
//   - not in the store: taken over as it is (observers see a restore);
//   - same status in the store: the Node's lastTransitionTime wins, because
//     it is the one watchers have been timing; unless the store saw the
//     condition change to that status after the Node's time (a change the
//     API server has not seen: True, False, True through an outage), not
//     just found it so first (a start without the state file); never a
//     kernel condition the Node shows True in this boot, True since then
//     (the store's False before its change was a lost state);
//   - a condition held until reboot (the kernel's) that the Node shows True
//     since this boot began, or one held forever (tamper) that the Node shows
//     True: taken over even when the store says otherwise, because such a
//     condition never turns False by itself; the store lost it (a start
//     without its state file, or a kernel line the ring buffer no longer
//     holds);
//   - a kernel condition the Node shows True from an earlier boot: ignored
//     (a reboot clears kernel conditions);
//   - a condition the Node shows True since before an operator cleared it
//     (Release, SetCleared): ignored;
//
// Which boot a True kernel condition on the Node belongs to: nodeBoot is
// the boot ID of the Node's report annotations, which the daemon writes only
// with (in the same patch: the first write of a boot's conditions carries
// them) or after the conditions of that boot; when it is this boot, every
// condition on the Node is this boot's, and when it is another, none is. Without one (a Node written by
// an older version), the transition time is compared with this boot's start
// (wall clock; a clock stepped since can misjudge it).
//   - another status in the store that is the kernel log monitor's
//     placeholder (Unknown, NoData: the log not read yet after a start
//     without the state file): the Node wins; the store knows nothing the
//     Node does not;
//   - another status in the store, last evaluated before the Node's status
//     changed (a state file older than the Node: a save that failed, a
//     crash before the save): the Node wins; it holds the later word.
//     Compared at the Node's one-second resolution; never for a held
//     condition the store has True (only an operator's clear lowers it);
//   - another status in the store, evaluated since: the store wins; it
//     holds a change the API server has not seen yet. An evaluation this
//     process made is since, whatever the times say: the Node holds what
//     an earlier run wrote (a clock set back since dates this run's
//     evaluation before it).
//
// A transition time more than futureSlack after the store's clock (SetClock)
// was written while the clock was ahead: it is taken as now (the status and
// reason kept; Redaters are told), so watchers' timers start now at worst,
// and it orders nothing against the store (nodeIsNewer).
//
// A condition type outside the catalog is ignored. One with a reason this
// build does not know (an upgrade past a renamed reason, a rollback past an
// added one) is never taken: for a condition the store holds with the same
// status, its time is taken as above (the store's reason kept); for one the
// store does not hold, its status and time are set aside for the first Set
// of its type (asideCond), which keeps the time when it sets the same status. The message is
// taken as the store keeps every message (CapMessage). Adopt reports whether
// the store changed.
func (s *Store) Adopt(c Condition, nodeBoot string) bool {
	desc, ok := Lookup(c.Type)
	if !ok || !knownStatus(c.Status) {
		return false
	}
	// A held True (kernel, tamper) is taken under a reason this build
	// knows (heldUnderAKnownReason); whether it is taken is decided below
	// as for any held True (its boot, a clear).
	c, _ = heldUnderAKnownReason(desc, c)
	// A reason this build does not know (an upgrade past a renamed one, a
	// rollback past an added one): the condition is not taken, but its
	// time is, for the same status (asideCond).
	unknownReason := !desc.ValidReason(c.Status, c.Reason)
	// The Node's message is made printable and capped as every message
	// the store holds: an earlier build wrote the kernel's line raw (a
	// hung task named with a terminal escape sequence), which status, the
	// state file and every later write carried on for the boot.
	c.Message = CapMessage(c.Message)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	thisBoot := s.bootStart.IsZero() || !c.LastTransitionTime.Before(s.bootStart.Add(-bootSlack))
	if nodeBoot != "" {
		thisBoot = nodeBoot == s.bootID
	}
	// A time in the future (written while the clock was ahead) is taken as
	// now, and orders nothing against the store (nodeIsNewer); which boot
	// and which clear it follows are judged by the time as written.
	was := c.LastTransitionTime
	var future bool
	c.LastTransitionTime, future = s.notFutureLocked(was)
	if was.IsZero() {
		// No transition time (the Node edited by hand, or written so by
		// an earlier build, from a state file without one): since when
		// is not known. Taken as now, once (the next write puts it on
		// the Node), and, as a time in the future, it orders nothing
		// (nodeIsNewer) and replaces no time the store has.
		c.LastTransitionTime, future = s.nowLocked(), true
	}
	// bootHeld: a kernel condition True on the Node in this boot has been
	// True since the Node's time: nothing lowers it before the reboot, so
	// a False in the store (a start that lost the state file, the line gone
	// from the ring buffer) was never its status, nor the change from it to
	// True the store saw afterwards a change.
	bootHeld := c.Status == StatusTrue && desc.Hold == HoldUntilReboot && thisBoot
	held := bootHeld || c.Status == StatusTrue && desc.Hold == HoldForever
	prev, had := s.conds[c.Type]
	cleared, wasCleared := s.cleared[c.Type]
	switch {
	case c.Status == StatusTrue && wasCleared && !was.After(cleared):
		// True from before an operator's clear: not this daemon's state.
		s.mu.Unlock()
		return false
	case desc.Hold == HoldUntilReboot && c.Status == StatusTrue && !thisBoot:
		s.mu.Unlock()
		return false
	case !had && unknownReason:
		// Not the store's (this build cannot name it): its status and
		// time go to the first Set of its type.
		s.adoptAsideLocked(desc, c, was, held, future)
		s.mu.Unlock()
		return false
	case !had:
		// The Node's word replaces what the state file held with a
		// reason this build does not know.
		delete(s.aside, c.Type)
		s.conds[c.Type] = c
		s.seedPartsLocked(desc, c)
	case prev.Status == c.Status && !bootHeld && s.observed[c.Type] && (s.changedHere[c.Type] ||
		prev.LastTransitionTime.Truncate(time.Second).After(c.LastTransitionTime.Truncate(time.Second))):
		// The store saw the condition change to this status after the
		// Node's time (True, False, True through an outage): its time is
		// the later word, written with the next write. A change this
		// process saw is later than the Node's whatever the wall clock
		// says (a clock stepped back since the Node's write dates it
		// earlier); one restored from the state file is judged by the
		// times.
		s.mu.Unlock()
		return false
	case prev.Status == c.Status && !prev.LastTransitionTime.Equal(c.LastTransitionTime) && !was.IsZero():
		prev.LastTransitionTime = c.LastTransitionTime
		s.conds[c.Type] = prev
		obs := s.observers
		s.mu.Unlock()
		s.Touch()
		if future {
			redated(obs, prev, was, "node")
		}
		return true
	case unknownReason:
		// Another status, with a reason this build cannot name: the
		// store keeps its word.
		s.mu.Unlock()
		return false
	case held && prev.Status != StatusTrue, nodeIsNewer(desc, prev, c, s.evaluatedHere[c.Type], future):
		c.LastUpdateTime = prev.LastUpdateTime
		if c.LastUpdateTime.Before(c.LastTransitionTime) {
			c.LastUpdateTime = c.LastTransitionTime
		}
		s.conds[c.Type] = c
		// The parts restored from the state file said otherwise (a part
		// decided since the start stays).
		s.seedPartsLocked(desc, c)
		close(s.changed)
		s.changed = make(chan struct{})
	default:
		s.mu.Unlock()
		return false
	}
	obs := s.observers
	s.mu.Unlock()
	s.Touch()
	if future {
		redated(obs, c, was, "node")
	}
	for _, o := range obs {
		o.ConditionRestored(c)
	}
	return true
}

// notFutureLocked returns t, or now when t lies more than futureSlack after
// the store's clock (SetClock), and whether it did.
func (s *Store) notFutureLocked(t time.Time) (time.Time, bool) {
	if s.clock == nil {
		return t, false
	}
	if now := s.clock(); t.After(now.Add(futureSlack)) {
		return now, true
	}
	return t, false
}

// redated tells the Redaters among obs that c's transition time, was as
// read from from, was taken as now.
func redated(obs []Observer, c Condition, was time.Time, from string) {
	for _, o := range obs {
		if r, ok := o.(Redater); ok {
			r.TransitionRedated(c, was, from)
		}
	}
}

// nodeIsNewer reports whether the Node's condition c, of another status than
// the store's prev, is the later word on it: prev is the kernel log
// monitor's placeholder (Unknown, NoData: the log not read yet), or the
// store last evaluated the condition before the Node's status changed (at
// the Node's one-second resolution: an evaluation within the second c's
// time names is not known to be older). What the store knows is as recent
// as its last evaluation, not its last change: a check that ran after the
// restart and found the same status as a stale state file is newer than
// the Node. An evaluation this process made (here) is newer than the Node
// whatever the times say: the Node holds what an earlier run of the daemon
// wrote, and a wall clock stepped back since (or this boot's, behind the
// last boot's) dates the evaluation before it. A Node time that lay in the
// future (written while the clock was ahead; c holds it taken as now)
// orders nothing: it is not known to be later than the store's. A held condition the store
// has True is never lowered this way: only an operator's clear lowers it,
// and the store knows of those (SetCleared).
func nodeIsNewer(desc ConditionDesc, prev, c Condition, here, future bool) bool {
	if prev.Status == c.Status || c.LastTransitionTime.IsZero() {
		return false
	}
	if prev.Status == StatusTrue && desc.Hold != HoldWhileTrue {
		return false
	}
	if prev.Status == StatusUnknown && prev.Reason == ReasonNoData {
		if _, kernel := desc.Part(SourceKmsg); kernel || desc.Source == SourceKmsg {
			return true
		}
	}
	if here || future {
		return false
	}
	return prev.LastUpdateTime.Truncate(time.Second).Before(c.LastTransitionTime.Truncate(time.Second))
}
