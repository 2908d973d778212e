package kmsg

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openDevice opens the kernel log without blocking (a FIFO or a device
// that would block the open cannot hold up the daemon or its shutdown) and
// refuses what is not a character device: a directory, a regular file or a
// FIFO is never the kernel log.
func openDevice(_ context.Context, path string) (Device, error) {
	return Open(path)
}

// Open opens the kernel log at path without blocking, refusing what is not
// /dev/kmsg (the reader's default Open).
func Open(path string) (Device, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return FromFD(fd, path)
}

// FromFD reads the kernel log from fd, a descriptor another process opened
// (the privileged helper's), read-only and non-blocking; path names it in
// errors. It refuses, and closes, what is not /dev/kmsg, as the open does.
// The Device owns fd.
func FromFD(fd int, path string) (Device, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	if err != nil {
		err = &os.PathError{Op: "stat", Path: path, Err: err}
	} else {
		err = notTheKernelLog(path, &st)
	}
	if err == nil {
		if fl, ferr := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); ferr != nil || fl&unix.O_NONBLOCK == 0 {
			err = fmt.Errorf("%s: the descriptor is not non-blocking (flags %#o, %v)", path, fl, ferr)
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return newKmsgFile(fd, path)
}

// notTheKernelLog says what st, of path, is where it is not the kernel
// log's character device (1:11); nil where it is.
func notTheKernelLog(path string, st *unix.Stat_t) error {
	if typ := st.Mode & unix.S_IFMT; typ != unix.S_IFCHR {
		kind := map[uint32]string{unix.S_IFDIR: "a directory", unix.S_IFREG: "a regular file", unix.S_IFIFO: "a FIFO",
			unix.S_IFSOCK: "a socket", unix.S_IFBLK: "a block device"}[typ]
		if kind == "" {
			kind = fmt.Sprintf("of file type %#o", typ)
		}
		return fmt.Errorf("%s is %s, not a character device (the kernel log is /dev/kmsg)", path, kind)
	}
	if maj, mnr := unix.Major(st.Rdev), unix.Minor(st.Rdev); maj != 1 || mnr != 11 {
		return fmt.Errorf("%s is the character device %d:%d, not the kernel log (/dev/kmsg is 1:11)", path, maj, mnr)
	}
	return nil
}

// CheckDevice says, without opening it, whether path (its links followed)
// is the kernel log's character device, in Open's words where it is not:
// "stat PATH: no such file or directory", "PATH is a regular file, not a
// character device ...", "PATH is the character device 1:3, not the kernel
// log ...". config validate warns with it; Open and FromFD still decide.
func CheckDevice(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return notTheKernelLog(path, &st)
}

// kmsgFile is the kernel log opened without blocking, read one record per
// read(2) as the ABI has it.
//
// Every system call here is a raw one. A system call made the usual way
// (os.File.Read, the unix package) enters the runtime's syscall state,
// which wakes the runtime's monitor thread (sysmon) when it sleeps; sysmon
// then polls every 20 µs for a millisecond. With a kernel line every
// millisecond that was the largest part of the daemon's CPU (perf on a
// flood paced at 1,000 lines/s: sysmon 29 %, waking it 5 %). None of these
// calls blocks (the descriptors are non-blocking, epoll_wait is asked not
// to wait), so the raw form is safe.
//
// Waiting. The device is not in the runtime's poller, which watches every
// descriptor edge-triggered for as long as it is open: each record the
// kernel logs would wake it, waited for or not. It is in an epoll instance
// of our own (ep) only while the reader waits for a record, as a one-shot:
// added (or re-armed) when a wait begins, it wakes the process once, and
// a one-shot that fired wakes nothing more. One that did not fire (a wait
// that its deadline ended) is taken out of ep before a sleep: re-armed with
// no events it would still wake the poller's thread at every record (the
// kernel adds EPOLLERR and EPOLLHUP to every mask, and the kernel log's
// wake-up carries no mask to filter on). The runtime's poller watches ep,
// which also holds the gathering timer. The read deadline is ep's.
//
// Gathering. Every wake-up of the reader costs far more than a record (on
// the VM this was measured on, ~50 µs of CPU for the runtime and the
// kernel to park and wake a thread, against ~3 µs to read and match a
// record), so a log written every millisecond or two would cost a wake-up
// per record or two. The reader keeps an average of the time per record
// between waits (each wait's time since the last one began, over the
// records read meanwhile, at most 4 gathering times, which is also what a
// wait that ended with no record counts as; a moving average over about
// four waits, so one short gap does not start gathering and a sleep that
// finds nothing ends it). While it
// says 1.5 records or more per gathering time, the reader that finds
// nothing more ready does not wait for the next record: it sleeps for the
// gathering time with the device out of ep, and then reads all that came
// meanwhile. Slower records wake it one by one, as before. The first record
// after a quiet spell is read at once; those of a busy spell wait at most
// the gathering time. The sleep is a timerfd, not a Go timer: sysmon sleeps
// until the next Go timer and wakes with it.
//
// The ring buffer and the sleep: a sleep after which more than stormBytes
// are read without a wait (a log written at more than 3 MB/s, ~40,000
// lines of 80 bytes a second: a quarter of a 128 KiB ring buffer, the
// smallest in common use, per sleep) stops gathering for stormCalm; the
// reader then reads as fast as the records come. A storm of more than
// 128 KiB in one gathering time (~13 MB/s, ~160,000 lines a second) can
// overrun the ring buffer during the first sleep that meets it, and during
// one sleep a second while it lasts, where a reader that never sleeps, on a
// free CPU, might have kept up; the records lost are counted by the
// sequence gap, as any overrun.
type kmsgFile struct {
	fd   int
	name string
	ep   *os.File // the epoll instance, in the runtime's poller
	epfd int      // ep's descriptor, for the raw epoll_ctl calls
	erc  syscall.RawConn
	// The wait in progress (a field rather than a closure's captures, so
	// that a wait does not allocate).
	waitFn  func(fd uintptr) bool
	armedFn func(fd uintptr) bool
	begun   bool // waitArmed's wait has begun (begin)
	sought  bool // a Seek since the device was last armed
	waitErr syscall.Errno
	events  [2]unix.EpollEvent
	arm     unix.EpollEvent
	// inEp: the device is in ep; armed: as a one-shot that has not fired.
	inEp, armed bool

	// Gathering (gatherFor); tfd is -1 while it is off.
	tfd    int
	gather time.Duration
	spec   unix.ItimerSpec
	// run counts the records read since the last wait began at waitAt,
	// bytes their bytes; perRecord is the moving average of the time per
	// record; gathered says the last wait was a gathering sleep; calmAt is
	// when gathering may start again after a storm.
	run       int
	bytes     int
	perRecord time.Duration
	waitAt    time.Time
	gathered  bool
	calmAt    time.Time
	waits     int // waits begun, sleeps among them (for tests)
	sleeps    int
	// readCalls and ctlCalls count the read(2) and epoll_ctl(2) calls on
	// the device (for tests).
	readCalls, ctlCalls int
}

const (
	stormBytes = 32 << 10
	stormCalm  = time.Second
)

// newKmsgFile takes over fd, a non-blocking descriptor that epoll can
// watch (the kernel log; a pipe in tests).
func newKmsgFile(fd int, name string) (*kmsgFile, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err = unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := &kmsgFile{fd: fd, name: name, tfd: -1}
	f.arm = unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(fd)}
	// Added and taken out at once: what epoll cannot watch is refused here.
	err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &f.arm)
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, fd, nil)
	}
	if err != nil {
		unix.Close(epfd)
		unix.Close(fd)
		return nil, os.NewSyscallError("epoll_ctl", fmt.Errorf("%s: %w", name, err))
	}
	f.ep, f.epfd = os.NewFile(uintptr(epfd), "epoll"), epfd
	if f.erc, err = f.ep.SyscallConn(); err != nil {
		f.ep.Close()
		unix.Close(fd)
		return nil, err
	}
	f.waitFn, f.armedFn = f.harvest, f.harvestArmed
	return f, nil
}

