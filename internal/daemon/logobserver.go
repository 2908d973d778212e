package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/syself/autopilot-health/report"
)

// logObserver logs every condition change, and events: the first of each
// reason at once, then at most one line per reason every eventLogEvery with
// the number of events in between, so a flood of kernel lines is a few
// journal lines, not thousands.
type logObserver struct {
	log *slog.Logger
	ev  *eventLogLimiter
}

const eventLogEvery = 10 * time.Second

type eventLogLimiter struct {
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

func newLogObserver(log *slog.Logger) logObserver {
	return logObserver{log: log, ev: &eventLogLimiter{last: map[string]time.Time{}, suppressed: map[string]int{}}}
}

func (l logObserver) ConditionChanged(prev *report.Condition, cur report.Condition) {
	from := "none"
	if prev != nil {
		from = string(prev.Status)
	}
	lv := slog.LevelInfo
	switch {
	case prev != nil && prev.Status == cur.Status && prev.Reason == cur.Reason:
		// Only the detail changed (another matching kernel line, a new
		// percentage): the journal has a line per change of state, not per
		// evaluation.
		lv = slog.LevelDebug
	case cur.Status == report.StatusTrue:
		lv = slog.LevelWarn
	}
	l.log.Log(context.Background(), lv, "condition changed", "condition", cur.Type, "from", from, "status", cur.Status, "reason", cur.Reason, "message", cur.Message)
}

func (l logObserver) ConditionRestored(report.Condition) {}

// TransitionRedated implements report.Redater: a transition time read back
// from the Node or the state file lay in the future (written while the
// clock was ahead) and was taken as now, or was missing and was taken as
// the state file's save time, or as now from the Node; once per condition
// and read.
func (l logObserver) TransitionRedated(c report.Condition, was time.Time, from string) {
	if was.IsZero() {
		l.log.Warn("condition read back without a transition time (edited by hand?); taken as the state file's save time, or as now from the Node",
			"condition", c.Type, "status", c.Status, "reason", c.Reason, "from", from, "now", c.LastTransitionTime)
		return
	}
	l.log.Warn("condition's transition time lay in the future (written while the clock was ahead); taken as now",
		"condition", c.Type, "status", c.Status, "reason", c.Reason, "from", from, "was", was, "now", c.LastTransitionTime)
}

func (l logObserver) EventEmitted(e report.Event) {
	l.ev.mu.Lock()
	now := time.Now()
	if last, ok := l.ev.last[e.Reason]; ok && now.Sub(last) < eventLogEvery {
		l.ev.suppressed[e.Reason]++
		l.ev.mu.Unlock()
		return
	}
	n := l.ev.suppressed[e.Reason]
	l.ev.last[e.Reason] = now
	l.ev.suppressed[e.Reason] = 0
	l.ev.mu.Unlock()
	if n > 0 {
		l.log.Warn("event", "reason", e.Reason, "message", e.Message, "not_logged_since_last", n)
		return
	}
	l.log.Warn("event", "reason", e.Reason, "message", e.Message)
}
