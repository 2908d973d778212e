package tick

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The timerfd form runs on real time: these tests wait for what they
// assert (a tick, a callback, the service's count of fired timers), each
// wait bounded by await's limit, and never sleep.

func newTestService(t *testing.T) *service {
	t.Helper()
	s, err := newService()
	if err != nil {
		t.Fatalf("no timerfd: %v", err)
	}
	t.Cleanup(s.close)
	return s
}

const awaitLimit = 10 * time.Second

// await waits for cond, polled each millisecond by a Go timer, at most
// awaitLimit.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(awaitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not after %s: %s", awaitLimit, what)
		}
		<-time.After(time.Millisecond)
	}
}

func receive(t *testing.T, c <-chan time.Time) time.Time {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(awaitLimit):
		t.Fatalf("no tick after %s", awaitLimit)
		return time.Time{}
	}
}

func (s *service) firedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fired
}

// A timer ticks once, not before its time.
func TestTimerfdTimerTicks(t *testing.T) {
	s := newTestService(t)
	start := time.Now()
	tm := s.newTimer(20*time.Millisecond, nil)
	v := receive(t, tm.C)
	if d := v.Sub(start); d < 20*time.Millisecond {
		t.Errorf("ticked after %s, want 20ms or more", d)
	}
	if tm.Stop() {
		t.Error("Stop after the tick was received reports a stopped timer")
	}
	// A later timer fires; the first did not tick again meanwhile.
	receive(t, s.newTimer(time.Millisecond, nil).C)
	select {
	case <-tm.C:
		t.Error("a second tick")
	default:
	}
}

