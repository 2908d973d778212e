package checks

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// peek is the kept connection, left kept (tests).
func (s *keptSlot[T]) peek() T {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept
}

// slotConn is a connection that counts its closes.
type slotConn struct{ closed atomic.Int32 }

func (c *slotConn) Close() error { c.closed.Add(1); return nil }

// keptSlot, alone: of two connections put back (two calls at once) the
// later stays and the other is closed; one put back after close (a call
// that ran through it) is kept and closed once unused for keptConnIdle; the
// idle close counts from the last put, not from the first, and a
// connection is closed once, by whoever lets it go.
func TestKeptSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s keptSlot[*slotConn]
		defer s.close()
		if h := s.take(); h != nil {
			t.Fatalf("an empty slot gave %v", h)
		}
		a, b := new(slotConn), new(slotConn)
		s.put(a)
		if h := s.take(); h != a || a.closed.Load() != 0 {
			t.Fatalf("took %p (a %p closed %d), want a, open", h, a, a.closed.Load())
		}
		// a taken, b dialed by a call beside it: both put back.
		s.put(b)
		s.put(a)
		if s.peek() != a || b.closed.Load() != 1 || a.closed.Load() != 0 {
			t.Fatalf("two put back: kept %p (a %p), b closed %d, a %d; want a kept, b closed once", s.peek(), a, b.closed.Load(), a.closed.Load())
		}
		// Used every 60 s for 5 minutes: kept (the timer set at the first
		// put fires 90 s after it and is set again for what is left).
		for range 5 {
			time.Sleep(60 * time.Second)
			h := s.take()
			if h != a {
				t.Fatalf("after 60 s unused: took %p, want a %p", h, a)
			}
			s.put(h)
		}
		time.Sleep(keptConnIdle - time.Millisecond)
		synctest.Wait()
		if a.closed.Load() != 0 || s.peek() != a {
			t.Fatalf("closed %d times %s after its last use, want kept", a.closed.Load(), keptConnIdle-time.Millisecond)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if a.closed.Load() != 1 || s.peek() != nil {
			t.Fatalf("%s unused: closed %d times, kept %v; want closed once, none kept", keptConnIdle, a.closed.Load(), s.peek() != nil)
		}
		// close while a call runs: its connection put back afterwards is
		// kept, and closed once unused for keptConnIdle.
		c := new(slotConn)
		s.put(c)
		h := s.take()
		s.close()
		s.put(h)
		time.Sleep(keptConnIdle - time.Millisecond)
		synctest.Wait()
		if c.closed.Load() != 0 {
			t.Fatalf("put back after close: closed %d times before %s unused", c.closed.Load(), keptConnIdle)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if c.closed.Load() != 1 || s.peek() != nil {
			t.Fatalf("put back after close, %s unused: closed %d times, kept %v; want once, none", keptConnIdle, c.closed.Load(), s.peek() != nil)
		}
	})
}
