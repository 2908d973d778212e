package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// rebindLogWindow is how long a line of the socket watch (a socket bound
// again, or why not) is said once per socket and reason: a loop that
// removes the sockets' files every second (a cleanup script, a tmpfiles
// rule gone wrong) made a journal line a second for as long as it ran.
// A variable for tests.
var rebindLogWindow = 10 * time.Minute

// rebindLog says the socket watch's lines for one socket: the first of
// each reason (bound again, or the error of a rebind that failed) is
// logged at once, as it was, and opens a window of rebindLogWindow in
// which the same line again is counted, not logged; the window's end says
// how many were not, in one line (a window with none says nothing), and
// the next one is logged again. A timer runs only while a window holds
// lines not logged: none while the sockets are left alone, and none for a
// window that has not repeated its first line. stop says what the windows
// hold at once (the daemon stops).
type rebindLog struct {
	mu      sync.Mutex
	windows map[string]*rebindWindow // by reason ("" for bound again)
	timer   *time.Timer
	due     time.Time // when timer fires; zero while it is not set
	stopped bool
}

// rebindWindow is one reason's window: opened at since by the line said
// then, ending at until; more lines not logged, said by summary.
type rebindWindow struct {
	since, until time.Time
	more         int
	summary      func(more int, over time.Duration)
}

// say logs line for reason, or counts it where its window is open;
// summary says the count at the window's end.
func (r *rebindLog) say(reason string, line func(), summary func(more int, over time.Duration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if w := r.windows[reason]; w != nil && now.Before(w.until) && !r.stopped {
		w.more++
		w.summary = summary
		if w.more == 1 && (r.due.IsZero() || w.until.Before(r.due)) {
			r.arm(w.until.Sub(now), w.until)
		}
		return
	}
	r.sayEnded(now, false)
	line()
	if r.windows == nil {
		r.windows = map[string]*rebindWindow{}
	}
	r.windows[reason] = &rebindWindow{since: now, until: now.Add(rebindLogWindow)}
}

// arm sets the timer to fire after d, at due (under mu).
func (r *rebindLog) arm(d time.Duration, due time.Time) {
	r.due = due
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.fire)
		return
	}
	r.timer.Reset(d)
}

// fire says the windows that have ended, and sets the timer for the next
// one that holds lines not logged.
func (r *rebindLog) fire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.due = time.Time{}
	if r.stopped {
		return
	}
	now := time.Now()
	r.sayEnded(now, false)
	for _, w := range r.windows {
		if w.more > 0 && (r.due.IsZero() || w.until.Before(r.due)) {
			r.due = w.until
		}
	}
	if !r.due.IsZero() {
		r.arm(r.due.Sub(now), r.due)
	}
}

// sayEnded says and closes the windows that ended by now (all, with
// all): a window's summary where it holds lines not logged (under mu).
func (r *rebindLog) sayEnded(now time.Time, all bool) {
	for reason, w := range r.windows {
		if !all && now.Before(w.until) {
			continue
		}
		if w.more > 0 {
			end := w.until
			if now.Before(end) {
				end = now
			}
			w.summary(w.more, end.Sub(w.since))
		}
		delete(r.windows, reason)
	}
}

// stop says what the windows hold now, and ends the timer: nothing is
// said after it.
func (r *rebindLog) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	r.stopped = true
	if r.timer != nil {
		r.timer.Stop()
	}
	r.due = time.Time{}
	r.sayEnded(time.Now(), true)
}

// pending reports whether the timer is set (tests: none while nothing is
// to be said).
func (r *rebindLog) pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.due.IsZero()
}

// spanWords words a window's length for its summary: "10 min" for whole
// minutes, else to the second ("3m12s", "45s").
func spanWords(d time.Duration) string {
	d = d.Round(time.Second)
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return d.String()
}

// timesWords is "1 more time" or "N more times".
func timesWords(n int) string {
	if n == 1 {
		return "1 more time"
	}
	return fmt.Sprintf("%d more times", n)
}

// newRebindCounter is autopilot_health_socket_rebinds_total{socket}, both
// sockets' series from 0.
func newRebindCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "socket_rebinds_total",
		Help: "The daemon's sockets bound again after their files were removed while it ran, by socket: control, status (a loop removing them logs a line per socket and 10 min, this counts each).",
	}, []string{"socket"})
	for _, s := range []string{listenerControl, listenerStatus} {
		c.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
