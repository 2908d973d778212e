package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syself/autopilot-health/internal/backoff"
	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubeapi"
)

// EventNamespace is where Events about a Node go (a Node has no namespace;
// the API requires the Event's namespace to match, and NodeRestriction
// allows a node to write events there about itself).
const EventNamespace = metav1.NamespaceDefault

// aggregate is one Event being kept up to date: identical occurrences
// (reason and message) within the dedupe window raise its count.
type aggregate struct {
	reason, message string
	first, last     time.Time
	count           int32
	name            string // set once created
	// createName is the name its create is sent under, chosen at the
	// first try and kept across retries: a create the API server saved
	// but whose answer was lost is found again (AlreadyExists), not made
	// twice.
	createName string
	sentCount  int32
	lastPatch  time.Time
	nextTry    time.Time
	// refused: the API server refused it for what it is (dropRefused):
	// kept until its window ends, so that repeats fold into it (each
	// counted as dropped) instead of each being sent and refused again.
	refused bool
	// combined: the Event of a reason's occurrences past maxSimilarEvents
	// distinct messages in its window; its message is the latest one's,
	// with combinedPrefix, and goes with each count patch.
	combined bool
	// restored: kept in the state file by an earlier run of the daemon in
	// this boot (restoreEvents), with keptCount its count as kept. Its
	// first patch reads the Event first (readEvent): a crash can have left
	// the kept count behind the API server's.
	restored  bool
	keptCount int32
}

// aggKey names an aggregate: reason and message, and for one whose dedupe
// window is over while it still waits to be written, a sequence number
// (retired) that keeps it apart from the next Event of the same text.
type aggKey struct {
	reason, message string
	retired         uint64
	combined        bool // a reason's combined Event (message "")
}

// maxSimilarEvents is how many Events of one reason with distinct messages
// are made within EventDedupeWindow; further messages of the reason fold
// into one Event of it, "(combined from similar events): <the latest>",
// whose count says how many. client-go's event correlator does the same
// (10 similar events in 10 minutes): a dying disk logs "I/O error, dev
// sda, sector N" with another sector each time, about 2 lines a second
// past the kernel's rate limit, which was 7,200 Events an hour.
const maxSimilarEvents = 10

// combinedPrefix starts a combined Event's message (client-go's words).
const combinedPrefix = "(combined from similar events): "

// eventLoop turns the daemon's events into core/v1 Events. The first
// occurrence is created at once; repeats only raise the count, patched at
// most every eventCountFlush. A failed write is retried with backoff; the
// table is bounded and what does not fit is dropped and counted.
func (r *Reporter) eventLoop(ctx context.Context) {
	const loop = eventsLoop
	// The aggregation of an earlier run in this boot (a restart), kept in
	// the state file from now on.
	r.eventsAnother = r.anotherNode() // said at start (adopt)
	aggs := r.restoreEvents()
	r.m.setEventsWaiting(waiting(aggs))
	bo := backoff.Backoff{Min: backoffMin, Max: backoffMax}
	el := r.newErrorLog("writing events of node " + r.o.NodeName)
	timer := time.NewTimer(eventsIdleBeat)
	defer timer.Stop()
	for {
		// Asleep until the next write is due (a retry, a count to patch),
		// or a minute when none is: an idle daemon does not wake this loop
		// every second.
		now := time.Now()
		wait := nextFlush(aggs, now, r.o.EventCountFlush)
		if r.eventsChanged {
			// A change of counts alone waits to be kept (keepEvents).
			wait = min(wait, max(0, r.keptAt.Add(keepEvery).Sub(now)))
		}
		r.progress(loop, wait)
		if wait == eventsIdleBeat {
			// Nothing due: the beat on the grid (never later).
			wait = r.o.Grid.Until(now, eventsIdleBeat)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			r.finalFlush(aggs)
			r.keepEvents(aggs, time.Now(), true)
			return
		case e := <-r.events:
			r.take(aggs, e)
			r.foldQueued(aggs, eventQueue) // what is already queued, before writing
		case <-timer.C:
		case <-r.apiBack():
			// The API server is back: what waits for its retry goes now,
			// or at the end of what its last answer asked for (a 429's
			// Retry-After): the probe noticed another call's outage end,
			// not the end of the wait this server asked the Events for.
			bo.Reset()
			r.eventsHold = time.Time{}
			if afterBack(r.eventsAsked) > 0 {
				r.eventsHold = r.eventsAsked
			}
			for _, a := range aggs {
				if a.nextTry.After(r.eventsHold) {
					a.nextTry = r.eventsHold
				}
			}
		}
		answered, err := r.flush(ctx, aggs, time.Now())
		if err != nil {
			if ctx.Err() != nil {
				// Shutdown cut the write short: what waits still gets
				// its one short attempt.
				r.finalFlush(aggs)
				r.keepEvents(aggs, time.Now(), true)
				return
			}
			wait, asked := retryWait(&bo, err)
			el.fail(err, wait)
			r.eventsHold, r.eventsAsked = time.Now().Add(wait), asked
			for _, a := range aggs {
				if a.name == "" || a.count != a.sentCount {
					a.nextTry = r.eventsHold
				}
			}
		} else if answered {
			// Only a call the API server answered is a recovery: a flush
			// that found everything waiting for its retry made no call.
			// An Event it refused is one (logged by dropRefused): else,
			// with no other Event to write, the failure never ended and
			// the probe dialled the API server every second for good.
			el.ok()
			bo.Reset()
			r.eventsHold = time.Time{}
		}
		r.m.setEventsWaiting(waiting(aggs))
		r.keepEvents(aggs, time.Now(), false)
	}
}

