package checks

import (
	"maps"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/systemd"
)

// Memos keeps small values in the daemon's state file, in the same atomic
// write as the conditions, for this boot only (*report.Store implements it;
// see report.Store.Keep, Memo and Touch).
type Memos interface {
	// Keep registers fn, whose value is saved under key at every save. fn
	// is called with the store's lock held: it must not call the store.
	Keep(key string, fn func() any)
	// Memo decodes the value kept under key in this boot into v: the
	// current one of a producer registered with Keep, else the one saved.
	Memo(key string, v any) bool
	// Touch says that a kept value changed.
	Touch()
}

// UnitWatchKey is the name under which the unit watch keeps its state in the
// state file.
const UnitWatchKey = "units"

// UnitWatch counts the restarts of units that the daemon observes. It is fed
// every read of a unit's properties (Observe) and compares each read with
// the last one it saw of that unit:
//
//   - the same invocation, NRestarts higher: systemd's automatic restarts
//     (Restart=), NRestarts minus the last NRestarts seen (systemd counts the
//     restart when it queues it, a moment before the new invocation);
//   - a new invocation, NRestarts higher: that many automatic restarts;
//   - a new invocation, NRestarts not higher (and not the invocation of an
//     automatic restart already counted): NRestarts was reset, which only a
//     manual start or restart (RestartUnit, StartUnit, the daemon's own
//     repair) or a reset-failed does: one manual restart, plus the
//     automatic restarts since then (NRestarts);
//   - a read made right after the daemon's own restart succeeded
//     (ObserveRestarted) that shows a new invocation: one manual restart
//     plus NRestarts, even when NRestarts happens to be higher;
//   - the first read of a unit, or the first invocation of a unit seen
//     before without one (its start at boot): not a restart; the automatic
//     restarts of that invocation (NRestarts) count.
//
// Limits: a poll sees states, not events. Several manual restarts between
// two reads count as one, and automatic restarts followed by a manual
// restart between two reads are lost (the reset hides them); restarts
// before the first read of this boot are not counted. The daemon's own
// repairs are never merged: the repairer reads the unit right before and
// right after its restart.
//
// The totals feed syself_node_unit_restarts{unit}, a counter. The state
// (last invocation and NRestarts, the totals, and the consumers' marks) is
// kept in the state file when the watch has Memos: a daemon restart within
// the boot neither forgets nor counts twice what was seen before it (up to
// the last save, at most a second after a change), and the counter resumes
// at its value.
type UnitWatch struct {
	memos    Memos
	restarts *prometheus.CounterVec
	load     sync.Once
	mu       sync.Mutex
	units    map[string]*unitSeen
	// sinceBoot reads CLOCK_MONOTONIC, the clock of systemd's
	// timestamps, when a read is taken in.
	sinceBoot func() time.Duration
}

// unitSeen is what the watch knows about one unit (and its saved form).
type unitSeen struct {
	Invocation string    `json:"invocation,omitempty"`
	NRestarts  uint32    `json:"nRestarts"`
	MainStart  time.Time `json:"mainStart,omitzero"`
	// MainStartMono orders reads where both have it (see
	// systemd.Unit.MainStartMono); MainStart where one does not.
	MainStartMono time.Duration `json:"mainStartMono,omitempty"`
	// Queued: NRestarts rose within one invocation, so the next invocation
	// is the automatic restart already counted.
	Queued bool `json:"queued,omitempty"`
	// Auto and Manual are the restarts counted: automatic, and manual
	// (the daemon's own repairs included).
	Auto   uint64 `json:"auto"`
	Manual uint64 `json:"manual"`
	// Marks are Auto as of each consumer's last AutoSince.
	Marks map[string]uint64 `json:"marks,omitempty"`
	// at is when the read applied last was taken in (CLOCK_MONOTONIC;
	// 0: read back from the state file), in memory only: saved, it
	// would change the state file at every read.
	at time.Duration
}

