package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/report"
)

// events lists the Events in EventNamespace.
func events(t *testing.T, client *fake.Clientset) []corev1.Event {
	t.Helper()
	evs, err := client.CoreV1().Events(EventNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return evs.Items
}

// A create the API server saved but whose answer was lost (a timeout, a
// reset connection) is retried under the same name: the AlreadyExists it
// gets is the Event, whose count is then patched. Before, the retry took a
// new name and made a second Event.
func TestLostCreateAnswerMakesNoSecondEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		lost := 1
		client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if lost == 0 {
				return false, nil, nil
			}
			lost--
			ca := a.(k8stesting.CreateAction)
			if err := client.Tracker().Create(corev1.SchemeGroupVersion.WithResource("events"), ca.GetObject(), ca.GetNamespace()); err != nil {
				t.Error(err)
			}
			return true, nil, errors.New(`Post "https://api:6443/api/v1/namespaces/default/events": context deadline exceeded`)
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		const msg = "Buffer I/O error on dev sda1, logical block 0"
		store.Emit(report.Event{Reason: "IOError", Message: msg, Time: time.Now()})
		synctest.Wait() // the first create, saved, its answer lost
		// More occurrences before the retry (1 s later).
		for range 4 {
			store.Emit(report.Event{Reason: "IOError", Message: msg, Time: time.Now()})
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		evs := events(t, client)
		if len(evs) != 1 || evs[0].Count != 5 {
			for _, e := range evs {
				t.Logf("Event %s count %d", e.Name, e.Count)
			}
			t.Errorf("5 occurrences, one create answer lost: %d Events; want 1 with count 5", len(evs))
		}
		if v := h.m.Failures(); v != 1 {
			t.Errorf("%v failed API calls counted, want 1 (the lost answer)", v)
		}
		h.stop()
	})
}

// SIGTERM 3 s into a flood of identical events: the count that waits for
// its 10 s patch is written before the reporter stops (finalFlush), as are
// events still queued. Before, the Event kept the count of its create (1).
func TestShutdownFlushesPendingEventCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		for range 100 {
			store.Emit(report.Event{Reason: "IOError", Message: "same", Time: time.Now()})
			time.Sleep(30 * time.Millisecond)
		}
		store.Emit(report.Event{Reason: "TaskHung", Message: "queued as SIGTERM comes", Time: time.Now()})
		h.stop()
		got := map[string]int32{}
		for _, e := range events(t, client) {
			got[e.Reason] += e.Count
		}
		if got["IOError"] != 100 || got["TaskHung"] != 1 || len(got) != 2 {
			t.Errorf("after SIGTERM: counts %v, want IOError 100 and TaskHung 1", got)
		}
	})
}

// A count patch that finds its Event gone (expired: the API server's event
// TTL) creates it anew, under a new name, with the count, and is not a
// failed write: counted as one (not_found), it could fire
// AutopilotHealthAPIWritesFailing{kind="event_count"} for nothing.
func TestExpiredEventIsCreatedAnewNotCountedAsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		store.Emit(report.Event{Reason: "IOError", Message: "same", Time: time.Now()})
		time.Sleep(time.Second)
		synctest.Wait()
		evs := events(t, client)
		if len(evs) != 1 {
			t.Fatalf("%d Events after the first occurrence", len(evs))
		}
		first := evs[0].Name
		if err := client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("events"), EventNamespace, first); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			store.Emit(report.Event{Reason: "IOError", Message: "same", Time: time.Now()})
		}
		time.Sleep(30 * time.Second) // past the count's flush period
		synctest.Wait()
		evs = events(t, client)
		if len(evs) != 1 || evs[0].Name == first || evs[0].Count != 4 {
			t.Errorf("after the Event expired: %d Events (%v); want one under a new name with count 4", len(evs), evs)
		}
		if v := h.m.Failures(); v != 0 {
			t.Errorf("%v failed API calls counted, want 0: an expired Event is not a failure", v)
		}
		h.stop()
	})
}

