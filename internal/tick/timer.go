package tick

import (
	"container/heap"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// Timers. The daemon's idle wake-ups are its timers', and a Go timer
// costs more than its own wake-up: the runtime's monitor thread (sysmon)
// sleeps until the earliest Go timer (timeSleepUntil in runtime/proc.go),
// wakes with it, and sleeps again in short steps before its long sleep,
// so each timer that fires wakes two threads and switches ~4 times (README,
// Cost). The timers of this package (NewTimer, AfterFunc, After, and
// Grid's Ticker) wake on one timerfd in the runtime's poller once
// UseTimerfd has been called (the daemon's main does): only the thread
// waiting in epoll_pwait wakes. Until then, and in every test that does
// not call it (testing/synctest's fake clock moves Go timers, which a
// timerfd cannot follow), they are Go timers. A timer keeps the form it
// was made with.

// Timer is a time.Timer of this package: a tick on C (NewTimer, After) or
// a call of a function in its own goroutine (AfterFunc). As Go 1.23's,
// Stop and Reset leave no tick in C from before them, and Stop reports
// whether it stopped a tick that was yet to be received.
type Timer struct {
	C <-chan time.Time

	gt *time.Timer // the Go timer form (no service)

	s     *service
	c     chan time.Time // C, buffered: the service never waits on it
	f     func()
	when  int64 // deadline on rawsys.Nanotime's clock
	index int   // in s.heap, -1 when not
}

var timerfd atomic.Pointer[service]

// UseTimerfd makes the timers made after it wake on one timerfd (see
// above). It fails where no timerfd can be made; the timers then stay Go
// timers. A second call does nothing.
func UseTimerfd() error {
	if timerfd.Load() != nil {
		return nil
	}
	s, err := newService()
	if err != nil {
		return err
	}
	if !timerfd.CompareAndSwap(nil, s) {
		s.close()
	}
	return nil
}

// NewTimer is time.NewTimer.
func NewTimer(d time.Duration) *Timer {
	if s := timerfd.Load(); s != nil {
		return s.newTimer(d, nil)
	}
	gt := time.NewTimer(d)
	return &Timer{C: gt.C, gt: gt}
}

// AfterFunc is time.AfterFunc.
func AfterFunc(d time.Duration, f func()) *Timer {
	if s := timerfd.Load(); s != nil {
		return s.newTimer(d, f)
	}
	return &Timer{gt: time.AfterFunc(d, f)}
}

// After is time.After: NewTimer(d).C. The timer stays in the service's
// heap until it fires; a loop that makes one on each turn and may turn
// often should keep a Timer and Reset it.
func After(d time.Duration) <-chan time.Time { return NewTimer(d).C }

// Stop is time.Timer's Stop; a nil t has nothing to stop.
func (t *Timer) Stop() bool {
	if t == nil {
		return false
	}
	if t.gt != nil {
		return t.gt.Stop()
	}
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(t)
}

// Chan is C, nil for a nil t: a select's case that waits for an optional
// timer.
func (t *Timer) Chan() <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// Reset is time.Timer's Reset.
func (t *Timer) Reset(d time.Duration) bool {
	if t.gt != nil {
		return t.gt.Reset(d)
	}
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.stopLocked(t)
	t.when = deadline(d)
	heap.Push(&s.heap, t)
	s.armLocked()
	return was
}

// deadline is d from now on rawsys.Nanotime's clock.
func deadline(d time.Duration) int64 {
	now := rawsys.Nanotime()
	if d <= 0 {
		return now
	}
	if w := now + int64(d); w > now {
		return w
	}
	return 1<<63 - 1
}

// service is the timers on one timerfd: a heap of deadlines, the timerfd
// set (absolute, CLOCK_MONOTONIC) to the earliest, and one goroutine that
// waits for it in the runtime's poller, read by raw read(2) (a read made
// through os enters the runtime's system call state, which wakes sysmon;
// kmsg's gathering timer does the same) and fires what is due.
type service struct {
	f     *os.File
	fd    uintptr
	rc    syscall.RawConn
	mu    sync.Mutex
	heap  timerHeap
	armed int64 // the timerfd's deadline, 0 when disarmed
	fired int   // timers fired (for tests)
	wakes int   // wake-ups of the service goroutine (for tests)
}

func newService() (*service, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("timerfd_create", err)
	}
	s := &service{f: os.NewFile(uintptr(fd), "timerfd"), fd: uintptr(fd)}
	if s.rc, err = s.f.SyscallConn(); err != nil {
		s.f.Close()
		return nil, err
	}
	go s.run()
	return s, nil
}

// close ends the service (tests; the daemon's lives as long as it does).
// Its timers no longer fire.
func (s *service) close() { s.f.Close() }

func (s *service) newTimer(d time.Duration, f func()) *Timer {
	t := &Timer{s: s, f: f, when: deadline(d)}
	if f == nil {
		t.c = make(chan time.Time, 1)
		t.C = t.c
	}
	s.mu.Lock()
	heap.Push(&s.heap, t)
	s.armLocked()
	s.mu.Unlock()
	return t
}

// stopLocked takes t out of the heap and its tick out of C: whether there
// was either.
func (s *service) stopLocked(t *Timer) bool {
	was := t.index >= 0
	if was {
		heap.Remove(&s.heap, t.index)
		s.armLocked()
	}
	if t.c != nil {
		select {
		case <-t.c:
			was = true
		default:
		}
	}
	return was
}

// armLocked sets the timerfd to the heap's earliest deadline (disarms it
// when the heap is empty), a raw timerfd_settime(2), where it is not
// already set so.
func (s *service) armLocked() {
	var want int64
	if len(s.heap) > 0 {
		want = max(s.heap[0].when, 1) // a zero value would disarm it
	}
	if want == s.armed {
		return
	}
	var spec unix.ItimerSpec
	if want != 0 {
		spec.Value = unix.NsecToTimespec(want)
	}
	for {
		_, _, e := syscall.RawSyscall6(unix.SYS_TIMERFD_SETTIME, s.fd, unix.TFD_TIMER_ABSTIME, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
		if e != syscall.EINTR {
			break
		}
	}
	s.armed = want
}

// run waits for the timerfd and fires the timers that are due, until the
// service is closed.
func (s *service) run() {
	var buf [8]byte
	read := func(fd uintptr) bool {
		for {
			_, _, e := syscall.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), 8)
			if e != syscall.EINTR {
				return e != syscall.EAGAIN
			}
		}
	}
	for {
		if err := s.rc.Read(read); err != nil {
			return
		}
		s.fire()
	}
}

// fire fires the timers that are due and sets the timerfd to the next.
func (s *service) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakes++
	s.armed = 0 // it expired, or was set again since (then re-armed below)
	now := rawsys.Nanotime()
	var at time.Time
	for len(s.heap) > 0 && s.heap[0].when <= now {
		t := heap.Pop(&s.heap).(*Timer)
		s.fired++
		if t.f != nil {
			go t.f()
			continue
		}
		if at.IsZero() {
			at = time.Now()
		}
		select {
		case t.c <- at:
		default:
		}
	}
	s.armLocked()
}

type timerHeap []*Timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].when < h[j].when }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *timerHeap) Push(x any) {
	t := x.(*Timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