// NewUnitWatch returns a watch. memos may be nil (the one-shot check keeps
// no state); reg may be nil (no metrics). The state saved in this boot is
// read on first use, so the store must be loaded before then.
func NewUnitWatch(memos Memos, reg prometheus.Registerer) *UnitWatch {
	w := &UnitWatch{memos: memos, units: map[string]*unitSeen{}, sinceBoot: sinceBoot,
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syself_node_unit_restarts",
			Help: "Restarts of each critical unit observed by the daemon in this boot: systemd's automatic restarts (NRestarts) and manual starts and restarts (a new invocation that reset NRestarts), the daemon's own repairs included. Several manual restarts between two reads count as one.",
		}, []string{"unit"})}
	if reg != nil {
		reg.MustRegister(w.restarts)
	}
	return w
}

// restore reads the state saved in this boot, once, and from then on keeps
// the watch's state in the state file. It runs without w.mu held: Memo takes
// the store's lock, and the store calls snapshot (w.mu) with its lock held.
func (w *UnitWatch) restore() {
	w.load.Do(func() {
		if w.memos == nil {
			return
		}
		var saved map[string]*unitSeen
		w.memos.Memo(UnitWatchKey, &saved)
		w.mu.Lock()
		for name, st := range saved {
			if st == nil {
				continue
			}
			w.units[name] = st
			w.restarts.WithLabelValues(name).Add(float64(st.Auto + st.Manual))
		}
		w.mu.Unlock()
		w.memos.Keep(UnitWatchKey, w.snapshot)
	})
}

// snapshot returns a copy of the state, for the state file.
func (w *UnitWatch) snapshot() any {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]unitSeen, len(w.units))
	for name, st := range w.units {
		c := *st
		c.Marks = maps.Clone(st.Marks)
		out[name] = c
	}
	return out
}

// Observe feeds one read of a unit's properties.
func (w *UnitWatch) Observe(u systemd.Unit) { w.observe(u, false) }

// ObserveRestarted feeds a read made right after the daemon's own restart of
// the unit succeeded: a new invocation is that restart (counted once, even
// when another read saw it first).
func (w *UnitWatch) ObserveRestarted(u systemd.Unit) { w.observe(u, true) }

func (w *UnitWatch) observe(u systemd.Unit, own bool) {
	if w == nil || u.LoadState != "loaded" {
		return
	}
	w.restore()
	w.mu.Lock()
	changed := w.count(u, own)
	w.mu.Unlock()
	if changed && w.memos != nil {
		w.memos.Touch()
	}
}

// count applies one read; it reports whether the state changed.
func (w *UnitWatch) count(u systemd.Unit, own bool) bool {
	st, ok := w.units[u.Name]
	if !ok {
		w.units[u.Name] = &unitSeen{Invocation: u.Invocation, NRestarts: u.NRestarts, MainStart: u.MainStart, MainStartMono: u.MainStartMono, at: w.sinceBoot()}
		w.restarts.WithLabelValues(u.Name).Add(0)
		return true
	}
	if u.Invocation == "" {
		// Not started (yet) in this boot: nothing to compare.
		return false
	}
	if older(u, st) {
		// An older read than one already applied (two readers at once).
		return false
	}
	var auto, manual uint64
	n0, n1 := st.NRestarts, u.NRestarts
	switch {
	case u.Invocation == st.Invocation:
		if n1 > n0 {
			// Restart queued; the new invocation follows.
			auto = uint64(n1 - n0)
			st.Queued = true
		} else if n1 < n0 {
			st.Queued = false // reset-failed
		}
	case st.Invocation == "":
		auto = uint64(n1) // its first start in this boot
		st.Queued = false
	case own:
		manual, auto = 1, uint64(n1)
		st.Queued = false
	case n1 > n0:
		auto = uint64(n1 - n0)
		st.Queued = false
	case n1 == n0 && st.Queued:
		st.Queued = false // the automatic restart counted when it was queued
	default:
		manual, auto = 1, uint64(n1)
		st.Queued = false
	}
	changed := st.Invocation != u.Invocation || st.NRestarts != n1 || !st.MainStart.Equal(u.MainStart) || st.MainStartMono != u.MainStartMono || auto+manual > 0
	st.Invocation, st.NRestarts, st.MainStart, st.MainStartMono, st.at = u.Invocation, n1, u.MainStart, u.MainStartMono, w.sinceBoot()
	st.Auto += auto
	st.Manual += manual
	if auto+manual > 0 {
		w.restarts.WithLabelValues(u.Name).Add(float64(auto + manual))
	}
	return changed
}

