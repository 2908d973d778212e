package backoff

import (
	"testing"
	"time"
)

// Each wait lies in [step/2, step]; the step doubles from Min, stops at Max,
// and starts at Min again after Reset.
func TestBackoff(t *testing.T) {
	b := Backoff{Min: time.Second, Max: time.Minute}
	steps := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60, 60}
	check := func(round int) {
		for i, s := range steps {
			s *= time.Second
			for range 200 {
				// Each draw advances the step, so use a fresh copy per draw.
				c := b
				if w := c.Next(); w < s/2 || w > s {
					t.Fatalf("round %d, wait %d: %v, want in [%v, %v]", round, i, w, s/2, s)
				}
			}
			b.Next()
		}
	}
	check(1)
	b.Reset()
	check(2)
}

// The waits are spread over [step/2, step], not one value.
func TestBackoffJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	lo, hi := time.Minute, time.Duration(0)
	for range 1000 {
		b := Backoff{Min: time.Second, Max: time.Minute}
		w := b.Next()
		seen[w] = true
		lo, hi = min(lo, w), max(hi, w)
	}
	if len(seen) < 900 || lo > 600*time.Millisecond || hi < 900*time.Millisecond {
		t.Errorf("1000 first waits: %d distinct in [%v, %v], want spread over [500ms, 1s]", len(seen), lo, hi)
	}
}

// A Max near the largest duration does not overflow the doubling.
func TestBackoffLargeMax(t *testing.T) {
	b := Backoff{Min: time.Hour, Max: 1<<63 - 1}
	prev := time.Duration(0)
	for i := range 80 {
		c := b
		if w := c.Next(); w < 0 {
			t.Fatalf("wait %d: %v", i, w)
		}
		b.Next()
		if b.step < prev {
			t.Fatalf("step %d went down: %v after %v", i, b.step, prev)
		}
		prev = b.step
	}
	if b.step != b.Max {
		t.Errorf("step %v, want Max", b.step)
	}
}