// Timers fire in the order of their deadlines, many of them, all of them.
func TestTimerfdFireOrder(t *testing.T) {
	s := newTestService(t)
	const n = 2000
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	wg.Add(n)
	ds := make([]int, n)
	for i := range n {
		ds[i] = rand.IntN(100) // ms
	}
	for _, d := range ds {
		s.newTimer(time.Duration(d)*time.Millisecond, func() {
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(awaitLimit):
		t.Fatalf("%d of %d timers fired", s.firedCount(), n)
	}
	// Callbacks run in goroutines of their own, in any order.
	mu.Lock()
	defer mu.Unlock()
	if len(got) != n {
		t.Fatalf("%d callbacks, want %d", len(got), n)
	}
	// Channel timers show the order: each tick carries the time it was
	// sent, never before the timer's deadline, and a later deadline's
	// never before an earlier one's.
	// A timer of an hour beside them does not hold them up.
	far := s.newTimer(time.Hour, nil)
	defer far.Stop()
	start := time.Now()
	var cs []*Timer
	for i := range 50 {
		cs = append(cs, s.newTimer(time.Duration(50-i)*time.Millisecond, nil))
	}
	var last time.Time
	for i := len(cs) - 1; i >= 0; i-- {
		v := receive(t, cs[i].C)
		if d := time.Duration(50-i) * time.Millisecond; v.Sub(start) < d {
			t.Errorf("timer of %s ticked after %s", d, v.Sub(start))
		}
		if v.Before(last) {
			t.Errorf("timer of %dms ticked %s before the one due 1ms sooner", 50-i, last.Sub(v))
		}
		last = v
	}
}

// Reset moves a pending timer, and leaves no tick from before it in C, a
// tick that was sent and not received included (then it reports true).
func TestTimerfdReset(t *testing.T) {
	s := newTestService(t)
	tm := s.newTimer(time.Hour, nil)
	if !tm.Reset(5 * time.Millisecond) {
		t.Error("Reset of a pending timer reports false")
	}
	receive(t, tm.C)
	// Fired, not received.
	tm.Reset(time.Millisecond)
	fired := s.firedCount()
	await(t, "the timer fired", func() bool { return s.firedCount() > fired })
	if !tm.Reset(time.Hour) {
		t.Error("Reset of a timer whose tick was not received reports false")
	}
	select {
	case <-tm.C:
		t.Error("a stale tick in C after Reset")
	default:
	}
	// A sooner Reset re-arms the timerfd to it.
	tm.Reset(time.Millisecond)
	receive(t, tm.C)
}

// Stop takes a pending timer out: it never fires; a later one does.
func TestTimerfdStop(t *testing.T) {
	s := newTestService(t)
	var ran atomic.Bool
	f := s.newTimer(5*time.Millisecond, func() { ran.Store(true) })
	c := s.newTimer(5*time.Millisecond, nil)
	if !f.Stop() || !c.Stop() {
		t.Error("Stop of a pending timer reports false")
	}
	if f.Stop() || c.Stop() {
		t.Error("a second Stop reports true")
	}
	receive(t, s.newTimer(20*time.Millisecond, nil).C)
	if ran.Load() {
		t.Error("a stopped AfterFunc ran")
	}
	select {
	case <-c.C:
		t.Error("a stopped timer ticked")
	default:
	}
	// Fired, not received: Stop takes the tick out and reports true.
	c.Reset(time.Millisecond)
	fired := s.firedCount()
	await(t, "the timer fired", func() bool { return s.firedCount() > fired })
	if !c.Stop() {
		t.Error("Stop of a timer whose tick was not received reports false")
	}
	select {
	case <-c.C:
		t.Error("a tick in C after Stop")
	default:
	}
}

// A callback that sets its own timer again.
func TestTimerfdResetFromItsCallback(t *testing.T) {
	s := newTestService(t)
	var n atomic.Int32
	done := make(chan struct{})
	var tm *Timer
	var mu sync.Mutex
	mu.Lock()
	tm = s.newTimer(time.Millisecond, func() {
		mu.Lock()
		defer mu.Unlock()
		if n.Add(1) == 20 {
			close(done)
			return
		}
		tm.Reset(time.Millisecond)
	})
	mu.Unlock()
	select {
	case <-done:
	case <-time.After(awaitLimit):
		t.Fatalf("%d of 20 runs", n.Load())
	}
}

// A Stop that races the fire: where it reports true the callback never
// runs, where false it runs, once.
func TestTimerfdStopRacesTheFire(t *testing.T) {
	s := newTestService(t)
	const n = 2000
	var ran atomic.Int32
	stopped := 0
	for i := range n {
		tm := s.newTimer(time.Duration(i%3)*10*time.Microsecond, func() { ran.Add(1) })
		if i%7 == 0 {
			receive(t, s.newTimer(0, nil).C) // let some fire first
		}
		if tm.Stop() {
			stopped++
		}
	}
	await(t, "the callbacks of the timers not stopped", func() bool { return int(ran.Load()) >= n-stopped })
	receive(t, s.newTimer(time.Millisecond, nil).C)
	if got := int(ran.Load()); got != n-stopped {
		t.Errorf("%d callbacks ran, %d of %d timers stopped", got, stopped, n)
	}
	t.Logf("%d of %d stopped before they fired", stopped, n)
}

// Timers due together fire in one wake-up of the service.
func TestTimerfdOneWakeUpForTimersDueTogether(t *testing.T) {
	s := newTestService(t)
	s.mu.Lock()
	wakes := s.wakes
	s.mu.Unlock()
	var ts []*Timer
	for range 10 {
		ts = append(ts, s.newTimer(time.Hour, nil))
	}
	// One deadline for all: set it under the lock, as Reset would.
	s.mu.Lock()
	when := deadline(20 * time.Millisecond)
	for _, tm := range ts {
		s.stopLocked(tm)
		tm.when = when
		s.heap.Push(tm)
	}
	slices.SortFunc(s.heap, func(a, b *Timer) int { return int(a.when - b.when) })
	for i, tm := range s.heap {
		tm.index = i
	}
	s.armLocked()
	s.mu.Unlock()
	for _, tm := range ts {
		receive(t, tm.C)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.wakes - wakes; d != 1 {
		t.Errorf("%d wake-ups for 10 timers due together, want 1", d)
	}
}

// Without UseTimerfd the timers are Go timers: testing/synctest's fake
// clock moves them.
func TestGoTimersWithoutTheService(t *testing.T) {
	if timerfd.Load() != nil {
		t.Fatal("the package's tests run without UseTimerfd")
	}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		tm := NewTimer(time.Hour)
		if v := <-tm.C; v.Sub(start) != time.Hour {
			t.Errorf("ticked after %s", v.Sub(start))
		}
		var ran atomic.Bool
		AfterFunc(time.Minute, func() { ran.Store(true) })
		<-After(2 * time.Minute)
		if !ran.Load() {
			t.Error("AfterFunc did not run")
		}
	})
}