// older says whether u's process started before the one of st, the last
// read applied: by the monotonic starts where both have one, which a step
// of the wall clock does not reorder (a restart after the clock was set
// back would look older than the start before it, and go uncounted until
// the clock caught up).
func older(u systemd.Unit, st *unitSeen) bool {
	if u.MainStartMono > 0 && st.MainStartMono > 0 {
		return u.MainStartMono < st.MainStartMono
	}
	return !u.MainStart.IsZero() && u.MainStart.Before(st.MainStart)
}

// AutoSince returns the automatic restarts of unit counted since the last
// call with the same consumer (since the unit was first seen in this boot,
// on the first call), and moves the consumer's mark.
func (w *UnitWatch) AutoSince(consumer, unit string) uint64 {
	n, auto := w.PendingAuto(consumer, unit)
	w.MarkAuto(consumer, unit, auto)
	return n
}

// PendingAuto returns the automatic restarts of unit counted since
// consumer's last MarkAuto (none before its first: that sets its
// baseline), and the count to pass to MarkAuto once the
// consumer has acted on them (a run that fails half-way must not move its
// mark, or the restarts it saw are forgotten).
func (w *UnitWatch) PendingAuto(consumer, unit string) (n, auto uint64) {
	if w == nil {
		return 0, 0
	}
	w.restore()
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.units[unit]
	if !ok {
		return 0, 0
	}
	mark, had := st.Marks[consumer]
	if !had {
		// The consumer's first look in this boot: a baseline, whatever
		// another reader (the repairer, every 10 s) saw before it.
		return 0, st.Auto
	}
	return st.Auto - min(mark, st.Auto), st.Auto
}

// MarkAuto records that consumer has seen unit's automatic restarts up to
// auto (from PendingAuto).
func (w *UnitWatch) MarkAuto(consumer, unit string, auto uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	st, ok := w.units[unit]
	if !ok {
		w.mu.Unlock()
		return
	}
	if st.Marks == nil {
		st.Marks = map[string]uint64{}
	}
	old, had := st.Marks[consumer]
	st.Marks[consumer] = auto
	w.mu.Unlock()
	if (old != auto || !had) && w.memos != nil {
		w.memos.Touch()
	}
}

// seenInto fills m (cleared; a new map where nil) with each unit's
// NRestarts as last read and when it was taken in, but for unit itself
// and the units read back from the state file only (when is not kept
// there), and returns it. It takes no other lock than w.mu (the repairer
// calls it with its own held) and reads no state file.
func (w *UnitWatch) seenInto(unit string, m map[string]systemd.BoundSeen) map[string]systemd.BoundSeen {
	if m == nil {
		m = map[string]systemd.BoundSeen{}
	}
	clear(m)
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, st := range w.units {
		if name != unit && st.at > 0 {
			m[name] = systemd.BoundSeen{NRestarts: st.NRestarts, At: st.at}
		}
	}
	return m
}

// Restarts returns the restarts of unit counted in this boot: automatic,
// and manual (the daemon's own repairs included).
func (w *UnitWatch) Restarts(unit string) (auto, manual uint64) {
	if w == nil {
		return 0, 0
	}
	w.restore()
	w.mu.Lock()
	defer w.mu.Unlock()
	if st, ok := w.units[unit]; ok {
		return st.Auto, st.Manual
	}
	return 0, 0
}
