package daemon

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Liveness tracks whether every loop of the daemon makes progress. A loop is
// stuck when it has not reported progress within its allowed silence (its
// period plus loopSlack); a stuck loop fails /healthz and stops the systemd
// watchdog pings.
type Liveness struct {
	mu    sync.Mutex
	now   func() time.Time
	loops map[string]*loopState
	// OnBeat, if set, is called on every beat (for the progress metric).
	OnBeat func(loop string, t time.Time)
	// OnExpect, if set, is called when Expect starts tracking a loop it
	// did not track, with the time its silence is counted from: the
	// loop's progress series is there from then on, not only from its
	// first beat (a loop that beats first after its period, such as
	// detect, would be missing from the metrics while /healthz counts it).
	OnExpect func(loop string, t time.Time)
}

type loopState struct {
	last       time.Time
	maxSilence time.Duration
}

// NewLiveness returns an empty tracker.
func NewLiveness(now func() time.Time) *Liveness {
	return &Liveness{now: now, loops: map[string]*loopState{}}
}

// Expect registers a loop that must beat within period (+ loopSlack) from
// now on. A loop not tracked yet is reported to OnExpect; one tracked
// already (a check a reload changed) keeps its progress series as it is.
func (l *Liveness) Expect(loop string, period time.Duration) {
	now := l.now()
	l.mu.Lock()
	_, tracked := l.loops[loop]
	l.loops[loop] = &loopState{last: now, maxSilence: period + loopSlack}
	l.mu.Unlock()
	if !tracked && l.OnExpect != nil {
		l.OnExpect(loop, now)
	}
}

// Forget stops tracking a loop (it ended on purpose).
func (l *Liveness) Forget(loop string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.loops, loop)
}

// Beat records progress of a loop; the next beat is due within period (+
// loopSlack). period is the longest the loop itself expects to take before
// it beats again (a check: its interval + timeout), with no margin: the
// margin is loopSlack, added here for every loop.
func (l *Liveness) Beat(loop string, period time.Duration) {
	t := l.now()
	maxSilence := period + loopSlack
	l.mu.Lock()
	if st, ok := l.loops[loop]; ok {
		st.last, st.maxSilence = t, maxSilence
	} else {
		l.loops[loop] = &loopState{last: t, maxSilence: maxSilence}
	}
	l.mu.Unlock()
	if l.OnBeat != nil {
		l.OnBeat(loop, t)
	}
}

// Check returns an error naming every stuck loop, or nil.
func (l *Liveness) Check() error {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var stuck []string
	for name, s := range l.loops {
		if silent := now.Sub(s.last); silent > s.maxSilence {
			stuck = append(stuck, fmt.Sprintf("%s (no progress for %s, allowed %s)", name, silent.Truncate(time.Second), s.maxSilence))
		}
	}
	if len(stuck) == 0 {
		return nil
	}
	slices.Sort(stuck)
	return fmt.Errorf("stuck loops: %s", strings.Join(stuck, ", "))
}

// Loops returns the names of the tracked loops, sorted.
func (l *Liveness) Loops() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k := range l.loops {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Allowed returns how long a loop may stay silent before it is stuck: the
// period of its last Expect or Beat plus loopSlack.
func (l *Liveness) Allowed(loop string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.loops[loop]
	if !ok {
		return 0, false
	}
	return st.maxSilence, true
}

// loopSlack is the one liveness policy: every loop may stay silent for its
// own period plus loopSlack before it counts as stuck (README, "Under
// systemd"). Callers pass only their period to Expect and Beat.
const loopSlack = 30 * time.Second

// Healthy returns nil when every loop makes progress.
func (d *Daemon) Healthy() error {
	err := d.live.Check()
	d.metrics.SetHealthy(err == nil)
	return err
}