// An Event the API server refuses for what it is (422 Invalid, 413) is
// given up, counted in events_dropped and logged once per change of
// refusal: it is not retried forever, and the other Events are not held
// back behind its retry's backoff. Before, every Event waited for the
// refused one's backoff, which never ended.
func TestRefusedEventIsDroppedNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		tries := refuseCreates(client, "TaskHung", func(n int, ev *corev1.Event) error {
			if n == 3 {
				return apierrors.NewRequestEntityTooLargeError("limit is 3145728")
			}
			return tooLong(ev)
		})
		store := report.NewStore("b")
		var logs bytes.Buffer
		h := startLogged(t, client, store, report.NewDetails(), &logs)
		for i := range 3 {
			store.Emit(report.Event{Reason: "TaskHung", Message: fmt.Sprintf("INFO: task kubelet:%d blocked for more than 120 seconds.", i), Time: time.Now()})
			synctest.Wait()
		}
		store.Emit(report.Event{Reason: "IOError", Message: "Buffer I/O error on dev sda1, logical block 0", Time: time.Now()})
		synctest.Wait()
		if evs := events(t, client); len(evs) != 1 || evs[0].Reason != "IOError" {
			t.Errorf("the Event after three refused ones: %d Events; want the IOError at once", len(evs))
		}
		time.Sleep(9 * time.Minute)
		synctest.Wait()
		if n := tries(); n != 3 {
			t.Errorf("%d creates of the 3 refused Events in 9 minutes, want 3 (none retried)", n)
		}
		if v := h.m.Dropped(DropRefused); v != 3 {
			t.Errorf("events_dropped_total %v, want 3", v)
		}
		h.stop()
		// 422, 422 (alike: not logged again), 413.
		if n := strings.Count(logs.String(), "event refused by the API server"); n != 2 {
			t.Errorf("%d log lines for refusals 422, 422, 413; want 2:\n%s", n, logs.String())
		}
	})
}

// A refused Event's repeats fold into it until its 10-minute window ends,
// each counted as dropped: a kernel line that repeats is not sent (and
// refused) again at each occurrence, spending the client's rate limit that
// the condition writes share. After the window, it is tried once more. A
// 400 is not taken for a refusal of the Event itself (a proxy may answer
// one).
func TestRefusedEventRepeatsAreNotSentAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		tries := refuseCreates(client, "", func(_ int, ev *corev1.Event) error { return tooLong(ev) })
		store := report.NewStore("b")
		var logs bytes.Buffer
		h := startLogged(t, client, store, report.NewDetails(), &logs)
		const msg = "INFO: task kubelet:1 blocked for more than 120 seconds."
		for range 600 { // 10 a second for a minute
			store.Emit(report.Event{Reason: "TaskHung", Message: msg, Time: time.Now()})
			time.Sleep(100 * time.Millisecond)
		}
		synctest.Wait()
		if n := tries(); n != 1 {
			t.Errorf("%d creates for 600 repeats of one refused Event in a minute, want 1", n)
		}
		if v := h.m.Dropped(DropRefused); v != 600 {
			t.Errorf("events_dropped_total %v, want 600", v)
		}
		time.Sleep(10 * time.Minute)
		store.Emit(report.Event{Reason: "TaskHung", Message: msg, Time: time.Now()})
		synctest.Wait()
		if n := tries(); n != 2 {
			t.Errorf("%d creates after the window, want 2 (tried once more)", n)
		}
		h.stop()
		if n := strings.Count(logs.String(), "event refused by the API server"); n != 1 {
			t.Errorf("%d log lines for one refusal repeated, want 1:\n%s", n, logs.String())
		}
		if refused(apierrors.NewBadRequest("bad")) {
			t.Error("a 400 is taken for a refusal of the Event itself")
		}
	})
}

// A node name long enough to make <node>.<hex>.<seq> longer than the API
// server takes is shortened in the Event's name, never past a '.' or '-'
// at the cut.
func TestEventNameFitsTheAPIServer(t *testing.T) {
	at := time.Unix(1700000000, 123)
	if got := eventName("node-1", at, 7); got != "node-1.17979cfe362a007b.7" {
		t.Errorf("short name: %s", got)
	}
	// The suffix ".17979cfe362a007b.12345" is 23 bytes: the cut at 230
	// falls just after the '-'.
	long := strings.Repeat("a", 229) + "-" + strings.Repeat("b", 40)
	got := eventName(long, at, 12345)
	if len(got) > maxEventName || got != strings.Repeat("a", 229)+".17979cfe362a007b.12345" {
		t.Errorf("long name (%d): %s", len(got), got)
	}
	if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
		t.Errorf("%s: %v", got, errs)
	}
}

