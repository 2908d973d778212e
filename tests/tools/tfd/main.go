// Command tfd is the lead's wake-up measurement of the timers-on-a-timerfd
// trial (README, Cost: "The timers on a timerfd: measured, not kept"): a Go
// program on one P waiting 100 ms in a loop, 200 wake-ups, reporting the CPU
// of all its threads (/proc/self/task/*/schedstat) and their switches per
// wake-up. The waits: sleep (time.Sleep), timer (a time.Timer reset and
// received), timerfd (a timerfd in the runtime's poller read by a raw
// read(2)); a second argument adds, at each wake-up, ctx (a 5 s
// context.WithTimeout made and cancelled) or work (500 µs of work).
//
//	go build -o /tmp/tfd ./tests/tools/tfd
//	/tmp/tfd timer; /tmp/tfd timerfd; /tmp/tfd timerfd ctx; /tmp/tfd timer work
//	cc -O2 -o /tmp/cs tests/tools/tfd/c/nanosleep.c && /tmp/cs
//
// Kept as it was run at 07:14-07:20 UTC on 2026-12-07 (from /tmp/tfd,
// outside the tree then).
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func cpu() (int64, int64) {
	var t, s int64
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		b, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		f := strings.Fields(string(b))
		a, _ := strconv.ParseInt(f[0], 10, 64)
		c, _ := strconv.ParseInt(f[2], 10, 64)
		t += a
		s += c
	}
	return t, s
}

func main() {
	runtime.GOMAXPROCS(1)
	n := 200
	var next func()
	switch os.Args[1] {
	case "sleep":
		next = func() { time.Sleep(100 * time.Millisecond) }
	case "timer":
		tm := time.NewTimer(time.Hour)
		next = func() { tm.Reset(100 * time.Millisecond); <-tm.C }
	case "timerfd":
		fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
		if err != nil {
			panic(err)
		}
		its := unix.ItimerSpec{Interval: unix.NsecToTimespec(100e6), Value: unix.NsecToTimespec(100e6)}
		if err := unix.TimerfdSettime(fd, 0, &its, nil); err != nil {
			panic(err)
		}
		f := os.NewFile(uintptr(fd), "timerfd")
		rc, _ := f.SyscallConn()
		buf := make([]byte, 8)
		next = func() {
			rc.Read(func(fd uintptr) bool {
				_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafePtr(buf)), 8)
				return e != unix.EAGAIN
			})
		}
	}
	if len(os.Args) > 2 {
		inner := next
		switch os.Args[2] {
		case "ctx":
			next = func() {
				inner()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = ctx
				cancel()
			}
		case "work":
			next = func() { inner(); spin(500 * time.Microsecond) }
		case "far":
			t := time.NewTimer(time.Hour)
			defer t.Stop()
		case "ctxlive":
			// a 5 s timeout live while the next wait starts, stopped 50 ms later by a goroutine
			next = func() {
				inner()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = ctx
				go func() { inner2(); cancel() }()
			}
		}
	}
	next()
	c0, s0 := cpu()
	for i := 0; i < n; i++ {
		next()
	}
	c1, s1 := cpu()
	fmt.Printf("%s: %.1f us/wake, %.2f switches/wake\n", os.Args[1], float64(c1-c0)/1e3/float64(n), float64(s1-s0)/float64(n))
}

func inner2() {}

var sink int

func spin(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			sink += i
		}
	}
}

func unsafePtr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
