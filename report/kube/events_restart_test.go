package kube

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/report"
)

// restartStore is a daemon's restart within the boot: store saved to the
// state file as it stands, and a new store of the same boot loaded from it.
func restartStore(t *testing.T, store *report.Store) *report.Store {
	t.Helper()
	dir := t.TempDir()
	if err := store.Save(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	next := report.NewStore("b")
	if res, err := next.Load(dir); err != nil || res.Corrupt != nil {
		t.Fatalf("load: %v %v", err, res.Corrupt)
	}
	return next
}

// keptTaskHung is an earlier run of this boot on client that could not
// create its Events (503: the API server down) and kept them in the state
// file: a hung kubelet reported three times, one Event with count 3 not
// yet on the API server. It returns the next run's store (restartStore),
// and the API server takes Events again.
func keptTaskHung(t *testing.T, client *fake.Clientset) *report.Store {
	t.Helper()
	down := true
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down {
			return true, nil, apierrors.NewServiceUnavailable("kube-apiserver is down")
		}
		return false, nil, nil
	})
	store := report.NewStore("b")
	h := startOpts(t, client, store, report.NewDetails(), io.Discard, nil)
	<-h.r.Adopted()
	for range 3 {
		store.Emit(report.Event{Reason: "TaskHung", Message: "INFO: task kubelet:4242 blocked for more than 120 seconds.", Time: time.Now()})
		time.Sleep(time.Second)
	}
	synctest.Wait()
	h.stop()
	next := restartStore(t, store)
	down = false
	return next
}

// logEvents logs the Events on the fake API server.
func logEvents(t *testing.T, evs []corev1.Event) {
	t.Helper()
	for _, e := range evs {
		t.Logf("Event %s: %s %q count %d", e.Name, e.Reason, e.Message, e.Count)
	}
}

// eventDaemon is a node's daemon run after run within one boot, over one
// fake API server: the harness is the run now. In a synctest bubble.
type eventDaemon struct {
	t *testing.T
	*harness
}

// startEventDaemon starts the daemon's first run of the boot, with an
// empty store.
func startEventDaemon(t *testing.T) *eventDaemon {
	t.Helper()
	return &eventDaemon{t: t, harness: start(t, fake.NewClientset(kubeletNode()), report.NewStore("b"))}
}

// diskError is a kernel line of a failing disk.
const diskError = "Buffer I/O error on dev sda1, logical block 0"

// ioError emits an IOError event of msg, now.
func (d *eventDaemon) ioError(msg string) {
	d.store.Emit(report.Event{Reason: "IOError", Message: msg, Time: time.Now()})
}

// settle lets wait pass and the run settle, and returns the Events
// on the API server then.
func (d *eventDaemon) settle(wait time.Duration) []corev1.Event {
	d.t.Helper()
	time.Sleep(wait)
	synctest.Wait()
	return events(d.t, d.client)
}

// restart stops the run, saves its state file, and starts the next run
// over it down later.
func (d *eventDaemon) restart(down time.Duration) {
	d.t.Helper()
	d.stop()
	d.next(restartStore(d.t, d.store), down)
}

// next starts the next run over store down later; the run before is
// stopped.
func (d *eventDaemon) next(store *report.Store, down time.Duration) {
	d.t.Helper()
	time.Sleep(down)
	d.harness = start(d.t, d.client, store)
}

// The same event 30 s apart with a restart of the daemon in between is one
// Event with count 2, as without the restart: the aggregation is kept in
// the state file for the boot. Before, the table lived in memory only and
// the restart made a second Event with count 1.
func TestIdenticalEventAcrossRestartIsOneEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		d.ioError(diskError)
		d.settle(time.Second)
		d.restart(30 * time.Second)
		d.ioError(diskError)
		evs := d.settle(time.Minute)
		if len(evs) != 1 || evs[0].Count != 2 {
			logEvents(t, evs)
			t.Errorf("the same event 30 s apart, a restart in between: %d Events; want 1 with count 2", len(evs))
		}
		d.stop()
	})
}

// The limit of 10 Events of their own for a reason's distinct messages in
// 10 minutes holds across a restart: the Events made before it count.
// Before, a restart started the count again, 10 more Events each time.
func TestSimilarEventsLimitHoldsAcrossRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		sector := 0
		emit := func(n int) {
			for range n {
				sector++
				d.ioError(fmt.Sprintf("I/O error, dev sda, sector %d", sector))
				time.Sleep(time.Second)
			}
		}
		emit(maxSimilarEvents)
		synctest.Wait()
		d.restart(30 * time.Second)
		emit(3)
		evs := d.settle(time.Minute)
		var combined []corev1.Event
		for _, e := range evs {
			if strings.HasPrefix(e.Message, combinedPrefix) {
				combined = append(combined, e)
			}
		}
		if len(evs) != maxSimilarEvents+1 || len(combined) != 1 || combined[0].Count != 3 {
			logEvents(t, evs)
			t.Errorf("13 distinct messages of a reason in 2 minutes, a restart after 10: %d Events, %d combined; want 11, one combined with count 3", len(evs), len(combined))
		}
		d.stop()
	})
}

