package kube

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/syself/autopilot-health/report"
)

// EventQueue holds the daemon's events until the reporter sends them. It is
// a report.Observer that never blocks: when the queue is full an event is
// dropped and counted.
//
// Kept in a store (KeepIn), it is also what the state file takes of the
// Events: the aggregation the event writer last published (publish), and
// the occurrences not in it yet, those queued and those the writer took
// off the queue since, in the order they came. A crash then loses none of
// an occurrence the kernel log cursor saved beside it counts as handled
// (the queue is read after the cursor: report.Store.KeepLast): the next
// start's writer folds them first, before the events it emits itself
// (takeCarried).
type EventQueue struct {
	ch chan report.Event
	m  *Metrics

	// mu guards the rest. The store's lock is taken before it (keep runs
	// under it), never after.
	mu    sync.Mutex
	store *report.Store
	// kept is the aggregation as the event writer last published it, or
	// as the state file held it at the start until a writer does; had:
	// there is one; keptErr: the state file's did not decode.
	kept    keptEventsState
	had     bool
	keptErr error
	// unkept are the events queued, or taken by the writer since it
	// published kept, in order: a prefix of them is what it took.
	unkept []report.Event
	// carried are the occurrences the state file held that its Events did
	// not count yet (KeepIn), kept before unkept until a writer took them
	// (takeCarried) and published an aggregation that holds them.
	carried      []queuedEvent
	carriedTaken bool
}

// maxCarried bounds the occurrences a start takes over from the state
// file's queued ones: what this build writes at most (the queue's length
// queued, and as many taken by the writer since it last published: its
// foldQueued stops there). More is not as the daemon writes it (an edited
// file): left out and counted as dropped, never folded one by one.
const maxCarried = 2 * eventQueue

// NewEventQueue returns an empty queue; register it with the store.
func NewEventQueue(m *Metrics) *EventQueue {
	q := &EventQueue{ch: make(chan report.Event, eventQueue), m: m}
	m.mu.Lock()
	m.queue = q
	m.mu.Unlock()
	return q
}

// ConditionChanged implements report.Observer.
func (q *EventQueue) ConditionChanged(*report.Condition, report.Condition) {}

// ConditionRestored implements report.Observer.
func (q *EventQueue) ConditionRestored(report.Condition) {}

// EventEmitted implements report.Observer.
func (q *EventQueue) EventEmitted(e report.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.enqueueLocked(e)
}

func (q *EventQueue) enqueueLocked(e report.Event) {
	select {
	case q.ch <- e:
		if q.store != nil {
			q.unkept = append(q.unkept, e)
		}
	default:
		q.m.dropped.Inc()
	}
}

// KeepIn keeps the queue in s's state file (under EventsKey, read after
// the other kept values), taking over what the file holds: its Events for
// the writer to restore (restored), and its occurrences not yet in them for
// the writer to fold first (takeCarried), maxCarried at most. Call it after s was loaded and before events are emitted;
// again with the same store, it does nothing.
func (q *EventQueue) KeepIn(s *report.Store) {
	q.mu.Lock()
	same := q.store == s
	q.mu.Unlock()
	if same {
		return
	}
	var raw json.RawMessage
	had := s.Memo(EventsKey, &raw)
	var st keptEventsState
	var err error
	if had {
		err = json.Unmarshal(raw, &st)
	}
	q.mu.Lock()
	q.store, q.had, q.keptErr, q.unkept = s, had, err, nil
	queued := st.Queued
	st.Queued = nil
	q.kept = st
	// Not queued again: the writer folds them first (takeCarried), and
	// the queue's length is for the events of this run. Queued, those
	// past it were dropped: a crash with the writer held in a call after
	// it took a second's worth left up to twice as many.
	q.carried, q.carriedTaken = nil, false
	n := 0
	for _, r := range queued {
		if _, ok := report.LookupEvent(r.Reason); !ok || r.Count < 1 || r.First.IsZero() || r.Last.Before(r.First) {
			q.m.dropped.Add(float64(max(r.Count, 1)))
			continue
		}
		if r.Count > maxCarried-n {
			q.m.dropped.Add(float64(r.Count - (maxCarried - n)))
			r.Count = maxCarried - n
		}
		if r.Count < 1 {
			continue
		}
		r.Message = report.CapMessage(r.Message)
		if r.Count == 1 {
			r.Last = r.First
		}
		q.carried = append(q.carried, r)
		n += r.Count
	}
	q.mu.Unlock()
	s.KeepLast(EventsKey, q.keep)
}

// restored returns the aggregation to go on from: the one last published
// (a reporter made again in the run), else the state file's at KeepIn
// (had: there was one; err: it did not decode).
func (q *EventQueue) restored() (st keptEventsState, had bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.kept, q.had, q.keptErr
}

// takeCarried returns the occurrences the state file held that its Events
// did not count yet, for the writer to fold before the events it takes off
// the queue; they stay in what is kept until its next publish.
func (q *EventQueue) takeCarried() []queuedEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.carriedTaken = len(q.carried) > 0
	return q.carried
}

// publish makes st the aggregation kept; it holds the first taken events
// of unkept.
func (q *EventQueue) publish(st keptEventsState, taken int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.kept, q.had, q.keptErr = st, true, nil
	if q.carriedTaken {
		q.carried, q.carriedTaken = nil, false
	}
	n := copy(q.unkept, q.unkept[min(taken, len(q.unkept)):])
	clear(q.unkept[n:])
	q.unkept = q.unkept[:n]
}

// keep is the value kept under EventsKey: the aggregation published, and
// the occurrences not in it, a run of one message's as one entry.
func (q *EventQueue) keep() any {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.kept
	st.Queued = append([]queuedEvent(nil), q.carried...)
	for _, e := range q.unkept {
		if n := len(st.Queued); n > 0 && st.Queued[n-1].Reason == e.Reason && st.Queued[n-1].Message == e.Message && !e.Time.Before(st.Queued[n-1].Last) {
			st.Queued[n-1].Last = e.Time
			st.Queued[n-1].Count++
			continue
		}
		st.Queued = append(st.Queued, queuedEvent{Reason: e.Reason, Message: e.Message, First: e.Time, Last: e.Time, Count: 1})
	}
	return st
}

// queuedEvent is a run of occurrences of one event (reason and message)
// not in the kept aggregation yet: the first at First, the others up to
// Last.
type queuedEvent struct {
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	First   time.Time `json:"first"`
	Last    time.Time `json:"last"`
	Count   int       `json:"count"`
}
