// Command kmsgfloor measures what reading the kernel log costs a minimal
// reader per record, without the daemon's work: the floor under the
// daemon's figure at low rates, where every record is a wake-up of its own
// (README, Cost: "Kernel log reader").
//
//	kmsgfloor [-n N] MODE
//
// reads N records (default 2,000, at least 2) written after it starts, one
// GOMAXPROCS, and prints the CPU of all its threads (schedstat) from the
// first record to the last, per record, and how often its threads were
// switched in. It reads /dev/kmsg (CAP_SYSLOG, or root) from its end: start
// it first, then write at least N records with the harness, paced:
//
//	kmsgflood -n 2000 -rate 100 -match-file match.txt -no-ring-info -o /dev/null
//
// MODE is how it waits for the next record:
//
//	block  a blocking read(2) through the syscall package (the runtime's
//	       syscall state: sysmon wakes at each record)
//	poll   the device non-blocking in the runtime's poller, read by raw
//	       read(2) calls (os.File.SyscallConn)
//	epoll  the daemon's scheme (kmsg.kmsgFile): the device in an epoll
//	       instance of its own, re-armed as a one-shot before each wait, that
//	       instance in the runtime's poller
//	sleep  no kernel log: a 100 ms sleep stands for each record, so the
//	       figure is what one timer wake-up of a Go program costs on this
//	       machine (README, Cost: "Memory, idle and scrape")
//
// c/floor.c is the same reader in C, blocking in read(2): the cost of the
// kernel's side and a thread's wake-up alone.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	n := flag.Int("n", 2000, "records to read (at least 2)")
	flag.Parse()
	if flag.NArg() != 1 || *n < 2 {
		fmt.Fprintln(os.Stderr, "usage: kmsgfloor [-n N] block|poll|epoll|sleep")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(1)
	var next func([]byte) (int, error)
	var err error
	switch flag.Arg(0) {
	case "block":
		next, err = blocking()
	case "poll":
		next, err = polled()
	case "epoll":
		next, err = ownEpoll()
	case "sleep":
		next = func([]byte) (int, error) { time.Sleep(100 * time.Millisecond); return 0, nil }
	default:
		err = fmt.Errorf("unknown mode %q", flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kmsgfloor:", err)
		os.Exit(1)
	}
	b := make([]byte, 8192)
	matched := 0
	var cpu0, sw0 int64
	for i := 0; i < *n; i++ {
		r, err := next(b)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kmsgfloor:", err)
			os.Exit(1)
		}
		if i == 0 {
			cpu0, sw0 = schedstat()
		}
		if bytes.Contains(b[:r], []byte("Buffer I/O error")) {
			matched++
		}
	}
	cpu, sw := schedstat()
	recs := int64(*n - 1)
	fmt.Printf("%s: %d records after the first, %.1f µs of CPU and %.2f switches-in per record (%d matched)\n",
		flag.Arg(0), recs, float64(cpu-cpu0)/1e3/float64(recs), float64(sw-sw0)/float64(recs), matched)
}

// schedstat sums the CPU time (ns) and the times switched in of the
// process's threads.
func schedstat() (cpu, switches int64) {
	ts, _ := filepath.Glob("/proc/self/task/*/schedstat")
	for _, t := range ts {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		c, _ := strconv.ParseInt(f[0], 10, 64)
		s, _ := strconv.ParseInt(f[2], 10, 64)
		cpu, switches = cpu+c, switches+s
	}
	return cpu, switches
}

func open(flags int) (int, error) {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_CLOEXEC|flags, 0)
	if err != nil {
		return -1, err
	}
	_, err = unix.Seek(fd, 0, 2) // SEEK_END: records written from now on
	return fd, err
}

// retry says whether a read's error is one to read again after: EINTR, and
// EPIPE, which the kernel log returns once after its reader was overrun.
func retry(e error) bool { return e == syscall.EINTR || e == syscall.EPIPE }

func blocking() (func([]byte) (int, error), error) {
	fd, err := open(0)
	return func(b []byte) (int, error) {
		for {
			r, err := syscall.Read(fd, b)
			if err == nil || !retry(err) {
				return r, err
			}
		}
	}, err
}

func rawRead(fd uintptr, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}

func polled() (func([]byte) (int, error), error) {
	fd, err := open(unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	rc, err := os.NewFile(uintptr(fd), "/dev/kmsg").SyscallConn()
	return func(b []byte) (int, error) {
		var r int
		var e syscall.Errno
		err := rc.Read(func(fd uintptr) bool {
			for r, e = rawRead(fd, b); retry(e); r, e = rawRead(fd, b) {
			}
			return e != syscall.EAGAIN
		})
		if err == nil && e != 0 {
			err = e
		}
		return r, err
	}, err
}

func ownEpoll() (func([]byte) (int, error), error) {
	fd, err := open(unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		return nil, err
	}
	rc, err := os.NewFile(uintptr(epfd), "epoll").SyscallConn()
	if err != nil {
		return nil, err
	}
	arm := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(fd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &arm); err != nil {
		return nil, err
	}
	var evs [2]unix.EpollEvent
	harvest := func(ep uintptr) bool {
		n, _, _ := syscall.RawSyscall6(unix.SYS_EPOLL_PWAIT, ep, uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
		return int(n) > 0
	}
	armed := true
	return func(b []byte) (int, error) {
		for {
			r, e := rawRead(uintptr(fd), b)
			switch {
			case e == 0:
				return r, nil
			case retry(e):
				continue
			case e != syscall.EAGAIN:
				return 0, e
			}
			if !armed {
				if _, _, e := syscall.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), unix.EPOLL_CTL_MOD, uintptr(fd), uintptr(unsafe.Pointer(&arm)), 0, 0); e != 0 {
					return 0, e
				}
			}
			if err := rc.Read(harvest); err != nil {
				return 0, err
			}
			armed = false
		}
	}, nil
}
