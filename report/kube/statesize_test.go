package kube

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// fitQueued keeps the occurrences not in the kept Events within its budget:
// under it, all as they are; over it, the first entries as they are, in
// order, then the rest merged per reason (one entry each, in the order the
// reasons first came), each with the sum of their counts, the earliest
// first time, the latest last time and the message of the latest
// occurrence (by time, not by place in the queue); no count lost, the
// input left as it was, and the result within the budget.
func TestFitQueuedKeepsTheFirstAndMergesTheRestPerReason(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	msg := func(s string) string { return s + strings.Repeat(".", 90) }
	queued := []queuedEvent{
		{Reason: "IOError", Message: msg("a"), First: at(0), Last: at(0), Count: 1},
		{Reason: "Ext4Error", Message: msg("b"), First: at(1), Last: at(2), Count: 2},
		{Reason: "IOError", Message: msg("c"), First: at(3), Last: at(3), Count: 1},
		// Past the budget from here.
		{Reason: "IOError", Message: msg("d"), First: at(4), Last: at(9), Count: 3},
		{Reason: "Ext4Error", Message: msg("e"), First: at(5), Last: at(5), Count: 1},
		// Earlier than d's last: d's message is the reason's latest.
		{Reason: "IOError", Message: msg("f"), First: at(1), Last: at(6), Count: 2},
	}
	// Enough more that the whole is over the merged entries' room.
	for range 60 {
		queued = append(queued, queuedEvent{Reason: "Ext4Error", Message: msg("h"), First: at(7), Last: at(7), Count: 1})
	}
	// Last in the queue at the same time as the h's: the latest.
	queued = append(queued, queuedEvent{Reason: "Ext4Error", Message: msg("g"), First: at(7), Last: at(7), Count: 4})
	in := append([]queuedEvent(nil), queued...)
	sum := func(qs []queuedEvent) (n, bytes int) {
		for _, q := range qs {
			n += q.Count
			bytes += queuedBytes(q)
		}
		return n, bytes
	}
	count, all := sum(queued)

	if got := fitQueued(queued, all); !slices.Equal(got, queued) {
		t.Errorf("within the budget: %+v, want all as they are", got)
	}
	if got := fitQueued(queued, all-1); len(got) == len(queued) {
		t.Errorf("a byte over the budget: all %d as they are", len(got))
	}

	// Room for the merged entries (one of the largest per reason), and the
	// first three entries exactly.
	room := 0
	for _, r := range []string{"IOError", "Ext4Error"} {
		room += queuedEntryBytes + len(r) + 6*report.MaxMessageLen + 2
	}
	_, first3 := sum(queued[:3])
	budget := room + first3
	got := fitQueued(queued, budget)
	want := append(slices.Clone(queued[:3]),
		queuedEvent{Reason: "IOError", Message: msg("d"), First: at(1), Last: at(9), Count: 5},
		queuedEvent{Reason: "Ext4Error", Message: msg("g"), First: at(5), Last: at(7), Count: 65})
	if !slices.Equal(got, want) {
		t.Errorf("over the budget:\n got %+v\nwant %+v", got, want)
	}
	if n, b := sum(got); n != count || b > budget {
		t.Errorf("over the budget: %d occurrences in %d bytes, want %d within %d", n, b, count, budget)
	}
	if !slices.Equal(queued, in) {
		t.Errorf("the input changed: %+v", queued)
	}
	// One byte less: the third entry is merged too.
	got = fitQueued(queued, budget-1)
	if len(got) != 4 || !slices.Equal(got[:2], queued[:2]) || got[2].Reason != "IOError" || got[2].Count != 6 || got[2].Message != msg("d") || got[2].First != at(1) || got[3].Count != 65 {
		t.Errorf("a byte less: %+v, want the first two as they are, IOError of 6 (c, d, f) and Ext4Error of 65", got)
	}
	// A budget smaller than the merged entries' room: all merged, none lost.
	got = fitQueued(queued, 1)
	if n, _ := sum(got); len(got) != 2 || n != count || got[0].First != at(0) || got[1].Message != msg("g") {
		t.Errorf("no room: %+v, want one entry per reason holding all %d", got, count)
	}
	// A tie on the last time: the later in the queue is the latest.
	tie := []queuedEvent{
		{Reason: "IOError", Message: msg("x"), First: at(0), Last: at(5), Count: 1},
		{Reason: "IOError", Message: msg("y"), First: at(5), Last: at(5), Count: 1},
	}
	if got := fitQueued(tie, 1); len(got) != 1 || got[0].Message != msg("y") || got[0].Count != 2 {
		t.Errorf("a tie: %+v, want one of count 2 with the later message", got)
	}
}