// waiting counts the occurrences in aggs not on the API server yet: those
// of Events not created yet and counts not patched yet, not those of an
// Event the API server refused (counted as dropped).
func waiting(aggs map[aggKey]*aggregate) int {
	n := 0
	for _, a := range aggs {
		switch {
		case a.refused:
		case a.name == "":
			n += int(a.count)
		case a.count > a.sentCount:
			n += int(a.count - max(a.sentCount, 0))
		}
	}
	return n
}

// foldQueued folds the events already queued, without waiting for more,
// until limit were taken since the aggregation was last published (0: no
// limit). The loop's limit is a queue's length, then it publishes
// (keepEvents): the state file's occurrences not in the aggregation are
// two queue's lengths at most (maxCarried).
func (r *Reporter) foldQueued(aggs map[aggKey]*aggregate, limit int) {
	for limit == 0 || r.taken < limit {
		select {
		case e := <-r.events:
			r.take(aggs, e)
		default:
			return
		}
	}
}

// take folds e, taken off the queue: the queue keeps it for the state
// file until the aggregation that holds it is published (keepEvents).
func (r *Reporter) take(aggs map[aggKey]*aggregate, e report.Event) {
	r.taken++
	r.fold(aggs, e)
}

// finalFlush makes one short attempt (finalWriteTimeout), on shutdown, to
// send what waits: the events still queued, Events not created yet, and
// counts not patched yet, without waiting for the count's flush period or
// a retry's backoff. What does not go out in that time waits in the state
// file (keepEvents, saved after the reporter stops) for the next run in
// this boot.
func (r *Reporter) finalFlush(aggs map[aggKey]*aggregate) {
	r.foldQueued(aggs, 0) // the reader is stopped: the queue ends
	ctx, cancel := context.WithTimeout(context.Background(), finalWriteTimeout)
	defer cancel()
	for _, a := range aggs {
		var err error
		switch {
		case a.refused:
			continue
		case a.name == "":
			err = r.createEvent(ctx, a)
		case a.count != a.sentCount:
			err = r.patchEventCount(ctx, a, time.Now())
		default:
			continue
		}
		if refused(err) {
			r.dropRefused(a, err) // as in flush: the others still go
			continue
		}
		if err != nil {
			r.o.Log.Warn("last write of events before shutdown failed; what was not sent is kept in the state file for the next start in this boot", "err", err)
			return
		}
	}
}