// Refusals alike (the same code and reason) are one log line.
func TestRefusedEventsAlikeLogOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		refuseCreates(client, "", func(_ int, ev *corev1.Event) error { return tooLong(ev) })
		store := report.NewStore("b")
		var logs bytes.Buffer
		h := startLogged(t, client, store, report.NewDetails(), &logs)
		for i := range 5 {
			store.Emit(report.Event{Reason: "TaskHung", Message: fmt.Sprintf("INFO: task kubelet:%d blocked for more than 120 seconds.", i), Time: time.Now()})
			synctest.Wait()
		}
		h.stop()
		if v := h.m.Dropped(DropRefused); v != 5 {
			t.Errorf("events_dropped_total %v, want 5", v)
		}
		if n := strings.Count(logs.String(), "event refused by the API server"); n != 1 {
			t.Errorf("%d log lines for 5 refusals alike, want 1:\n%s", n, logs.String())
		}
	})
}

// refuseCreates makes the fake API server refuse the creates of Events of
// reason (of every reason when ""), the nth with refusal(n, the Event); it
// returns how many it refused so far.
func refuseCreates(client *fake.Clientset, reason string, refusal func(n int, ev *corev1.Event) error) func() int {
	var mu sync.Mutex
	n := 0
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ev := a.(k8stesting.CreateAction).GetObject().(*corev1.Event)
		if reason != "" && ev.Reason != reason {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		return true, nil, refusal(n, ev)
	})
	return func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// tooLong is the API server's 422 for an Event whose message is too long.
func tooLong(ev *corev1.Event) error {
	return apierrors.NewInvalid(schema.GroupKind{Kind: "Event"}, ev.Name, field.ErrorList{field.TooLong(field.NewPath("message"), "", 1024)})
}

// A refused Event among those SIGTERM's last attempt sends does not end the
// attempt: the others still go, and it is counted as dropped. The API
// server is down (500) while the events come, so all of them wait for the
// last attempt, by which it is back.
func TestShutdownSendsTheOthersPastARefusedEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down := true
		client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			ev := a.(k8stesting.CreateAction).GetObject().(*corev1.Event)
			switch {
			case down:
				return true, nil, apierrors.NewInternalError(errors.New("etcd is down"))
			case ev.Reason == "TaskHung":
				return true, nil, tooLong(ev)
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:1 blocked for more than 120 seconds.", Time: time.Now()})
		for i := range 20 {
			store.Emit(report.Event{Reason: "IOError", Message: fmt.Sprintf("Buffer I/O error on dev sda1, logical block %d", i), Time: time.Now()})
			synctest.Wait()
		}
		mu.Lock()
		down = false
		mu.Unlock()
		h.stop()
		// 10 Events of their own, the other 10 messages in one combined
		// Event (maxSimilarEvents).
		evs := events(t, client)
		var total int32
		for _, e := range evs {
			total += e.Count
		}
		if len(evs) != 11 || total != 20 {
			t.Errorf("%d Events with a count of %d sent on SIGTERM past a refused one, want 11 with 20", len(evs), total)
		}
		if v := h.m.Dropped(DropRefused); v != 1 {
			t.Errorf("events_dropped_total %v, want 1", v)
		}
	})
}