// A state file the build before ac19b7f wrote, with '<', '>' and '&' as
// the \u003c of HTML escaping in a condition's message and in the Events'
// (kept and queued), is read as it was meant: the characters themselves.
func TestStateFileWithHTMLEscapesLoads(t *testing.T) {
	dir := t.TempDir()
	const file = `{
  "version": 1,
  "bootID": "b",
  "savedAt": "2026-12-06T10:00:00Z",
  "conditions": [
    {"type": "DiskUsageHigh", "status": "True", "reason": "` + string(report.ReasonFilesystemSpaceHigh) + `", "message": "/var \u003e 90% \u0026 \u003cinodes\u003e", "lastTransitionTime": "2026-12-06T09:00:00Z", "lastUpdateTime": "2026-12-06T09:00:00Z"}
  ],
  "memos": {
    "events": {"node": "` + node + `", "seq": 7, "events": [{"reason": "IOError", "message": "dev \u003csda\u003e", "first": "2026-12-06T09:00:00Z", "last": "2026-12-06T09:00:00Z", "count": 1, "name": "n.1", "namespace": "` + EventNamespace + `", "sentCount": 1, "lastPatch": "2026-12-06T09:00:00Z"}],
      "queued": [{"reason": "IOError", "message": "a \u0026 b", "first": "2026-12-06T09:30:00Z", "last": "2026-12-06T09:30:00Z", "count": 3}]}
  }
}
`
	if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	store := report.NewStore("b")
	res, _ := store.Load(dir)
	if res.Corrupt != nil || res.Restored != 1 {
		t.Fatalf("load: %+v", res)
	}
	if c, _ := store.Get("DiskUsageHigh"); c.Message != "/var > 90% & <inodes>" {
		t.Errorf("condition message: %q", c.Message)
	}
	q := NewEventQueue(NewMetrics(nil))
	q.KeepIn(store)
	st, had, err := q.restored()
	if !had || err != nil || len(st.Events) != 1 || st.Events[0].Message != "dev <sda>" {
		t.Errorf("kept Events: %+v (had %v, err %v)", st.Events, had, err)
	}
	if c := q.takeCarried(); len(c) != 1 || c[0].Message != "a & b" || c[0].Count != 3 {
		t.Errorf("queued: %+v", c)
	}
	// Saved again, as this build writes: the characters as they are.
	if err := store.Save(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, report.StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(`\u00`)) || !bytes.Contains(b, []byte("90% & <inodes>")) || !bytes.Contains(b, []byte("a & b")) {
		t.Errorf("saved again:\n%s", b)
	}
}

// Beside an Event flood's worst (floodState, lines of '"'), every condition
// that can be True is, with a message of the longest encoding (each byte
// escaped), a condition of two sources with both parts set: the file still
// loads, within its 4 MiB (the conditions and parts add about 60 KB).
func TestStateFileOfEveryConditionBesideAnEventFloodLoads(t *testing.T) {
	store, _ := floodState(t, `"`)
	now := time.Now()
	msg := strings.Repeat(`"`, 2*report.MaxMessageLen)
	n := 0
	for _, d := range report.Conditions {
		if len(d.ProblemReasons) == 0 {
			continue
		}
		c := report.Condition{Type: d.Type, Status: report.StatusTrue, Reason: d.ProblemReasons[0], Message: msg}
		if _, ok := d.Part(report.SourceKmsg); ok {
			store.SetPart(report.SourceKmsg, c, now)
			store.SetPart(report.SourceCheck, c, now)
		} else {
			store.Set(c, now)
		}
		n++
	}
	dir := t.TempDir()
	if err := store.Save(dir, now); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, report.StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d conditions True (a kernel one's two parts too), each message 1,024 '\"', beside the flood: %d bytes (%.2f MiB)", n, fi.Size(), float64(fi.Size())/(1<<20))
	if res, _ := report.NewStore("b").Load(dir); res.Corrupt != nil || res.Restored != n {
		t.Errorf("the state file (%d bytes) loads as %+v; want %d conditions restored", fi.Size(), res, n)
	}
}
