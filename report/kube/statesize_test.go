package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// floodState is the state file at an Event flood's worst: the aggregation
// table full (maxAggregates Events, each of a distinct message of msg's
// characters), a queue's length of distinct occurrences taken by the
// writer since it last published, and a queue's length more queued, every
// message as long as the store keeps one. It returns the store (with a
// condition set beside the Events) and its queue.
func floodState(t testing.TB, msg string) (*report.Store, *EventQueue) {
	t.Helper()
	store := report.NewStore("b")
	store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
	q := NewEventQueue(NewMetrics(nil))
	store.Observe(q)
	q.KeepIn(store)
	line := func(i int) string { return fmt.Sprint(i) + strings.Repeat(msg, report.MaxMessageLen) }
	now := time.Now()
	st := keptEventsState{Node: node, Seq: 7}
	for i := range maxAggregates {
		st.Events = append(st.Events, keptEvent{Reason: "IOError", Message: report.CapMessage(line(i)), First: now, Last: now, Count: 5,
			Name: "n.123456789abcdef.12345678901", Namespace: EventNamespace, SentCount: 5, LastPatch: now})
	}
	q.publish(st, 0)
	n := maxAggregates
	for range 2 {
		for range eventQueue {
			store.Emit(report.Event{Reason: "IOError", Message: line(n), Time: now})
			n++
		}
		// Taken by the writer, not published yet: the queue takes more.
		for range eventQueue {
			<-q.ch
		}
	}
	return store, q
}

// A flood of long distinct kernel lines (a dying disk's, a userspace
// string quoted in them) fills the Events part of the state file to its
// bounds; the file stays one the next start loads, within its 4 MiB,
// whatever the lines' characters: the conditions, the kept Events and the
// count of every occurrence not in them yet are read back. Before, the
// file outgrew the limit (15.2 MiB of lines of '<', which the encoder
// wrote as \u003c; 6 MiB of '"'), and the next start moved it aside and
// started with no state at all.
func TestStateFileOfAnEventFloodStaysLoadable(t *testing.T) {
	for name, msg := range map[string]string{"plain": "x", "html": "<", "quote": `"`, "control": "\x01", "utf8": "ü"} {
		t.Run(name, func(t *testing.T) {
			store, _ := floodState(t, msg)
			dir := t.TempDir()
			if err := store.Save(dir, time.Now()); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(filepath.Join(dir, report.StateFileName))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("state file: %d bytes (%.2f MiB)", fi.Size(), float64(fi.Size())/(1<<20))
			next := report.NewStore("b")
			res, _ := next.Load(dir)
			if res.Corrupt != nil {
				t.Fatalf("the state file of the flood (%d bytes) is moved aside at the next start: %v; the start has no conditions (%d restored), no kept Events, no kernel log cursor", fi.Size(), res.Corrupt, res.Restored)
			}
			if res.Restored != 1 {
				t.Errorf("conditions restored: %d, want 1", res.Restored)
			}
			q := NewEventQueue(NewMetrics(nil))
			q.KeepIn(next)
			st, had, err := q.restored()
			if !had || err != nil || len(st.Events) != maxAggregates {
				t.Errorf("kept Events restored: %d (had %v, err %v), want %d", len(st.Events), had, err, maxAggregates)
			}
			total := 0
			for _, c := range q.takeCarried() {
				total += c.Count
			}
			if total != 2*eventQueue {
				t.Errorf("occurrences not in the kept Events yet, restored: %d, want %d", total, 2*eventQueue)
			}
		})
	}
}

// The state file's encoding (Store.EncodeWrite, what every save of the
// daemon does under the store's lock) at an Event flood's worst
// (floodState), for lines of plain text and of '"'; bytes/file is the
// file's size.
func BenchmarkEncodeEventFloodState(b *testing.B) {
	for _, tc := range []struct{ name, msg string }{{"plain", "x"}, {"quote", `"`}, {"html", "<"}} {
		b.Run(tc.name, func(b *testing.B) {
			store, _ := floodState(b, tc.msg)
			var n int
			for b.Loop() {
				buf, err := store.Encode(time.Now())
				if err != nil {
					b.Fatal(err)
				}
				n = len(buf)
			}
			b.ReportMetric(float64(n), "bytes/file")
		})
	}
}