// A reason's events with distinct messages (a dying disk's "I/O error,
// dev sda, sector N", a new sector each time) make at most
// maxSimilarEvents Events of their own in a dedupe window; the rest fold
// into one Event of the reason, "(combined from similar events): " and the
// latest message, whose count says how many. Another reason is not held
// back by it. Two lines a second for an hour were 7,200 Events; now 11 a
// window.
func TestSimilarEventsAreCombined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		msg := func(i int) string {
			return fmt.Sprintf("I/O error, dev sda, sector %d op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2", 1000+8*i)
		}
		for i := range 30 {
			store.Emit(report.Event{Reason: "BlockIOError", Message: msg(i), Time: time.Now()})
			time.Sleep(500 * time.Millisecond)
			synctest.Wait()
		}
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:1 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		var own, combined []corev1.Event
		for _, e := range events(t, client) {
			switch {
			case e.Reason == "BlockIOError" && strings.HasPrefix(e.Message, combinedPrefix):
				combined = append(combined, e)
			case e.Reason == "BlockIOError":
				own = append(own, e)
			}
		}
		if len(own) != maxSimilarEvents || len(combined) != 1 {
			t.Fatalf("%d Events of their own and %d combined, want %d and 1", len(own), len(combined), maxSimilarEvents)
		}
		if c := combined[0]; c.Count != 20 || c.Message != combinedPrefix+msg(29) {
			t.Errorf("combined Event: count %d, message %q; want 20 and the latest message", c.Count, c.Message)
		}
		if len(events(t, client)) != maxSimilarEvents+2 {
			t.Errorf("TaskHung not sent beside them: %d Events", len(events(t, client)))
		}

		// Two lines a second for an hour: 11 Events a window, not 7,200.
		for range 2 * 3600 {
			store.Emit(report.Event{Reason: "BlockIOError", Message: msg(rand.IntN(1 << 20)), Time: time.Now()})
			time.Sleep(500 * time.Millisecond)
		}
		synctest.Wait()
		h.stop()
		n := 0
		for _, e := range events(t, client) {
			if e.Reason == "BlockIOError" {
				n++
			}
		}
		if n > 8*(maxSimilarEvents+1) {
			t.Errorf("%d BlockIOError Events for an hour of distinct lines, want at most %d", n, 8*(maxSimilarEvents+1))
		}
		t.Logf("%d BlockIOError Events for 2 distinct lines a second over 1 h", n)
	})
}

// The limit holds when the messages come back after their window while their
// Events still wait to be written (an API outage longer than the window):
// the Event of a message still waiting kept its key, and its next
// occurrence started an Event of its own without counting the others, so
// 10 distinct messages, then 10 others, then the first 10 again made 20
// Events of their own in the new window.
func TestSimilarEventsLimitHoldsForMessagesStillWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down := true
		client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return true, nil, errors.New(`Post "https://api:6443/api/v1/namespaces/default/events": connection refused`)
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		msg := func(i int) string {
			return fmt.Sprintf("I/O error, dev sda, sector %d op 0x0:(READ) flags 0x0 phys_seg 1 prio class 2", 1000+8*i)
		}
		emit := func(from, to int) {
			for i := from; i < to; i++ {
				store.Emit(report.Event{Reason: "BlockIOError", Message: msg(i), Time: time.Now()})
				time.Sleep(100 * time.Millisecond)
				synctest.Wait()
			}
		}
		emit(0, maxSimilarEvents)
		time.Sleep(EventDedupeWindow + time.Second)
		second := time.Now()
		emit(maxSimilarEvents, 2*maxSimilarEvents)
		emit(0, maxSimilarEvents) // back after their window, still not written
		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		h.stop()
		var own, combined, first int
		for _, e := range events(t, client) {
			switch {
			case e.Reason != "BlockIOError":
			case e.FirstTimestamp.Time.Before(second):
				first++
			case strings.HasPrefix(e.Message, combinedPrefix):
				combined++
			default:
				own++
			}
		}
		if first != maxSimilarEvents {
			t.Errorf("%d Events of the first window, want %d", first, maxSimilarEvents)
		}
		if own != maxSimilarEvents || combined != 1 {
			t.Errorf("second window: %d Events of their own and %d combined, want %d and 1", own, combined, maxSimilarEvents)
		}
	})
}

// wallStepped is what time.Now returns after the wall clock was stepped by d
// (whole seconds): its wall clock reading moved, its monotonic one not.
// time.Time is {wall uint64; ext int64; loc}; with a monotonic reading,
// wall's bits 30 to 62 are the seconds since 1885 and ext is the monotonic
// reading. The test checks that this holds.
func wallStepped(t time.Time, d time.Duration) time.Time {
	w := (*struct {
		wall uint64
		ext  int64
		loc  *time.Location
	})(unsafe.Pointer(&t))
	w.wall += uint64(int64(d/time.Second) << 30)
	return t
}

