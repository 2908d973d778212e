package tick

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/testenv"
)

// BenchmarkWakeUp is an idle wake-up, a timer set and received, paced as
// the daemon's are (20 ms apart here, long enough for the runtime's
// monitor thread to fall asleep; seconds in the daemon), on one processor
// as the daemon runs: by a Go timer ("go") and by this package's timerfd
// ("timerfd"), each also with a 5 s context.WithTimeout made and cancelled
// at each wake-up, as a check's run does ("+ctx": a Go timer that is gone
// before the next sleep). It reports the process's CPU per wake-up (every
// thread's, from schedstat) and its threads' voluntary switches per
// wake-up.
//
//	go test ./internal/tick -run '^$' -bench WakeUp -benchtime 200x -count 3
func BenchmarkWakeUp(b *testing.B) {
	for _, name := range []string{"go", "timerfd", "go+ctx", "timerfd+ctx"} {
		b.Run(name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			var t *Timer
			switch name {
			case "go", "go+ctx":
				t = NewTimer(time.Hour)
			default:
				s, err := newService()
				if err != nil {
					b.Fatal(err)
				}
				defer s.close()
				t = s.newTimer(time.Hour, nil)
			}
			defer t.Stop()
			withCtx := name == "go+ctx" || name == "timerfd+ctx"
			wake := func() {
				t.Reset(20 * time.Millisecond)
				<-t.C
				if withCtx {
					_, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					cancel()
				}
			}
			wake()
			cpu0, wakes0 := testenv.Threads(b)
			b.ResetTimer()
			for range b.N {
				wake()
			}
			b.StopTimer()
			cpu1, wakes1 := testenv.Threads(b)
			b.ReportMetric(float64(cpu1-cpu0)/1e3/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(wakes1-wakes0)/float64(b.N), "wakes/op")
		})
	}
}
