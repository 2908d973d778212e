package tick

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestNext(t *testing.T) {
	anchor := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	g := New(anchor)
	at := func(d time.Duration) time.Time { return anchor.Add(d) }
	s := time.Second
	for _, tc := range []struct {
		after, period, want time.Duration
	}{
		{0, 10 * s, 10 * s},
		{1, 10 * s, 10 * s},
		{10 * s, 10 * s, 20 * s}, // on a point: the next one
		{25 * s, 10 * s, 30 * s},
		{25 * s, time.Minute, time.Minute},
		{-1, 10 * s, 0},
		{-10 * s, 10 * s, 0},
		{-15 * s, 10 * s, -10 * s},
		{7 * s, 3 * s, 9 * s},
	} {
		got := g.Next(at(tc.after), tc.period)
		if got.Sub(anchor) != tc.want {
			t.Errorf("Next(%s, %s) = %s, want %s", tc.after, tc.period, got.Sub(anchor), tc.want)
		}
		if d := got.Sub(at(tc.after)); d <= 0 || d > tc.period {
			t.Errorf("Next(%s, %s) is %s after", tc.after, tc.period, d)
		}
	}
	// The zero Grid lines nothing up.
	if got := (Grid{}).Next(at(7*s), 10*s); !got.Equal(at(17 * s)) {
		t.Errorf("zero Grid: %s", got.Sub(anchor))
	}
}

// A ticker ticks on the grid, whenever it was made, and not after Stop.
func TestTicker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New(time.Now())
		time.Sleep(3 * time.Second)
		tk := g.NewTicker(10 * time.Second)
		var got []time.Duration
		for range 3 {
			got = append(got, (<-tk.C).Sub(g.Anchor()))
		}
		want := []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("ticks at %v, want %v", got, want)
			}
		}
		tk.Stop()
		time.Sleep(time.Minute)
		select {
		case v := <-tk.C:
			t.Errorf("a tick after Stop: %s", v.Sub(g.Anchor()))
		default:
		}
	})
}