// In the daemon an event's time comes from time.Now (the kernel log
// reader's wall time of the boot plus the record's kernel time), which
// carries a monotonic clock reading besides the wall clock's; a step of the
// wall clock does not move the monotonic one, and Sub, Before and After
// compare by it where both times have one. Under synctest time.Now has
// none, so TestEventAfterTheClockWasSetBack did not see it: in the daemon
// an occurrence after the clock was set back an hour folded into the Event
// from before and moved its lastTimestamp an hour before its
// firstTimestamp.
func TestEventTimesAreComparedByTheWallClock(t *testing.T) {
	t0 := time.Now()
	back := wallStepped(t0.Add(5*time.Second), -time.Hour)
	if back.Sub(t0) != 5*time.Second || back.Round(0).Sub(t0.Round(0)) != 5*time.Second-time.Hour {
		t.Fatalf("wallStepped: monotonic difference %s, wall difference %s; time.Time's layout changed?", back.Sub(t0), back.Round(0).Sub(t0.Round(0)))
	}
	r := &Reporter{m: NewMetrics(nil)}
	aggs := map[aggKey]*aggregate{}
	const msg = "EXT4-fs warning (device sdz1): same text"
	r.fold(aggs, report.Event{Reason: "Ext4Warning", Message: msg, Time: t0})
	r.fold(aggs, report.Event{Reason: "Ext4Warning", Message: msg, Time: back})
	for _, a := range aggs {
		if a.last.UnixNano() < a.first.UnixNano() {
			t.Errorf("lastTimestamp %s before firstTimestamp %s", a.last.Round(0), a.first.Round(0))
		}
	}
	if len(aggs) != 2 {
		t.Errorf("%d Events, want 2 (the occurrence after the clock was set back a new one)", len(aggs))
	}
}

// An occurrence dated an hour before the last one (the wall clock was set
// back) is a new Event: folded, it kept folding for an hour past the
// window and set lastTimestamp before firstTimestamp. One dated a fraction
// of a second earlier (a kernel record's wall time after a slew) folds,
// lastTimestamp not moving back.
func TestEventAfterTheClockWasSetBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		const msg = "EXT4-fs warning (device sdz1): same text"
		t0 := time.Now()
		store.Emit(report.Event{Reason: "Ext4Warning", Message: msg, Time: t0})
		store.Emit(report.Event{Reason: "Ext4Warning", Message: msg, Time: t0.Add(-300 * time.Millisecond)})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		store.Emit(report.Event{Reason: "Ext4Warning", Message: msg, Time: t0.Add(-time.Hour)})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.stop()
		evs := events(t, client)
		if len(evs) != 2 {
			t.Fatalf("%d Events, want 2 (the occurrence an hour back a new one)", len(evs))
		}
		for _, e := range evs {
			if e.LastTimestamp.Before(&e.FirstTimestamp) {
				t.Errorf("Event %s: lastTimestamp %s before firstTimestamp %s", e.Name, e.LastTimestamp, e.FirstTimestamp)
			}
			if e.FirstTimestamp.Time.Equal(t0) && e.Count != 2 {
				t.Errorf("the slewed occurrence did not fold: count %d", e.Count)
			}
		}
	})
}

// An Event whose create failed without an answer (the API server's port
// refusing it) and that the API server, once back, refuses for what it is
// (422) ends the event writer's failure: the probe that dials the API
// server every second while a write gets no answer goes back to sleep.
// Before, only a write that went through ended it, and with no other
// Event to write the probe dialled the API server every second for as
// long as the daemon ran, every call answered.
func TestRefusedEventAfterAnOutageStopsTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down, dials := true, 0
		client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return true, nil, &url.Error{Op: "Post", URL: "https://10.0.0.1:6443/api/v1/namespaces/default/events",
					Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
			}
			return true, nil, tooLong(a.(k8stesting.CreateAction).GetObject().(*corev1.Event))
		})
		store := report.NewStore("b")
		h := startOpts(t, client, store, report.NewDetails(), io.Discard, func(o *Options) {
			o.Dial = func(context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				dials++
				if down {
					return errors.New("connection refused")
				}
				return nil
			}
		})
		<-h.r.Adopted()
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(30 * time.Second)
		synctest.Wait()
		mu.Lock()
		if dials == 0 {
			t.Error("no dial while the Event's create got no answer: want the probe dialling")
		}
		down = false
		mu.Unlock()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if v := h.m.Dropped(DropRefused); v != 1 {
			t.Errorf("events_dropped_total %v after the API server's return refused the Event, want 1", v)
		}
		mu.Lock()
		d := dials
		mu.Unlock()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		mu.Lock()
		if more := dials - d; more != 0 {
			t.Errorf("%d dials in the 10 minutes after the API server answered the Event's create (refused): want the probe asleep", more)
		}
		mu.Unlock()
		h.stop()
	})
}

