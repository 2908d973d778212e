package tick

import (
	"context"
	"runtime"
	"strings"
	"syscall"
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
// before the next sleep), and each with one ordinary system call at each
// wake-up ("+syscall", getppid(2) through syscall.Syscall, which enters the
// runtime's system call state, as the daemon's D-Bus, file and network
// calls do): where no Go timer is pending, sysmon sleeps in its deep sleep
// (until the next Go timer, at most a minute), and such a call wakes it and
// sets its poll back to 20 µs, ~50 sleeps of 20 µs before its naps double
// again (sysmon in runtime/proc.go). It reports the process's CPU per
// wake-up (every thread's, from schedstat) and its threads' voluntary
// switches per wake-up. "+syscall+work" is the call followed by 1 ms of
// work, as a burst of the daemon's is milliseconds long: sysmon, woken by
// the call, polls at 20 µs while the work runs.
//
//	go test ./internal/tick -run '^$' -bench WakeUp -benchtime 200x -count 3
func BenchmarkWakeUp(b *testing.B) {
	for _, name := range []string{"go", "timerfd", "go+ctx", "timerfd+ctx", "go+syscall", "timerfd+syscall", "go+syscall+work", "timerfd+syscall+work"} {
		b.Run(name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			var t *Timer
			kind, extra, _ := strings.Cut(name, "+")
			switch kind {
			case "go":
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
			wake := func() {
				t.Reset(20 * time.Millisecond)
				<-t.C
				switch extra {
				case "ctx":
					_, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					cancel()
				case "syscall":
					syscall.Syscall(syscall.SYS_GETPPID, 0, 0, 0)
				case "syscall+work":
					syscall.Syscall(syscall.SYS_GETPPID, 0, 0, 0)
					for end := time.Now().Add(time.Millisecond); time.Now().Before(end); {
					}
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
