package daemon

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// sayLog records what a rebindLog says, one string a line. The summary is
// said by the window's timer, on a goroutine of its own: the lines are
// taken under a lock (a sleep in a synctest bubble orders nothing for the
// race detector; make test-race found the test's own read racing it).
type sayLog struct {
	mu    sync.Mutex
	lines []string
}

func (s *sayLog) add(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, line)
}

// all returns a copy of the lines said so far.
func (s *sayLog) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lines)
}

func (s *sayLog) say(r *rebindLog, reason string) {
	r.say(reason, func() { s.add("first " + reason) }, func(more int, over time.Duration) {
		s.add(fmt.Sprintf("summary %s: %s in the last %s", reason, timesWords(more), spanWords(over)))
	})
}

// The socket watch's line for a socket and reason is logged the first
// time, the same again within rebindLogWindow (10 min) counted and said in
// one line at the window's end; the next one after is logged again. Each
// reason has a window of its own. A timer is set only while a window holds
// lines not logged: none after a single line, none once the summary is
// said, none while nothing happens. Before, each rebind was a line: a loop
// removing the files every second wrote a journal line a second.
func TestRebindLogSaysEachReasonOnceAWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var r rebindLog
		var got sayLog
		got.say(&r, "")
		if r.pending() {
			t.Error("a timer is set after a single line: nothing is to be said at the window's end")
		}
		for range 57 {
			time.Sleep(time.Second)
			got.say(&r, "")
		}
		// Another reason is said at once, in a window of its own.
		got.say(&r, "lock held")
		got.say(&r, "lock held")
		if want := []string{"first ", "first lock held"}; strings.Join(got.all(), "|") != strings.Join(want, "|") {
			t.Errorf("within the window: %q, want %q", got.all(), want)
		}
		if !r.pending() {
			t.Error("no timer while the window holds lines not logged")
		}
		time.Sleep(rebindLogWindow - 57*time.Second - time.Millisecond)
		synctest.Wait()
		if len(got.all()) != 2 {
			t.Errorf("before the window's end: %q", got.all())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		want := []string{"first ", "first lock held", "summary : 57 more times in the last 10 min"}
		if strings.Join(got.all(), "|") != strings.Join(want, "|") {
			t.Errorf("at the window's end: %q, want %q", got.all(), want)
		}
		if !r.pending() {
			t.Error("no timer for the other reason's window, which holds a line not logged")
		}
		time.Sleep(57 * time.Second) // its end
		synctest.Wait()
		want = append(want, "summary lock held: 1 more time in the last 10 min")
		if strings.Join(got.all(), "|") != strings.Join(want, "|") {
			t.Errorf("at the other window's end: %q, want %q", got.all(), want)
		}
		if r.pending() {
			t.Error("a timer is still set once every window was said")
		}
		// Nothing happens: nothing said, no timer.
		time.Sleep(time.Hour)
		synctest.Wait()
		if len(got.all()) != len(want) || r.pending() {
			t.Errorf("an idle hour: %q, timer set %v", got.all()[len(want):], r.pending())
		}
		// The next one is logged again.
		got.say(&r, "")
		if got.all()[len(got.all())-1] != "first " || r.pending() {
			t.Errorf("after the window: %q, timer set %v", got.all()[len(want):], r.pending())
		}
	})
}

// A storm that lasts (a rebind every second for 30 min) is a line and a
// summary per window, whose counts add up to every rebind; the stop says
// what the open window holds, and nothing is said after it.
func TestRebindLogStormIsTwoLinesAWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var r rebindLog
		var got sayLog
		const storm = 30 * 60
		for range storm {
			got.say(&r, "")
			time.Sleep(time.Second)
		}
		got.say(&r, "") // at 30 min: a window's first line
		time.Sleep(time.Second)
		got.say(&r, "")
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		r.stop()
		said := 0
		for _, l := range got.all() {
			var n int
			switch {
			case l == "first ":
				said++
			case strings.HasPrefix(l, "summary : "):
				fmt.Sscanf(strings.TrimPrefix(l, "summary : "), "%d", &n)
				if n == 1 && !strings.Contains(l, "1 more time in") {
					t.Errorf("%q", l)
				}
				said += n
			default:
				t.Errorf("line %q", l)
			}
		}
		if said != storm+2 || len(got.all()) != 8 {
			t.Errorf("%d rebinds said in %d lines, want %d in 8 (a line and a summary per 10 min):\n%s", said, len(got.all()), storm+2, strings.Join(got.all(), "\n"))
		}
		if l := got.all()[len(got.all())-1]; l != "summary : 1 more time in the last 2m1s" {
			t.Errorf("the stop's summary: %q, want the open window's, 1 more time in the last 2m1s", l)
		}
		n := len(got.all())
		got.say(&r, "")
		time.Sleep(time.Hour)
		synctest.Wait()
		if r.pending() || len(got.all()) != n+1 {
			t.Errorf("after the stop: %q, timer set %v", got.all()[n:], r.pending())
		}
		t.Logf("%d rebinds in 30 min: %q", storm+2, got.all())
	})
}