// What status shows as the events pending (Reporting.EventsQueued) counts
// the occurrences not on the API server yet, also those the event writer
// has taken from the queue into its Events (not created yet, counts not
// patched yet), as during an outage of the events API. Before, it counted
// the queue alone, which the writer empties into its Events at once:
// "pending: none" all outage long, while the occurrences that a SIGTERM
// before the API server's return loses were waiting.
func TestStatusCountsTheEventsWaitingForTheAPIServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down := true
		client.PrependReactor("*", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		<-h.r.Adopted()
		for i := range 3 {
			store.Emit(report.Event{Reason: "TaskHung", Message: fmt.Sprintf("INFO: task kubelet:%d blocked for more than 120 seconds.", i), Time: time.Now()})
		}
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:0 blocked for more than 120 seconds.", Time: time.Now()})
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:0 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := h.m.Reporting().EventsQueued; n != 5 {
			t.Errorf("5 occurrences while the events API fails: %d pending, want 5", n)
		}
		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if evs := events(t, client); len(evs) != 3 {
			t.Errorf("%d Events after the events API's return, want 3", len(evs))
		}
		if n := h.m.Reporting().EventsQueued; n != 0 {
			t.Errorf("%d events pending once all are on the API server, want 0", n)
		}
		h.stop()
	})
}

// A new Event (another reason or message) that comes while the event writer
// waits out a failed write is not sent before that wait ends: the API
// server answered 429 with a Retry-After (its priority and fairness), and
// every Event the writer holds waits at least what it asked. Before, each
// new Event's create went out at once, however long the answer asked to
// wait: a dying disk's "I/O error, ..., sector N", another sector each
// time, was a create every few seconds (up to 11 a window of one reason)
// into a 429 storm that asked for a minute's rest.
func TestNewEventsWaitOutTheRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		var tries []time.Time
		down := true
		client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			tries = append(tries, time.Now())
			if down {
				return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		defer h.stop()
		<-h.r.Adopted()
		first := time.Now()
		for i := range 12 {
			store.Emit(report.Event{Reason: "IOError", Message: fmt.Sprintf("I/O error, dev sda, sector %d", 1000+i), Time: time.Now()})
			time.Sleep(4 * time.Second)
		}
		synctest.Wait()
		mu.Lock()
		var early int
		for _, at := range tries {
			if at.Sub(first) < 60*time.Second {
				early++
			}
		}
		down = false
		mu.Unlock()
		if early != 1 {
			t.Errorf("%d Event creates within the minute the 429's Retry-After asked to wait, want 1 (the first)", early)
		}
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		var count int32
		for _, ev := range events(t, client) {
			count += ev.Count
		}
		if count != 12 {
			t.Errorf("after the API server's return the Events count %d occurrences, want 12", count)
		}
	})
}

// SIGTERM while the API server cannot take the Events: the last attempt
// fails, and what it did not send is kept for the next start in this boot
// (the state file's Events), as the journal then says. It said "what was
// not sent is lost", and an operator took the occurrences for gone.
func TestShutdownInAnOutageSaysWhatWaitsIsKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewServiceUnavailable("kube-apiserver is down")
		})
		store := report.NewStore("b")
		var logs bytes.Buffer
		h := startLogged(t, client, store, report.NewDetails(), &logs)
		<-h.r.Adopted()
		for range 3 {
			store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
			time.Sleep(time.Second)
		}
		synctest.Wait()
		h.stop()
		kept, _, _ := h.r.o.Events.restored()
		if len(kept.Events) != 1 || kept.Events[0].Count != 3 || kept.Events[0].Name != "" {
			t.Fatalf("kept for the next start after SIGTERM in the outage: %+v, want the Event not created, count 3", kept.Events)
		}
		out := logs.String()
		if strings.Contains(out, "lost") || !strings.Contains(out, "kept in the state file") {
			t.Errorf("the journal at SIGTERM says of the Events not sent:\n%s\nwant that they are kept in the state file for the next start", out)
		}
	})
}