// A crash leaves the count kept in the state file older than the API
// server's: patches landed after the last save. The restarted writer reads
// the Event before its first patch and goes on from the larger count,
// instead of setting the Event's count back to the kept one.
func TestRestoredEventContinuesFromTheAPIServersCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		d.ioError(diskError)
		d.settle(time.Second)
		// The last save before the crash: the Event with count 1.
		saved := restartStore(t, d.store)
		for range 4 {
			d.ioError(diskError)
		}
		// The count's patch (5) lands, not saved.
		if evs := d.settle(15 * time.Second); len(evs) != 1 || evs[0].Count != 5 {
			logEvents(t, evs)
			t.Fatalf("before the crash: %d Events; want 1 with count 5", len(evs))
		}
		d.stop()
		d.next(saved, 0)
		d.ioError(diskError)
		evs := d.settle(time.Minute)
		if len(evs) != 1 || evs[0].Count != 6 {
			logEvents(t, evs)
			t.Errorf("6 occurrences, the last after a crash that kept count 1: %d Events; want 1 with count 6", len(evs))
		}
		if v := d.m.Failures(); v != 0 {
			t.Errorf("%v failed API calls counted, want 0", v)
		}
		d.stop()
	})
}

// A kept Event that is gone from the API server when the restarted daemon
// patches it (expired: the API server's event TTL; deleted) is created
// anew with the count, and that is not a failed write.
func TestRestoredEventGoneIsCreatedAnew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		d.ioError(diskError)
		d.settle(time.Second)
		d.stop()
		evs := events(t, d.client)
		if len(evs) != 1 {
			t.Fatalf("%d Events after the first occurrence", len(evs))
		}
		first := evs[0].Name
		if err := d.client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("events"), EventNamespace, first); err != nil {
			t.Fatal(err)
		}
		d.next(restartStore(t, d.store), 0)
		d.ioError(diskError)
		evs = d.settle(time.Minute)
		if len(evs) != 1 || evs[0].Name == first || evs[0].Count != 2 {
			logEvents(t, evs)
			t.Errorf("the kept Event deleted, then a restart and its event again: %d Events; want 1 under a new name with count 2", len(evs))
		}
		if v := d.m.Failures(); v != 0 {
			t.Errorf("%v failed API calls counted, want 0: a gone Event is not a failure", v)
		}
		d.stop()
	})
}

// Event names are unique across restarts of the daemon within the boot. A
// crash before the state file took the Event, then the same kernel line
// read again (it keeps its time) after the restart: the name's sequence
// number started again at 1, the name was the earlier Event's, and the
// create got AlreadyExists. When an earlier try of that create had failed
// (its answer lost), the AlreadyExists was taken for the daemon's own Event
// and the earlier run's Event had its count set to this one's.
func TestEventNamesDoNotCollideAfterARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		at := time.Now() // the kernel line's time
		for range 3 {
			d.store.Emit(report.Event{Reason: "IOError", Message: diskError, Time: at})
		}
		d.settle(time.Second)
		d.stop() // a crash: the state file never took the Event
		evs := events(t, d.client)
		if len(evs) != 1 || evs[0].Count != 3 {
			logEvents(t, evs)
			t.Fatalf("before the crash: %d Events; want 1 with count 3", len(evs))
		}
		earlier := evs[0].Name
		// The restarted daemon's first create fails without reaching the
		// API server; its retry goes under the same name.
		var mu sync.Mutex
		failFirst := true
		d.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if failFirst {
				failFirst = false
				return true, nil, errors.New(`Post "https://api:6443/api/v1/namespaces/default/events": context deadline exceeded`)
			}
			return false, nil, nil
		})
		d.next(report.NewStore("b"), 0) // with nothing kept
		// The line read again.
		d.store.Emit(report.Event{Reason: "IOError", Message: diskError, Time: at})
		evs = d.settle(time.Minute)
		counts := map[string]int32{}
		for _, e := range evs {
			counts[e.Name] = e.Count
		}
		if len(evs) != 2 || counts[earlier] != 3 {
			logEvents(t, evs)
			t.Errorf("after the restart: %d Events, the earlier run's %s with count %d; want 2, the earlier one's count 3", len(evs), earlier, counts[earlier])
		}
		for name := range counts {
			if name != earlier && !strings.HasPrefix(name, node+".") {
				t.Errorf("Event name %s", name)
			}
		}
		d.stop()
	})
}