// gatherFor turns gathering on (d > 0). It fails where no timerfd can be
// made; the file then reads as without it.
func (f *kmsgFile) gatherFor(d time.Duration) error {
	if d <= 0 || f.tfd >= 0 {
		return nil
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return os.NewSyscallError("timerfd_create", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(tfd)}
	if err := unix.EpollCtl(f.epfd, unix.EPOLL_CTL_ADD, tfd, &ev); err != nil {
		unix.Close(tfd)
		return os.NewSyscallError("epoll_ctl", fmt.Errorf("timerfd: %w", err))
	}
	f.tfd, f.gather = tfd, d
	f.spec = unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	f.perRecord = 4 * d // no record seen yet: as slow as it counts
	return nil
}

// harvest takes what ep has to say without waiting: false (wait in the
// poller) when nothing is ready. A timer that expired is read (cleared).
func (f *kmsgFile) harvest(epfd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall6(unix.SYS_EPOLL_PWAIT, epfd, uintptr(unsafe.Pointer(&f.events[0])), uintptr(len(f.events)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			f.waitErr = e // cannot happen for a valid ep; Read returns it
			return true
		}
		for _, ev := range f.events[:n] {
			if int(ev.Fd) == f.fd {
				f.armed = false // a one-shot: it wakes nothing more
			}
			if int(ev.Fd) == f.tfd {
				var b [8]byte
				syscall.RawSyscall(syscall.SYS_READ, uintptr(f.tfd), uintptr(unsafe.Pointer(&b[0])), 8)
			}
		}
		return n > 0
	}
}

// epollCtl is epoll_ctl on ep, a raw system call.
func (f *kmsgFile) epollCtl(op int, ev *unix.EpollEvent) syscall.Errno {
	f.ctlCalls++
	_, _, e := syscall.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(f.epfd), uintptr(op), uintptr(f.fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return e
}

// setTimer starts the timerfd with spec (a zero spec stops it), a raw
// system call.
func (f *kmsgFile) setTimer(spec *unix.ItimerSpec) syscall.Errno {
	_, _, e := syscall.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(f.tfd), 0, uintptr(unsafe.Pointer(spec)), 0, 0, 0)
	return e
}

// wait waits for the next record, or sleeps for the gathering time (see
// kmsgFile), or until the read deadline.
func (f *kmsgFile) wait() error {
	f.begin()
	return f.park()
}

// waitArmed is Read's wait while the device is still in ep as a one-shot
// that has not fired (a wait that its deadline ended: the harvest of each
// wait disarms it when it sees the event). Nothing can be ready to read
// unless a record came since and fired it, which the harvest tells: no
// read(2) that would fail with EAGAIN is made, nor an epoll_ctl(2) that
// would re-arm what is armed. A harvest that finds the event returns at
// once, as a read that found the record would have (no wait begins); one
// that finds nothing begins the wait as wait does, and parks in the
// poller, or, when the wait is to be a gathering sleep, sleeps (park).
func (f *kmsgFile) waitArmed() error {
	f.begun = false
	err := f.erc.Read(f.armedFn)
	if err == nil && f.waitErr != 0 {
		err, f.waitErr = &os.PathError{Op: "wait", Path: f.name, Err: f.waitErr}, 0
	}
	if err == nil && f.begun && f.gathered {
		return f.park()
	}
	return err
}

// harvestArmed is waitArmed's callback: the harvest, and the wait begun the
// first time it finds nothing (true then when the wait is a sleep).
func (f *kmsgFile) harvestArmed(epfd uintptr) bool {
	if f.harvest(epfd) {
		return true
	}
	if !f.begun {
		f.begun = true
		f.begin()
		return f.gathered
	}
	return false
}

// begin counts a wait that begins and decides whether it is a gathering
// sleep (gathered).
func (f *kmsgFile) begin() {
	f.waits++
	if f.tfd >= 0 {
		now := time.Now()
		// A wait that ended with no record (its deadline, a sleep that
		// found nothing) counts as the slowest.
		per := 4 * f.gather
		if f.run > 0 {
			per = min(now.Sub(f.waitAt)/time.Duration(f.run), per)
		}
		f.perRecord += (per - f.perRecord) / 4
		f.run, f.bytes, f.waitAt = 0, 0, now
		// 1.5 records or more per gathering time.
		f.gathered = 3*f.perRecord <= 2*f.gather && !now.Before(f.calmAt)
	}
}

// park arms the device in ep and waits in the poller, or, for a gathering
// sleep, takes it out of ep and sleeps on the timer; until the read
// deadline at the latest.
func (f *kmsgFile) park() error {
	var e syscall.Errno
	switch {
	case f.gathered:
		f.sleeps++
		if f.armed {
			// A wait that its deadline ended: out of ep, or every
			// record would wake the poller's thread during the sleep.
			if e = f.epollCtl(unix.EPOLL_CTL_DEL, nil); e == 0 {
				f.inEp, f.armed = false, false
			}
		}
		if e == 0 {
			e = f.setTimer(&f.spec)
		}
	case f.inEp:
		e = f.epollCtl(unix.EPOLL_CTL_MOD, &f.arm)
	default:
		e = f.epollCtl(unix.EPOLL_CTL_ADD, &f.arm)
	}
	if e != 0 {
		return &os.PathError{Op: "wait", Path: f.name, Err: e}
	}
	if !f.gathered {
		f.inEp, f.armed, f.sought = true, true, false
	}
	err := f.erc.Read(f.waitFn)
	if err != nil && f.gathered {
		// The deadline passed or the file closed during a sleep: it is
		// not taken up again.
		f.setTimer(&unix.ItimerSpec{})
		f.gathered = false
	}
	if err == nil && f.waitErr != 0 {
		err, f.waitErr = &os.PathError{Op: "wait", Path: f.name, Err: f.waitErr}, 0
	}
	return err
}

// Read reads one record (EPIPE after an overrun, like the device). With
// none ready it waits (see kmsgFile) until one is or the read deadline
// passes.
func (f *kmsgFile) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if f.armed && !f.sought {
			// Nothing is ready unless a record fired the one-shot
			// (waitArmed); a seek may have made a record readable.
			if err := f.waitArmed(); err != nil {
				return 0, err
			}
			continue
		}
		f.readCalls++
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(f.fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if err := f.wait(); err != nil {
				return 0, err
			}
			continue
		}
		if f.tfd >= 0 {
			f.run++
			if f.bytes += int(r); f.gathered && f.bytes > stormBytes {
				f.calmAt, f.gathered = time.Now().Add(stormCalm), false
			}
		}
		if e != 0 {
			return 0, &os.PathError{Op: "read", Path: f.name, Err: e}
		}
		return int(r), nil
	}
}

