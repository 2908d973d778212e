// Package logsink puts a bounded buffer in front of the daemon's stderr, so
// that logging never stops the work. Under its unit, stderr is a stream
// socket to systemd-journald; while journald does not read it (stopped,
// stuck on a full or slow disk) the socket's buffer fills and a write to it
// blocks. Written directly, the first loop to log then blocked (holding the
// handler's lock, and the condition store's notify lock behind it), every
// other loop behind it, and the watchdog's ping with them (README: "Under
// systemd"). Through a Sink a line is queued and written by one goroutine of
// its own; a line that finds the queue full is dropped and counted, and the
// writer says how many were dropped where they were, after the lines queued
// before them.
package logsink

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultBytes bounds the lines a Sink holds: about a thousand of the
// daemon's lines (a few hundred bytes each).
const DefaultBytes = 256 << 10

// Sink is an io.Writer that never blocks: each Write is one log record
// (slog's handlers write a record at a time), queued whole or dropped
// whole.
type Sink struct {
	w   io.Writer
	max int
	// Note, if set, writes the line that says n lines were dropped, to w
	// (it is called on the Sink's writer goroutine, the only one that
	// writes to w). Set it before the first Write.
	Note func(n uint64)

	// send, where w is a socket (journald's stream), writes what the
	// socket takes now, never waiting (MSG_DONTWAIT): a line that finds
	// nothing queued and nothing being written goes out in Write itself,
	// so that it is in the journal before a crash that may follow at once
	// (the runtime writes its report to fd 2 itself and exits; with
	// GOMAXPROCS=1 the writer goroutine would not have run).
	send func(p []byte) (int, error)

	mu    sync.Mutex
	queue []entry
	size  int
	// writing: the writer goroutine is writing an entry it took.
	writing bool
	// pending: dropped since the last note queued or written.
	pending uint64
	closed  bool
	wake    chan struct{}
	done    chan struct{}

	dropped atomic.Uint64
}

// entry is a line, or (line nil) the note of dropped lines, queued where
// the drops were: after the lines queued before them.
type entry struct {
	line    []byte
	dropped uint64
}

// New starts a Sink writing to w, holding at most maxBytes of lines.
func New(w io.Writer, maxBytes int) *Sink {
	s := &Sink{w: w, max: maxBytes, wake: make(chan struct{}, 1), done: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		s.send = socketSend(f)
	}
	go s.run()
	return s
}

// socketSend returns a write to f that never waits, or nil where f is no
// socket (a pipe, a terminal, a file: their lines go through the queue).
func socketSend(f *os.File) func(p []byte) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	var typ int
	var serr error
	if err := rc.Control(func(fd uintptr) { typ, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE) }); err != nil || serr != nil || typ != unix.SOCK_STREAM {
		return nil
	}
	return func(p []byte) (n int, err error) {
		cerr := rc.Control(func(fd uintptr) {
			for n < len(p) {
				var m int
				m, err = unix.SendmsgN(int(fd), p[n:], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
				if errors.Is(err, unix.EINTR) {
					continue
				}
				if err != nil {
					return
				}
				n += m
			}
		})
		if cerr != nil {
			err = cerr
		}
		return n, err
	}
}

// Write queues a copy of p, or drops it (counted) when the queue holds
// maxBytes already (a line longer than maxBytes is queued when the queue is
// empty). Where w is a socket and nothing is queued, it first writes what
// the socket takes now. It never blocks on w and never fails.
func (s *Sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	if !s.closed && s.send != nil && !s.writing && len(s.queue) == 0 && s.pending == 0 {
		// Under the lock: the writer goroutine does not write meanwhile,
		// and a line logged after this one comes after it.
		n, _ := s.send(p)
		if n == len(p) {
			s.mu.Unlock()
			return len(p), nil
		}
		// The rest (the socket full, or an error: the writer's write
		// meets it as before) is queued, whatever its size.
		rest := append([]byte(nil), p[n:]...)
		s.queue = append(s.queue, entry{line: rest})
		s.size += len(rest)
		s.mu.Unlock()
		s.signal()
		return len(p), nil
	}
	if s.closed || (s.size > 0 && s.size+len(p) > s.max) {
		s.pending++
		s.mu.Unlock()
		s.dropped.Add(1)
		return len(p), nil
	}
	if s.pending > 0 {
		s.queue = append(s.queue, entry{dropped: s.pending})
		s.pending = 0
	}
	s.queue = append(s.queue, entry{line: append([]byte(nil), p...)})
	s.size += len(p)
	s.mu.Unlock()
	s.signal()
	return len(p), nil
}

// signal wakes the writer goroutine.
func (s *Sink) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Dropped is how many lines were dropped since New.
func (s *Sink) Dropped() uint64 { return s.dropped.Load() }

func (s *Sink) run() {
	defer close(s.done)
	for {
		s.mu.Lock()
		if len(s.queue) == 0 && s.pending > 0 {
			// Dropped lines with none queued after them: said now.
			s.queue = append(s.queue, entry{dropped: s.pending})
			s.pending = 0
		}
		if len(s.queue) == 0 {
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			<-s.wake
			continue
		}
		e := s.queue[0]
		s.queue[0] = entry{}
		s.queue = s.queue[1:]
		s.writing = true
		s.mu.Unlock()
		// Blocks while the reader of w does not read; the loops go on.
		if e.line == nil {
			if s.Note != nil {
				s.Note(e.dropped)
			}
		} else {
			s.w.Write(e.line)
		}
		s.mu.Lock()
		s.size -= len(e.line)
		s.writing = false
		s.mu.Unlock()
	}
}

// Close writes what is queued, waiting at most wait for w to take it, and
// reports whether it did; a Write after Close is dropped.
func (s *Sink) Close(wait time.Duration) bool {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-s.done:
		return true
	case <-t.C:
		return false
	}
}