// Events kept in the state file that the daemon does not write so (an
// edited file, another build's) are left out and said so; the valid ones
// are restored, and a kept value that does not decode costs the kept
// Events alone: the reporter starts and writes the next Event.
func TestKeptEventsNotAsWrittenAreLeftOut(t *testing.T) {
	for _, tc := range []struct {
		name, kept, log string
		want            int32 // the count of the kept Event after one more
	}{
		{name: "unreadable", kept: `42`, log: "unreadable", want: 1},
		{name: "one entry bad", kept: `{"node":"` + node + `","seq":5,"events":[
			{"reason":"IOError","message":"M","first":"FIRST","last":"FIRST","count":4,"name":"NAME","namespace":"default","sentCount":4},
			{"reason":"IOError","message":"other","first":"FIRST","last":"FIRST","count":0,"sentCount":0}]}`, log: "left_out=1", want: 5},
		{name: "another node's", kept: `{"node":"other-node","seq":5,"events":[
			{"reason":"IOError","message":"M","first":"FIRST","last":"FIRST","count":4,"name":"NAME","namespace":"default","sentCount":4}]}`, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				client := fake.NewClientset(kubeletNode())
				first := time.Now()
				const name = node + ".1.1"
				ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: EventNamespace}, Reason: "IOError", Message: "M", Count: 4}
				if err := client.Tracker().Create(corev1.SchemeGroupVersion.WithResource("events"), ev, EventNamespace); err != nil {
					t.Fatal(err)
				}
				kept := strings.NewReplacer("FIRST", first.Format(time.RFC3339Nano), "NAME", name).Replace(tc.kept)
				dir := t.TempDir()
				state := fmt.Sprintf(`{"version":1,"bootID":"b","savedAt":%q,"conditions":[],"memos":{%q:%s}}`, first.Format(time.RFC3339Nano), EventsKey, kept)
				if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(state), 0o644); err != nil {
					t.Fatal(err)
				}
				store := report.NewStore("b")
				if res, err := store.Load(dir); err != nil || res.Corrupt != nil {
					t.Fatalf("load: %v %v", err, res.Corrupt)
				}
				var logs bytes.Buffer
				h := startLogged(t, client, store, report.NewDetails(), &logs)
				time.Sleep(30 * time.Second)
				store.Emit(report.Event{Reason: "IOError", Message: "M", Time: time.Now()})
				time.Sleep(time.Minute)
				synctest.Wait()
				h.stop()
				counts := map[string]int32{}
				for _, e := range events(t, client) {
					if e.Name != name {
						counts["new"] += e.Count
					} else {
						counts["kept"] = e.Count
					}
				}
				switch {
				case tc.want > 1 && (counts["kept"] != tc.want || counts["new"] != 0):
					t.Errorf("counts %v, want the kept Event's %d and no new one", counts, tc.want)
				case tc.want == 1 && (counts["kept"] != 4 || counts["new"] != 1):
					t.Errorf("counts %v, want the kept Event's 4 untouched and a new one with 1", counts)
				}
				if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
					t.Errorf("no %q in the log:\n%s", tc.log, logs.String())
				}
			})
		})
	}
}

// A crash right after occurrences were folded into an Event, before the
// aggregation that holds them was published for the state file (keepEvery:
// at most once a second for a change of counts alone) or its count patched
// (every 10 s): the save that came first holds them beside the kernel log
// cursor past their records, as occurrences not in the Events yet, and the
// next start counts them. Before, the save held the Event's count as of its
// create, the cursor was past their records, and they were lost (319 of 450
// in TestKmsgBurstAcrossRestart's SIGKILL case).
func TestOccurrencesNotKeptYetSurviveACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		d.ioError(diskError)
		synctest.Wait() // created, published with count 1
		for range 4 {
			d.ioError(diskError)
		}
		synctest.Wait() // folded, not published: within keepEvery
		saved := restartStore(t, d.store)
		// The crash: nothing more reaches the API server.
		var mu sync.Mutex
		dead := true
		d.client.PrependReactor("*", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if dead {
				return true, nil, errors.New("connection refused")
			}
			return false, nil, nil
		})
		d.stop()
		mu.Lock()
		dead = false
		mu.Unlock()
		if evs := events(t, d.client); len(evs) != 1 || evs[0].Count != 1 {
			logEvents(t, evs)
			t.Fatalf("before the restart: %d Events; want 1 with count 1", len(evs))
		}
		d.next(saved, 0)
		evs := d.settle(time.Minute)
		if len(evs) != 1 || evs[0].Count != 5 {
			logEvents(t, evs)
			t.Errorf("5 occurrences, a crash after the 4 last were folded: %d Events; want 1 with count 5", len(evs))
		}
		d.stop()
	})
}

