// Package tick lines up the daemon's periodic wake-ups. On a VM most of an
// idle daemon's CPU is waking up (a timer that fires costs ~0.2 ms of CPU
// on the 2-vCPU machine of README's figures, whatever it then does), so
// the loops that wake on a period (the checks, the kernel log reader's
// read timeout, the state writer, the watchdog) wake at the points of one
// grid: those due at the same time wake the daemon once.
package tick

import (
	"sync"
	"time"
)

// Grid is the points anchor + k·period of every period. The zero Grid
// lines nothing up: Next is after + period.
type Grid struct {
	anchor time.Time
}

// New returns the grid anchored at anchor (the daemon's start).
func New(anchor time.Time) Grid { return Grid{anchor: anchor} }

// Anchor is the grid's anchor (zero for the zero Grid).
func (g Grid) Anchor() time.Time { return g.anchor }

// Next is the first point of period's grid after after: never later than
// after + period. With the zero Grid, or a period that is not positive, it
// is after + period.
func (g Grid) Next(after time.Time, period time.Duration) time.Time {
	if g.anchor.IsZero() || period <= 0 {
		return after.Add(period)
	}
	k := after.Sub(g.anchor) / period
	if after.Before(g.anchor) {
		// Sub truncates toward zero: the point at or before after is
		// one lower when after is not on the grid.
		if g.anchor.Add(k * period).After(after) {
			k--
		}
	}
	return g.anchor.Add((k + 1) * period)
}

// Until is how long from now to Next(now, period) (a timer's Reset).
func (g Grid) Until(now time.Time, period time.Duration) time.Duration {
	return g.Next(now, period).Sub(now)
}

// Ticker is a time.Ticker whose ticks fall on the points of its period's
// grid. A tick that finds the last one not yet received is dropped.
type Ticker struct {
	C <-chan time.Time

	c       chan time.Time
	grid    Grid
	period  time.Duration
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

// NewTicker returns a ticker that ticks at the points of period's grid,
// the first of them at most period from now. period must be positive.
func (g Grid) NewTicker(period time.Duration) *Ticker {
	if period <= 0 {
		panic("tick: non-positive period")
	}
	c := make(chan time.Time, 1)
	tk := &Ticker{C: c, c: c, grid: g, period: period}
	tk.mu.Lock()
	tk.t = time.AfterFunc(g.Until(time.Now(), period), tk.fire)
	tk.mu.Unlock()
	return tk
}

func (tk *Ticker) fire() {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.stopped {
		return
	}
	now := time.Now()
	select {
	case tk.c <- now:
	default:
	}
	tk.t.Reset(tk.grid.Until(now, tk.period))
}

// Stop stops the ticker; no tick is sent after it returns (one may still
// be waiting in C).
func (tk *Ticker) Stop() {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.stopped = true
	tk.t.Stop()
}