func (r *Reporter) fold(aggs map[aggKey]*aggregate, e report.Event) {
	// The wall clock's reading alone: an Event's timestamps are wall times,
	// and inWindow, like a step back of the clock, is about them. A time
	// from time.Now (the kernel log reader's) also carries a monotonic
	// reading, which a step of the wall clock does not move and by which
	// Sub and After compare two such times: an occurrence after the clock
	// was set back an hour folded into the Event from before and set its
	// lastTimestamp an hour before its firstTimestamp.
	e.Time = e.Time.Round(0)
	r.eventsChanged = true
	if r.eventsAnotherNode() {
		// Not this node's credentials: an Event would speak about
		// another node (NodeRestriction lets a node write Events about
		// any). Dropped, and said at start (adopt) and at each change of
		// the credentials (eventsAnotherNode); taken off the queue with the next
		// publish (eventsChanged).
		r.m.drop(DropAnotherNode, 1)
		return
	}
	k := aggKey{reason: e.Reason, message: e.Message}
	// A new Event of its own, past the limit, is combined: also for a
	// message whose Event from before its window ended is still there
	// (waiting to be written, or not flushed yet): it takes no occurrence
	// outside its window, so this one would start another Event.
	if a, ok := aggs[k]; (!ok || !inWindow(a, e.Time)) && similarEvents(aggs, e) >= maxSimilarEvents {
		k = aggKey{reason: e.Reason, combined: true}
		e.Message = report.CapMessage(combinedPrefix + e.Message)
	}
	if a, ok := aggs[k]; ok {
		if inWindow(a, e.Time) {
			a.count++
			if e.Time.After(a.last) {
				a.last = e.Time
			}
			if a.combined {
				a.message = e.Message
			}
			if a.refused {
				a.sentCount = a.count
				r.m.drop(DropRefused, 1)
				return
			}
			// Its count patch, too, waits out the wait after a failed
			// write (eventsHold), also for an Event all sent before it.
			if a.nextTry.Before(r.eventsHold) {
				a.nextTry = r.eventsHold
			}
			r.m.coalesced.Inc()
			return
		}
		if !a.refused && (a.name == "" || a.count != a.sentCount) {
			// Its window is over but not all of it is on the API server
			// (an outage longer than the window): keep it under a key of
			// its own until it is, so the next occurrence starts a new
			// Event without losing this one's count.
			r.retired++
			delete(aggs, k)
			aggs[aggKey{reason: e.Reason, message: k.message, retired: r.retired, combined: k.combined}] = a
		}
	}
	if len(aggs) >= maxAggregates {
		// Make room: forget the oldest fully sent aggregate.
		var oldest *aggKey
		for kk, a := range aggs {
			if a.name != "" && a.count == a.sentCount && (oldest == nil || a.last.Before(aggs[*oldest].last)) {
				oldest = &kk
			}
		}
		if oldest == nil {
			r.m.drop(DropTableFull, 1)
			return
		}
		delete(aggs, *oldest)
	}
	// A new Event waits out the wait after a failed write, as the Events
	// that failed do (eventsHold): sent at once, it went into a 429 that
	// asked for a minute's rest, one create for each new message.
	aggs[k] = &aggregate{reason: e.Reason, message: e.Message, first: e.Time, last: e.Time, count: 1, combined: k.combined, nextTry: r.eventsHold}
}

// inWindow reports whether an occurrence at t folds into a: within
// EventDedupeWindow from its first, and not more than clockStepBack before
// its last. An occurrence dated well before the last one (the wall clock
// was set back) starts a new Event: folded, it kept folding for as long as
// the step, past the window, and could set lastTimestamp before
// firstTimestamp. A smaller difference (a kernel record's wall time moves
// by the clock's slew when the reader reads the boot's wall time again) is
// folded, lastTimestamp not moving back (fold).
func inWindow(a *aggregate, t time.Time) bool {
	return a.last.Sub(t) <= clockStepBack && t.Sub(a.first) < EventDedupeWindow
}

// clockStepBack is how far before an Event's last occurrence a new one may
// be dated and still be the same Event.
const clockStepBack = time.Second

// similarEvents counts the Events of e's reason with messages of their own
// (not combined, not retired) whose window holds e.
func similarEvents(aggs map[aggKey]*aggregate, e report.Event) int {
	n := 0
	for k, a := range aggs {
		if k.reason == e.Reason && !k.combined && k.retired == 0 && inWindow(a, e.Time) {
			n++
		}
	}
	return n
}

// eventsIdleBeat is how long the event writer sleeps when no write is due:
// it then drops the aggregates past the dedupe window and beats its
// liveness.
const eventsIdleBeat = time.Minute

// nextFlush is how long until a write of aggs is due: a new Event (at its
// next try), or a count that changed (eventCountFlush after the last patch,
// and not before the next try); eventsIdleBeat at most.
func nextFlush(aggs map[aggKey]*aggregate, now time.Time, countFlush time.Duration) time.Duration {
	wait := eventsIdleBeat
	for _, a := range aggs {
		var due time.Time
		switch {
		case a.refused:
			continue
		case a.name == "":
			due = a.nextTry
		case a.count != a.sentCount:
			due = a.lastPatch.Add(countFlush)
			if a.nextTry.After(due) {
				due = a.nextTry
			}
		default:
			continue
		}
		wait = min(wait, max(0, due.Sub(now)))
	}
	return wait
}

