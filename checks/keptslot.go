package checks

import (
	"sync"
	"time"
)

// keptConnIdle is how long a probe's kept connection (the CRI call's and
// kubelet's /healthz) may stay unused (a probe every 10 s uses it long
// before).
const keptConnIdle = 90 * time.Second

// keptSlot is the one connection a probe's client keeps between its calls
// (criClient's, healthzGet's). A call takes it and owns it while it runs: a
// call that starts while another still runs (a timed-out probe's goroutine)
// finds none and dials one of its own, and of two put back the later stays,
// the other closed. A connection unused for keptConnIdle is closed, and not
// given to a call: a timer armed when one is put back and none is armed,
// which, when it fires, is set again for what is left where the connection
// was used since; not reset at each put (a timer's change is a change to the
// runtime's timer heap at every probe). close closes the kept connection; a
// call running keeps its own, which it may put back (closed after
// keptConnIdle unused).
type keptSlot[T interface {
	comparable
	Close() error
}] struct {
	mu       sync.Mutex
	kept     T // the zero T: none
	lastUsed time.Time
	idle     *time.Timer
	armed    bool
}

// take takes the kept connection: the zero T where there is none, or
// where it was unused for keptConnIdle (closed).
func (s *keptSlot[T]) take() T {
	var none T
	s.mu.Lock()
	h, last := s.kept, s.lastUsed
	s.kept = none
	s.mu.Unlock()
	if h != none && time.Since(last) >= keptConnIdle {
		h.Close()
		return none
	}
	return h
}

// put keeps h for the next call; a connection kept meanwhile is closed.
func (s *keptSlot[T]) put(h T) {
	s.mu.Lock()
	old := s.kept
	s.kept, s.lastUsed = h, time.Now()
	if !s.armed {
		s.armed = true
		if s.idle == nil {
			s.idle = time.AfterFunc(keptConnIdle, s.idleClose)
		} else {
			s.idle.Reset(keptConnIdle)
		}
	}
	s.mu.Unlock()
	var none T
	if old != none {
		old.Close()
	}
}

// close closes the kept connection.
func (s *keptSlot[T]) close() {
	var none T
	s.mu.Lock()
	h := s.kept
	s.kept = none
	if s.idle != nil {
		s.idle.Stop()
		s.armed = false
	}
	s.mu.Unlock()
	if h != none {
		h.Close()
	}
}

// idleClose closes the kept connection when unused for keptConnIdle, or
// sets the timer again for what is left where it was used since.
func (s *keptSlot[T]) idleClose() {
	var none T
	s.mu.Lock()
	h := s.kept
	if h == none {
		s.armed = false
		s.mu.Unlock()
		return
	}
	if left := keptConnIdle - time.Since(s.lastUsed); left > 0 {
		s.idle.Reset(left)
		s.mu.Unlock()
		return
	}
	s.kept = none
	s.armed = false
	s.mu.Unlock()
	h.Close()
}
