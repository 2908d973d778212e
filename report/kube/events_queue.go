package kube

import (
	"encoding/json"
	"sync"
	"time"
	"unicode/utf8"

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
		q.m.drop(DropQueueFull, 1)
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
			q.m.drop(DropNotAsWritten, float64(max(r.Count, 1)))
			continue
		}
		if r.Count > maxCarried-n {
			q.m.drop(DropNotAsWritten, float64(r.Count-(maxCarried-n)))
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
	st.Queued = fitQueued(st.Queued, maxQueuedBytes)
	return st
}

// maxQueuedBytes bounds what the occurrences not in the kept Events take
// of the state file (queuedBytes): a queue's length and as many taken of
// distinct messages of up to report.MaxMessageLen bytes, each twice that
// encoded where every byte is escaped ('"', '\\'), took 5.5 MiB, and the
// next start moved a file over report's 4 MiB load limit aside (all state
// lost). With the kept Events (maxAggregates, about 1.2 MiB at most) and
// the rest, the file stays well under the limit (README "Local state").
const maxQueuedBytes = 1 << 20

// queuedEntryBytes is a queued entry's encoded size besides its message
// (the state file's indentation, the keys, two times, the count): an
// upper bound, measured at about 230.
const queuedEntryBytes = 320

// queuedBytes is an upper bound of q's encoded size in the state file.
func queuedBytes(q queuedEvent) int {
	return queuedEntryBytes + len(q.Reason) + jsonStringLen(q.Message)
}

// jsonStringLen is an upper bound of s's length encoded as a JSON string,
// quotes included: '"' and '\\' take 2 bytes, a control character,
// U+2028, U+2029 or a byte of invalid UTF-8 up to 6.
func jsonStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			n += 2
			i++
		case c < 0x20:
			n += 6
			i++
		case c < utf8.RuneSelf:
			n++
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				n += 6 * size
			} else {
				n += size
			}
			i += size
		}
	}
	return n
}

// fitQueued returns queued within budget bytes (queuedBytes): the first
// entries as they are, in order, and the rest merged per reason, one entry
// each after them, with their count, the first's time and the last's, and
// the latest message of the reason. No occurrence is lost: the next start
// counts each (a flood of distinct messages makes a reason's combined
// Event past maxSimilarEvents in any case); only the distinct messages of
// those merged are. Room for the merged entries is kept: a reason's entry
// is as large as any message can encode to.
func fitQueued(queued []queuedEvent, budget int) []queuedEvent {
	total := 0
	for _, q := range queued {
		total += queuedBytes(q)
	}
	if total <= budget {
		return queued
	}
	// The merged entries' room: one of the largest size for each reason.
	room := 0
	seen := map[string]bool{}
	for _, q := range queued {
		if !seen[q.Reason] {
			seen[q.Reason] = true
			room += queuedEntryBytes + len(q.Reason) + 2*report.MaxMessageLen*3 + 2
		}
	}
	used, keep := 0, 0
	for keep < len(queued) && used+queuedBytes(queued[keep]) <= budget-room {
		used += queuedBytes(queued[keep])
		keep++
	}
	out := queued[:keep:keep]
	merged := map[string]int{} // reason: index in out
	for _, q := range queued[keep:] {
		i, ok := merged[q.Reason]
		if !ok {
			merged[q.Reason] = len(out)
			out = append(out, q)
			continue
		}
		m := &out[i]
		m.Count += q.Count
		if q.First.Before(m.First) {
			m.First = q.First
		}
		if !q.Last.Before(m.Last) {
			m.Last, m.Message = q.Last, q.Message
		}
	}
	return out
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