// flush creates new Events and patches counts that are due; it stops at the
// first error (the API is likely down) and returns it. answered says whether
// the API server answered a call: written, or refused for what it is
// (dropRefused).
// eventsLoop is the event writer's name in the daemon's liveness.
const eventsLoop = "kube/events"

func (r *Reporter) flush(ctx context.Context, aggs map[aggKey]*aggregate, now time.Time) (answered bool, err error) {
	for k, a := range aggs {
		if now.Before(a.nextTry) {
			continue
		}
		// Each write is progress: a burst of distinct events is many writes
		// under the client's rate limit, and the loop is not stuck while
		// it makes them.
		r.progress(eventsLoop, time.Second)
		switch {
		case a.refused:
			if now.Sub(a.first) >= EventDedupeWindow || k.retired != 0 {
				delete(aggs, k) // the next occurrence is tried anew
				r.eventsTrimmed = true
			}
		case a.name == "":
			if err := r.createEvent(ctx, a); refused(err) {
				r.dropRefused(a, err)
				answered = true
				continue
			} else if err != nil {
				return answered, err
			}
			answered = true
		case a.count != a.sentCount && now.Sub(a.lastPatch) >= r.o.EventCountFlush:
			if err := r.patchEventCount(ctx, a, now); refused(err) {
				r.dropRefused(a, err)
				answered = true
				continue
			} else if err != nil {
				return answered, err
			}
			answered = true
		case a.count == a.sentCount && (now.Sub(a.first) >= EventDedupeWindow || k.retired != 0):
			delete(aggs, k) // done: the next occurrence starts a new Event
			r.eventsTrimmed = true
		case k.retired != 0 && a.count != a.sentCount:
			// A retired aggregate's last count, without waiting for the
			// flush period: nothing raises it any more.
			if err := r.patchEventCount(ctx, a, now); refused(err) {
				r.dropRefused(a, err)
				answered = true
				continue
			} else if err != nil {
				return answered, err
			}
			answered = true
		}
	}
	return answered, nil
}

// eventType is Warning for a problem (the spec's temp rules) and Normal
// for an operator's action (the catalog's Operator events: TamperCleared),
// which is no problem and must not show among the node's warnings.
func eventType(reason string) string {
	if d, ok := report.LookupEvent(reason); ok && d.Operator {
		return kubeapi.EventTypeNormal
	}
	return kubeapi.EventTypeWarning
}

func (r *Reporter) createEvent(ctx context.Context, a *aggregate) error {
	retry := a.createName != ""
	if !retry {
		// kubelet's naming (<node>.<hex nanoseconds>) plus a sequence
		// number, so two events in the same nanosecond do not collide,
		// unique in the boot (eventSeqStart): an earlier run's Event of
		// the same first time (a kernel line read again after a crash)
		// has another name.
		r.eventSeq++
		a.createName = eventName(r.o.NodeName, a.first, r.eventSeq)
		r.eventsChanged = true
	}
	name := a.createName
	ev := &kubeapi.Event{
		APIVersion: "v1", Kind: "Event",
		// kubelet's convention for events about a Node: UID = node name.
		InvolvedObject:      kubeapi.ObjectReference{Kind: "Node", Name: r.o.NodeName, UID: r.o.NodeName, APIVersion: "v1"},
		Reason:              a.reason,
		Message:             a.message,
		Type:                eventType(a.reason),
		FirstTimestamp:      metav1.NewTime(a.first),
		LastTimestamp:       metav1.NewTime(a.last),
		Count:               a.count,
		ReportingController: Component,
		ReportingInstance:   r.o.NodeName,
	}
	ev.Metadata.Name, ev.Metadata.Namespace = name, EventNamespace
	ev.Source.Component, ev.Source.Host = Component, r.o.NodeName
	start := time.Now()
	err := r.o.Client.CreateEvent(ctx, ev)
	if retry && apierrors.IsAlreadyExists(err) {
		// An earlier try was saved though its answer was lost (a timeout,
		// a reset connection): it is this Event. Its count may be that of
		// the earlier try; the patch sends the whole count.
		r.m.observe(KindEvent, start, nil)
		a.name, a.sentCount = name, -1
		r.eventsNamed = true
		return r.patchEventCount(ctx, a, time.Now())
	}
	r.m.observe(KindEvent, start, err)
	if apierrors.IsAlreadyExists(err) {
		// Another Event has this name: the retry takes a new one.
		a.createName = ""
		r.eventsChanged = true
	}
	if err != nil {
		return err
	}
	r.changeWrote()
	a.name, a.sentCount, a.lastPatch = name, ev.Count, time.Now()
	a.restored = false // its count on the API server is the one sent
	// Its name goes to the state file soon (Touch): lost in a crash, the
	// next run would make a second Event of it.
	r.eventsNamed = true
	return nil
}