// A new occurrence of an Event already on the API server that comes while
// the event writer waits out a failed write (a 429's Retry-After) waits
// too: its count patch went out at the next count flush, into the 429
// that had asked for a minute.
func TestCountPatchesWaitOutTheRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		var down time.Time
		var early []string
		client.PrependReactor("*", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down.IsZero() {
				return false, nil, nil
			}
			if time.Since(down) < 60*time.Second {
				early = append(early, a.GetVerb())
			}
			return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		defer h.stop()
		<-h.r.Adopted()
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(events(t, client)); n != 1 {
			t.Fatalf("%d Events before the 429s, want 1", n)
		}
		mu.Lock()
		down = time.Now()
		mu.Unlock()
		store.Emit(report.Event{Reason: "IOError", Message: "I/O error, dev sda, sector 1000", Time: time.Now()})
		time.Sleep(5 * time.Second)
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		if len(early) != 1 {
			t.Errorf("Event writes within the minute the 429's Retry-After asked to wait: %v, want the one create it answered", early)
		}
		down = time.Time{}
		mu.Unlock()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		got := map[string]int32{}
		for _, e := range events(t, client) {
			got[e.Reason] += e.Count
		}
		if got["TaskHung"] != 2 || got["IOError"] != 1 {
			t.Errorf("after the 429s: counts %v, want TaskHung 2 and IOError 1", got)
		}
	})
}

// A 429 on the Events (a Retry-After of a minute, eventsHold) holds the
// Events alone: a condition's change that comes while the event writer
// waits it out, and the change after, are each on the Node within a
// second, the status writer's backoff untouched by the event writer's.
func TestEventsRetryAfterDoesNotHoldTheConditions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		creates := 0
		client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			creates++
			return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		defer h.stop()
		<-h.r.Adopted()
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		synctest.Wait()
		for i, c := range []report.Condition{
			{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: "FilesystemSpaceHigh", Message: "a"},
			{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "DiskUsageOK", Message: "b"},
		} {
			time.Sleep(5 * time.Second)
			store.Set(c, time.Now())
			store.Emit(report.Event{Reason: "IOError", Message: fmt.Sprintf("I/O error, dev sda, sector %d", i), Time: time.Now()})
			time.Sleep(time.Second)
			synctest.Wait()
			if got := findCond(h.node(t), "DiskUsageHigh"); got == nil || string(got.Status) != string(c.Status) || got.Reason != string(c.Reason) {
				t.Errorf("a second after change %d, while the Events wait out a 429's minute: the Node has %+v, want %s/%s", i+1, got, c.Status, c.Reason)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if creates != 1 {
			t.Errorf("%d Event creates in the 429's minute, want 1", creates)
		}
	})
}

// An Event storm while the event writer waits out a 429's Retry-After:
// every reason of the catalog, 100 distinct messages each, none written
// for three minutes. Aggregated as without the wait: per reason 10 Events
// of their own and one combined (maxSimilarEvents), every occurrence
// counted on the API server after its return, none dropped, and the table
// no larger than that.
func TestEventStormWhileTheWriterWaitsIsAggregated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(kubeletNode())
		var mu sync.Mutex
		down := true
		client.PrependReactor("*", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return true, nil, apierrors.NewTooManyRequests("too many requests, please try again later", 60)
			}
			return false, nil, nil
		})
		store := report.NewStore("b")
		h := start(t, client, store)
		defer h.stop()
		<-h.r.Adopted()
		const messages = 100
		for i := range messages {
			for _, d := range report.Events {
				store.Emit(report.Event{Reason: d.Reason, Message: fmt.Sprintf("message %d", i), Time: time.Now()})
			}
			time.Sleep(time.Second)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		down = false
		mu.Unlock()
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		evs := events(t, client)
		per := map[string]int{}
		var total int32
		for _, e := range evs {
			total += e.Count
			per[e.Reason]++
		}
		for _, d := range report.Events {
			if per[d.Reason] != maxSimilarEvents+1 {
				t.Errorf("%s: %d Events, want %d of their own and one combined", d.Reason, per[d.Reason], maxSimilarEvents)
			}
		}
		if want := len(report.Events) * messages; int(total) != want || h.m.droppedTotal() != 0 {
			t.Errorf("after the storm: Events counting %d, %v dropped; want %d, none dropped", total, h.m.droppedTotal(), want)
		}
	})
}
