package kube

import (
	"context"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/syself/autopilot-health/report"
)

// EventsKey is the key of the event writer's aggregation in the state file
// (report.Store.Keep): kept for the boot, so that an event that repeats
// after a restart of the daemon (an upgrade, the watchdog, a crash,
// systemctl restart) raises the count of its Event, as without the
// restart, instead of making a second one.
const EventsKey = "events"

// keptEventsState is the event writer's aggregation as the state file
// keeps it: every aggregate of the table (maxAggregates at most), so that
// the Events of a reason's distinct messages a restart finds in their
// window still count towards maxSimilarEvents.
type keptEventsState struct {
	// Node is the node the Events are about: kept Events of another name
	// (node_name changed) are not restored.
	Node string `json:"node"`
	// Seq is the sequence number of the last Event name taken.
	Seq    uint64      `json:"seq"`
	Events []keptEvent `json:"events,omitempty"`
	// Queued are the occurrences handled but not in Events yet (queued,
	// or taken by the writer since it last published Events): the next
	// start queues them again (EventQueue.KeepIn).
	Queued []queuedEvent `json:"queued,omitempty"`
}

// keptEvent is one aggregate: what decides whether an occurrence is its
// Event (reason, message, the window from First) and what its writes go on
// from. Count is the occurrences folded into it, SentCount the count last
// written (-1: a create found saved, its count not known yet).
type keptEvent struct {
	Reason     string    `json:"reason"`
	Message    string    `json:"message"`
	Combined   bool      `json:"combined,omitempty"`
	Retired    bool      `json:"retired,omitempty"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	Count      int32     `json:"count"`
	Name       string    `json:"name,omitempty"`
	Namespace  string    `json:"namespace,omitempty"`
	CreateName string    `json:"createName,omitempty"`
	SentCount  int32     `json:"sentCount"`
	LastPatch  time.Time `json:"lastPatch,omitzero"`
	Refused    bool      `json:"refused,omitempty"`
}

// keepEvery is how often at most a change of counts alone is published for
// the state file (keepEvents): in a flood the event loop turns for each
// occurrence, and the copy is of the whole table.
const keepEvery = time.Second

// keepEvents publishes the aggregation for the state file when it changed,
// and tells the store: soon (Touch) after an Event was created, whose name
// lost in a crash would make the next run create a second Event; with the
// next save (TouchLater) after other changes, a change of counts alone
// published keepEvery at most (unless force): a count lost in a crash is
// read back from the Event (readEvent); not at all when aggregates done
// with were dropped alone (restored, the next run drops them too). Event
// loop only.
func (r *Reporter) keepEvents(aggs map[aggKey]*aggregate, now time.Time, force bool) {
	if !r.eventsChanged && !r.eventsNamed && !r.eventsTrimmed {
		return
	}
	if !force && !r.eventsNamed && !r.eventsTrimmed && now.Sub(r.keptAt) < keepEvery && r.taken < eventQueue {
		// The loop wakes for it; what it took meanwhile the queue keeps
		// (EventQueue.keep), a queue's length of it at most.
		return
	}
	r.keptAt = now
	st := keptEventsState{Node: r.o.NodeName, Seq: r.eventSeq, Events: make([]keptEvent, 0, len(aggs))}
	for k, a := range aggs {
		e := keptEvent{Reason: a.reason, Message: a.message, Combined: a.combined, Retired: k.retired != 0,
			First: a.first, Last: a.last, Count: a.count, Name: a.name, CreateName: a.createName,
			SentCount: a.sentCount, LastPatch: a.lastPatch, Refused: a.refused}
		if a.name != "" {
			e.Namespace = EventNamespace
		}
		st.Events = append(st.Events, e)
	}
	r.o.Events.publish(st, r.taken)
	r.taken = 0
	switch {
	case r.eventsNamed:
		r.o.Store.Touch()
	case r.eventsChanged:
		r.o.Store.TouchLater()
	}
	r.eventsChanged, r.eventsNamed, r.eventsTrimmed = false, false, false
}

// restoreEvents returns the aggregation an earlier run of the daemon kept
// in this boot's state file (none without one), and publishes it as the
// value kept from now on. Entries that are not as the daemon writes them
// are left out, and said so once. (The occurrences the file held that its
// Events did not count yet are in the queue: EventQueue.KeepIn.)
func (r *Reporter) restoreEvents() map[aggKey]*aggregate {
	aggs := r.restoreKept()
	// The occurrences the state file held that its Events did not count
	// yet, before any of this run's (the queue's): folded, not taken off
	// the queue (r.taken), and kept until published below.
	for _, q := range r.o.Events.takeCarried() {
		e := report.Event{Reason: q.Reason, Message: q.Message, Time: q.First}
		for i := range q.Count {
			if i > 0 {
				e.Time = q.Last
			}
			r.fold(aggs, e)
		}
	}
	// Published as restored: what the state file holds already needs no
	// save of its own (a save for the occurrences folded, with the next).
	r.eventsTrimmed = true
	r.keepEvents(aggs, time.Now(), true)
	return aggs
}

// restoreKept returns the aggregation kept in the state file (restoreEvents).
func (r *Reporter) restoreKept() map[aggKey]*aggregate {
	aggs := map[aggKey]*aggregate{}
	st, had, err := r.o.Events.restored()
	if !had || err != nil {
		if err != nil {
			r.o.Log.Warn("the Events kept in the state file are unreadable; events that repeat after this restart make Events of their own", "err", err)
		}
		return aggs
	}
	// Names stay unique also where the clock's start is not later (a
	// reporter made again in the same run).
	r.eventSeq = max(r.eventSeq, st.Seq)
	// Kept under another node_name (changed between the runs), or the
	// credentials name another node: what the kept Events hold that is
	// not on the API server yet is not sent (about a Node that is not
	// this one's), and counted as dropped; this node's next Events are
	// its own.
	if other := st.Node != r.o.NodeName; other || r.eventsAnotherNode() {
		var n int64
		for _, e := range st.Events {
			if a, ok := e.aggregate(); ok && !a.refused {
				n += int64(a.count - max(a.sentCount, 0))
			}
		}
		r.m.drop(DropAnotherNode, float64(n))
		if other && len(st.Events) > 0 {
			r.o.Log.Warn("the Events kept in the state file are of another node_name: not sent about this one (counted in events_dropped_total{reason=\"another_node\"})",
				"kept_node", report.Printable(st.Node), "node_name", r.o.NodeName, "events", len(st.Events), "occurrences_dropped", n)
		}
		return aggs
	}
	left := 0
	for _, e := range st.Events {
		a, ok := e.aggregate()
		k := aggKey{reason: a.reason, message: a.message, combined: a.combined}
		if a.combined {
			k.message = ""
		}
		if e.Retired {
			r.retired++
			k.retired = r.retired
		}
		if _, dup := aggs[k]; !ok || dup || len(aggs) >= maxAggregates {
			left++
			continue
		}
		aggs[k] = a
	}
	if left > 0 {
		r.o.Log.Warn("Events kept in the state file left out: not as the daemon writes them; their events make Events of their own", "left_out", left, "restored", len(aggs))
	}
	return aggs
}

// aggregate is the kept entry as the event writer holds it; ok is false for
// one the daemon does not write (an edited state file, another build's).
func (e keptEvent) aggregate() (*aggregate, bool) {
	a := &aggregate{reason: e.Reason, message: report.CapMessage(e.Message), combined: e.Combined,
		first: e.First, last: e.Last, count: e.Count, name: e.Name, createName: e.CreateName,
		sentCount: e.SentCount, lastPatch: e.LastPatch, refused: e.Refused,
		restored: e.Name != "" || e.CreateName != "", keptCount: e.Count}
	ok := e.Reason != "" && e.Count >= 1 && e.SentCount >= -1 && e.SentCount <= e.Count &&
		!e.First.IsZero() && !e.Last.Before(e.First) &&
		(e.Name == "" || (e.Namespace == EventNamespace && len(e.Name) <= maxEventName)) &&
		len(e.CreateName) <= maxEventName &&
		(e.SentCount >= 0 || e.Name != "") &&
		(!e.Combined || strings.HasPrefix(e.Message, combinedPrefix))
	if a.refused {
		a.restored = false
	}
	return a, ok
}

// readEvent reads a restored aggregate's Event before its first patch, by a
// patch of nothing (a node's credentials may patch Events, not get them),
// and goes on from what the API server holds: a crash after patches the
// state file did not take leaves the kept count behind the Event's. The
// occurrences before the restart are the larger of the two; those folded
// since are added. gone: the Event is no longer there (expired, deleted),
// which is not a failed call.
func (r *Reporter) readEvent(ctx context.Context, a *aggregate) (gone bool, err error) {
	start := time.Now()
	ev, err := r.o.Client.PatchEvent(ctx, EventNamespace, a.name, []byte("{}"))
	if apierrors.IsNotFound(err) {
		r.m.latency.WithLabelValues(KindRead).Observe(time.Since(start).Seconds())
		a.restored = false
		r.eventsChanged = true
		return true, nil
	}
	r.m.observe(KindRead, start, err)
	if err != nil {
		return false, err
	}
	since := a.count - a.keptCount
	a.count = max(ev.Count, a.keptCount) + since
	a.sentCount = ev.Count
	if t := ev.LastTimestamp.Time; t.After(a.last) {
		a.last = t
	}
	a.restored = false
	r.eventsChanged = true
	return false, nil
}
