package report

import (
	"fmt"
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

// Remover is an Observer that is also told when a condition is removed
// from the store (Remove: it is no longer evaluated on this node).
type Remover interface {
	ConditionRemoved(c Condition)
}

// Redater is an Observer that is also told when a transition time read
// back from the Node (from "node") or the state file (from "state file")
// lay more than futureSlack after now and was taken as now (c, with its
// new time; was, the time read), or was missing (was zero) and was taken
// as the state file's save time, or as now from the Node. It is told once
// per condition and read.
type Redater interface {
	TransitionRedated(c Condition, was time.Time, from string)
}

// Emit records a one-shot event.
func (s *Store) Emit(e Event) {
	if _, ok := LookupEvent(e.Reason); !ok {
		panic(fmt.Sprintf("report: Emit of unknown event reason %q", e.Reason))
	}
	e.Message = CapMessage(e.Message)
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.mu.Lock()
	obs := s.observers
	s.mu.Unlock()
	for _, o := range obs {
		o.EventEmitted(e)
	}
}

// CapMessage is m as the store keeps it: Printable (no control character,
// no invalid UTF-8: \xNN instead), then at most MaxMessageLen bytes, cut at
// a character's start, not inside a \xNN, and marked "...(truncated)".
func CapMessage(m string) string {
	m = Printable(m)
	if len(m) <= MaxMessageLen {
		return m
	}
	const ell = "...(truncated)"
	cut := MaxMessageLen - len(ell)
	for cut > 0 && !utf8Start(m[cut]) {
		cut--
	}
	for k := 1; k <= 3 && k <= cut; k++ {
		if m[cut-k] == '\\' && m[cut-k+1] == 'x' {
			cut -= k
			break
		}
	}
	return m[:cut] + ell
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