// eventSeqStart is where the sequence numbers of a run's Event names start:
// the time since boot in µs (CLOCK_MONOTONIC, which a restart of the daemon
// does not reset and nothing sets back). An earlier run of this boot
// numbered up from its own start, one for each name, and takes far fewer
// than one a µs (each is an API call, under its client's rate limit of 5
// a second), so its numbers stay below this run's: a name is never one an
// earlier run gave an Event, also one whose Event the earlier run did not
// live to keep (a kernel line read again after a crash keeps its time, the
// name's other part).
func eventSeqStart() uint64 { return rawsys.MonotonicMicros() }

// maxEventName is the longest object name the API server takes (a DNS
// subdomain).
const maxEventName = 253

// eventName is <node>.<hex nanoseconds>.<seq>, the node's name shortened
// (and its cut end trimmed of '.' and '-') where a long one would make the
// name longer than the API server takes: every Event of such a node would
// be refused.
func eventName(node string, first time.Time, seq uint64) string {
	suffix := fmt.Sprintf(".%x.%d", first.UnixNano(), seq)
	if len(node)+len(suffix) > maxEventName {
		node = strings.TrimRight(node[:maxEventName-len(suffix)], ".-")
	}
	return node + suffix
}

// refused says whether the API server refused a write for what it is (an
// invalid object, 422; one too large, 413): sending it again gets the same
// answer. A 400 is not taken as such: a proxy in front of the API server
// may answer one for a request that would go through later.
func refused(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// dropRefused gives up on an aggregate whose write the API server refused
// for what it is, so that it neither is retried forever nor holds the other
// Events back behind the retry's backoff: its occurrences not sent are
// counted in events_dropped, as are its repeats until its window ends (it
// stays to fold them), and the refusal is logged once per change of it.
func (r *Reporter) dropRefused(a *aggregate, err error) {
	r.m.drop(DropRefused, float64(a.count-a.sentCount))
	a.refused, a.sentCount = true, a.count
	r.eventsChanged = true
	if key := errKey(err); key != r.refusedKey {
		r.refusedKey = key
		r.o.Log.Error("event refused by the API server; dropped (logged again only for another refusal)",
			"reason", a.reason, "count", a.count, "err", err.Error())
	}
}

func (r *Reporter) patchEventCount(ctx context.Context, a *aggregate, now time.Time) error {
	if a.restored {
		if gone, err := r.readEvent(ctx, a); err != nil {
			return err
		} else if gone {
			// Expired or deleted since: created anew, under a new
			// name, with the count.
			a.name, a.createName = "", ""
			return r.createEvent(ctx, a)
		}
		if a.count == a.sentCount {
			return nil // the API server has it all
		}
	}
	fields := map[string]any{"count": a.count, "lastTimestamp": metav1.NewTime(a.last)}
	if a.combined {
		fields["message"] = a.message // the latest of the similar events
	}
	patch, _ := json.Marshal(fields)
	start := time.Now()
	_, err := r.o.Client.PatchEvent(ctx, EventNamespace, a.name, patch)
	if apierrors.IsNotFound(err) {
		// The Event expired (the API server's event TTL, 1 h by default):
		// not a failed write (it would count towards the alert on failing
		// writes); it is created anew, under a new name, with the count.
		r.m.latency.WithLabelValues(KindEventCount).Observe(time.Since(start).Seconds())
		a.name, a.createName = "", ""
		return r.createEvent(ctx, a)
	}
	r.m.observe(KindEventCount, start, err)
	if err != nil {
		return err
	}
	r.changeWrote()
	a.sentCount, a.lastPatch = a.count, now
	r.eventsChanged = true
	return nil
}