// Events still in the queue at a crash (the event writer not started yet:
// the kubeconfig appeared later, or it was busy with a write) are in the
// state file beside the cursor past their records, and the next start sends
// them. Before, only the writer's aggregation was kept, from its start.
func TestQueuedEventsSurviveACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := report.NewStore("b")
		q := NewEventQueue(NewMetrics(nil))
		store.Observe(q)
		q.KeepIn(store)
		for range 3 {
			store.Emit(report.Event{Reason: "IOError", Message: diskError, Time: time.Now()})
		}
		next := restartStore(t, store)
		client := fake.NewClientset(kubeletNode())
		h := start(t, client, next)
		time.Sleep(time.Minute)
		synctest.Wait()
		h.stop()
		if evs := events(t, client); len(evs) != 1 || evs[0].Count != 3 {
			logEvents(t, evs)
			t.Errorf("3 events queued at a crash: %d Events after the restart; want 1 with count 3", len(evs))
		}
	})
}

// A crash while the event writer is held in a create (an API server that
// takes a call and does not answer) after it took a second's occurrences
// without publishing them: the state file holds those taken and the full
// queue beside them, up to twice the queue's length, and the next start
// counts every one. Before, the start put them back in the queue (1,024):
// the rest were dropped, and a flood's Events lost the occurrences the
// saved cursor counted as handled.
func TestQueuedPastTheQueuesLengthSurviveACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := startEventDaemon(t)
		d.ioError(diskError)
		synctest.Wait() // created, published
		const taken = 900
		for range taken {
			d.ioError(diskError)
		}
		synctest.Wait() // folded, not published: within keepEvery
		var mu sync.Mutex
		hang := make(chan struct{})
		hung, dead := true, false
		d.client.PrependReactor("*", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			h := hung
			mu.Unlock()
			if h {
				<-hang
			}
			mu.Lock()
			x := dead
			mu.Unlock()
			if x {
				return true, nil, errors.New("connection refused")
			}
			return false, nil, nil
		})
		d.ioError("Buffer I/O error on dev sdb1, logical block 0")
		synctest.Wait() // the writer held in its create
		for range eventQueue {
			d.ioError(diskError)
		}
		saved := restartStore(t, d.store)
		// The crash: nothing more reaches the API server.
		mu.Lock()
		hung, dead = false, true
		mu.Unlock()
		close(hang)
		d.stop()
		mu.Lock()
		dead = false
		mu.Unlock()
		d.next(saved, 0)
		evs := d.settle(time.Minute)
		var total int32
		for _, e := range evs {
			total += e.Count
		}
		if want := int32(1 + taken + 1 + eventQueue); total != want {
			logEvents(t, evs)
			t.Errorf("%d occurrences handled before a crash with the writer held: the Events count %d after the restart", want, total)
		}
		d.stop()
	})
}

// A state file whose queued occurrences are more than this build writes
// (an edited file, a count of 2^40): the start folds maxCarried of them and
// counts the rest as dropped in one step, promptly. Before, it put each
// back in the queue one by one, dropping those past its length: 2^40
// iterations before the daemon started.
func TestQueuedCountNotAsWrittenIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const count = 1 << 40
		at := time.Now()
		edited := report.NewStore("b")
		edited.Keep(EventsKey, func() any {
			return keptEventsState{Node: node, Seq: 1, Queued: []queuedEvent{
				{Reason: "IOError", Message: diskError, First: at, Last: at, Count: count},
			}}
		})
		h := start(t, fake.NewClientset(kubeletNode()), restartStore(t, edited))
		time.Sleep(time.Minute)
		synctest.Wait()
		h.stop()
		evs := events(t, h.client)
		if len(evs) != 1 || evs[0].Count != maxCarried {
			logEvents(t, evs)
			t.Errorf("%d Events; want 1 with count %d", len(evs), maxCarried)
		}
		if v := h.m.Dropped(DropNotAsWritten); v != count-maxCarried {
			t.Errorf("dropped %v; want %d", v, count-maxCarried)
		}
	})
}