// waitsBegun counts the reads that found no record ready and waited
// (waitCounter).
func (f *kmsgFile) waitsBegun() int { return f.waits }

// Seek moves to the start or the end of the log (the ABI's SEEK_SET,
// SEEK_END and SEEK_DATA).
func (f *kmsgFile) Seek(offset int64, whence int) (int64, error) {
	off, err := unix.Seek(f.fd, offset, whence)
	if err != nil {
		return 0, &os.PathError{Op: "seek", Path: f.name, Err: err}
	}
	// What the seek made readable fires no one-shot: read first.
	f.sought = true
	return off, nil
}

// SetReadDeadline bounds the waits of Read; safe to call from another
// goroutine while Read waits.
func (f *kmsgFile) SetReadDeadline(t time.Time) error { return f.ep.SetReadDeadline(t) }

// Close closes the device, the epoll instance and the timer (not while a
// Read runs: the reader closes the file it reads, when it is done). A
// second Close closes nothing and returns os.ErrClosed.
func (f *kmsgFile) Close() error {
	if f.fd < 0 {
		return os.ErrClosed
	}
	err := f.ep.Close()
	if f.tfd >= 0 {
		unix.Close(f.tfd)
		f.tfd = -1
	}
	if e := unix.Close(f.fd); e != nil && err == nil {
		err = &os.PathError{Op: "close", Path: f.name, Err: e}
	}
	f.fd = -1
	return err
}
