// Command stoppedtimer shows a wake-up of an idle Go program for a timer
// that was stopped (README, "Where the idle minute's wake-ups go"): with
// one P, 30 timers an hour out (a daemon's loops) and one live timer 10 s
// out, it makes N contexts with a 5 s timeout and cancels each at once (a
// check run that ended early), then waits for the 10 s timer. A stopped
// timer stays in the runtime's heap until it reaches the head at a check or
// a quarter of the heap is stopped timers, and the netpoller and sysmon
// sleep until its deadline all the same:
//
//	go build -o /tmp/stoppedtimer ./tests/tools/stoppedtimer
//	strace -f -tt -e trace=epoll_pwait,futex,nanosleep /tmp/stoppedtimer 1
//
// With N=1 the process wakes 5 s after its start (epoll_pwait returns with
// no event, sysmon polls); with N=0 it does not.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"
)

func main() {
	runtime.GOMAXPROCS(1)
	n := 0
	if len(os.Args) > 1 {
		if _, err := fmt.Sscan(os.Args[1], &n); err != nil {
			fmt.Fprintln(os.Stderr, "usage: stoppedtimer [N]")
			os.Exit(2)
		}
	}
	start := time.Now()
	for range 30 {
		go func() { time.Sleep(time.Hour) }()
	}
	done := make(chan struct{})
	go func() { time.Sleep(10 * time.Second); close(done) }()
	runtime.Gosched() // the timers above in the heap first
	for range n {
		_, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cancel()
	}
	<-done
	fmt.Println("slept", time.Since(start).Round(time.Millisecond))
}
