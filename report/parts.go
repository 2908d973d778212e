package report

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

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
	// Two sources setting their parts at once must not write an outdated
	// combination last.
	c.Message = CapMessage(c.Message)
	s.partMu.Lock()
	defer s.partMu.Unlock()
	s.mu.Lock()
	if s.parts[c.Type] == nil {
		s.parts[c.Type] = map[string]Condition{}
	}
	s.parts[c.Type][part.Name] = c
	if rp, ok := s.restoredParts[c.Type]; ok {
		s.restoredParts[c.Type] = slices.DeleteFunc(rp, func(n string) bool { return n == part.Name })
	}
	s.evaluatedLocked(c.Type, part.Name)
	return s.combineLocked(desc, c.Type, now)
}

// Part returns src's part of a condition, as last set or restored.
func (s *Store) Part(src Source, condType string) (Condition, bool) {
	desc, _ := Lookup(condType)
	part, ok := desc.Part(src)
	if !ok {
		return Condition{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.parts[condType][part.Name]
	return c, ok
}

// ForgetPart drops src's part of a condition without setting the condition
// anew: a part restored from the state file whose source no longer runs
// here (its check disabled while the daemon was down) must not hold the
// condition once the source that runs sets its part. Nor does the Node's
// word set it again (Adopt), until src sets it.
func (s *Store) ForgetPart(src Source, condType string) {
	desc, _ := Lookup(condType)
	if part, ok := desc.Part(src); ok {
		s.mu.Lock()
		delete(s.parts[condType], part.Name)
		s.notEvaluatedLocked(condType, part.Name)
		s.mu.Unlock()
	}
}

// notEvaluatedLocked records that a part's source does not run here; s.mu
// is held.
func (s *Store) notEvaluatedLocked(condType, part string) {
	if s.notEvaluated == nil {
		s.notEvaluated = map[string][]string{}
	}
	if !slices.Contains(s.notEvaluated[condType], part) {
		s.notEvaluated[condType] = append(s.notEvaluated[condType], part)
	}
}

// evaluatedLocked records that a part's source runs (again); s.mu is held.
func (s *Store) evaluatedLocked(condType, part string) {
	if ps, ok := s.notEvaluated[condType]; ok {
		s.notEvaluated[condType] = slices.DeleteFunc(ps, func(n string) bool { return n == part })
	}
}

// SeedParts sets the parts of condType that no source has decided since
// the start from the condition the store holds, as Load does for a
// condition restored without its parts (seedPartsLocked); without the
// condition it does nothing.
func (s *Store) SeedParts(condType string) {
	desc, _ := Lookup(condType)
	s.partMu.Lock()
	defer s.partMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conds[condType]; ok && len(desc.Parts) > 0 {
		s.seedPartsLocked(desc, c)
	}
}

// seedPartsLocked sets the parts of a condition the Node's word c replaced
// at start (Adopt) where no source has decided since the start: a part
// restored from the state file (it said otherwise), one with no data yet
// (the kernel log not read), or none. The part whose reasons hold c's, when
// c is True, is c; the others have no data, so that the first part to
// decide does not lower a True the Node holds for another part, and a
// condition no part has decided keeps the Node's status. s.mu is held.
func (s *Store) seedPartsLocked(desc ConditionDesc, c Condition) {
	t := c.Type
	for _, p := range desc.Parts {
		if slices.Contains(s.notEvaluated[t], p.Name) {
			continue // its source does not run here: nothing would set it again
		}
		cur, ok := s.parts[t][p.Name]
		if ok && !slices.Contains(s.restoredParts[t], p.Name) && (cur.Status != StatusUnknown || cur.Reason != ReasonNoData) {
			continue // decided since the start: newer than the Node
		}
		part := Condition{Type: t, Status: StatusUnknown, Reason: ReasonNoData, Message: "taken over from the Node; not evaluated since"}
		if c.Status == StatusTrue && slices.Contains(p.Reasons, c.Reason) {
			part.Status, part.Reason, part.Message = c.Status, c.Reason, c.Message
		}
		if s.parts[t] == nil {
			s.parts[t] = map[string]Condition{}
		}
		s.parts[t][p.Name] = part
	}
	delete(s.restoredParts, t)
}

// RemovePart drops src's part of a condition (src no longer evaluates it:
// its check was disabled) and sets the condition from the parts left; with
// none left the condition is removed (Remove). The Node's word does not set
// the part again (ForgetPart). It reports whether the condition changed.
func (s *Store) RemovePart(src Source, condType string, now time.Time) bool {
	desc, _ := Lookup(condType)
	part, ok := desc.Part(src)
	if !ok {
		return false
	}
	s.partMu.Lock()
	defer s.partMu.Unlock()
	s.mu.Lock()
	s.notEvaluatedLocked(condType, part.Name)
	if _, had := s.parts[condType][part.Name]; !had {
		s.mu.Unlock()
		return false
	}
	delete(s.parts[condType], part.Name)
	if len(s.parts[condType]) == 0 {
		s.mu.Unlock()
		return s.Remove(condType)
	}
	return s.combineLocked(desc, condType, now)
}

// combineLocked sets a condition from its parts; s.mu is held (and
// released here), and s.partMu.
func (s *Store) combineLocked(desc ConditionDesc, condType string, now time.Time) bool {
	var trues, falses, undecided, nothing, nodata []Condition
	for _, n := range desc.Parts {
		p, seen := s.parts[condType][n.Name]
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
		case p.Reason == ReasonNoData:
			nodata = append(nodata, p)
		default:
			undecided = append(undecided, p)
		}
	}
	cur, had := s.conds[condType]
	s.mu.Unlock()
	if len(trues)+len(falses)+len(undecided) == 0 && len(nodata) > 0 && had && cur.Status != StatusUnknown {
		// No part has decided anything yet (the kernel log not read, no
		// NVMe drive to check) and the condition holds a decided status
		// (taken over from the Node at start): it stays until a part
		// decides, rather than turning Unknown for a second and back.
		return false
	}
	// A part that found nothing to check (no NVMe drives) neither makes the
	// condition healthy nor undecided: the other parts decide, and when no
	// part checked anything, neither does the condition. Nor does a part
	// that has no data yet (NoData: the kernel log not read yet, for the
	// second or so after a start): a start whose other part already ran
	// must not turn a condition the Node holds (adopted) Unknown and back.
	// With only such parts the condition has no data yet either.
	out := Condition{Type: condType}
	var pick []Condition
	switch {
	case len(trues) > 0:
		out.Status, out.Reason, pick = StatusTrue, trues[0].Reason, trues
	case len(undecided) > 0:
		out.Status, out.Reason, pick = StatusUnknown, undecided[0].Reason, append(undecided, falses...)
	case len(falses) > 0:
		out.Status, out.Reason, pick = StatusFalse, desc.HealthyReason, append(falses, nothing...)
	case len(nodata) > 0:
		out.Status, out.Reason, pick = StatusUnknown, ReasonNoData, nodata
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
