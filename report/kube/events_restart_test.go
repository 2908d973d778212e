package kube

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/report"
)

// logEvents logs the Events on the fake API server.
func logEvents(t *testing.T, evs []corev1.Event) {
	t.Helper()
	for _, e := range evs {
		t.Logf("Event %s: %s %q count %d", e.Name, e.Reason, e.Message, e.Count)
	}
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
		client := fake.NewClientset(kubeletNode())
		store := report.NewStore("b")
		h := start(t, client, store)
		const msg = "Buffer I/O error on dev sda1, logical block 0"
		at := time.Now() // the kernel line's time
		for range 3 {
			store.Emit(report.Event{Reason: "IOError", Message: msg, Time: at})
		}
		time.Sleep(time.Second)
		synctest.Wait()
		h.stop() // a crash: the state file never took the Event
		evs := events(t, client)
		if len(evs) != 1 || evs[0].Count != 3 {
			logEvents(t, evs)
			t.Fatalf("before the crash: %d Events; want 1 with count 3", len(evs))
		}
		earlier := evs[0].Name
		// The restarted daemon's first create fails without reaching the
		// API server; its retry goes under the same name.
		var mu sync.Mutex
		failFirst := true
		client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if failFirst {
				failFirst = false
				return true, nil, errors.New(`Post "https://api:6443/api/v1/namespaces/default/events": context deadline exceeded`)
			}
			return false, nil, nil
		})
		store = report.NewStore("b")
		h = start(t, client, store)
		store.Emit(report.Event{Reason: "IOError", Message: msg, Time: at}) // the line read again
		time.Sleep(time.Minute)
		synctest.Wait()
		evs = events(t, client)
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
		h.stop()
	})
}
