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
	"io"
	"sync"
	"sync/atomic"
	"time"
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

	mu    sync.Mutex
	queue []entry
	size  int
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
	go s.run()
	return s
}

// Write queues a copy of p, or drops it (counted) when the queue holds
// maxBytes already. It never blocks on w and never fails.
func (s *Sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	if s.closed || s.size+len(p) > s.max {
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
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return len(p), nil
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
		s.mu.Unlock()
		// Blocks while the reader of w does not read; the loops go on.
		if e.line == nil {
			if s.Note != nil {
				s.Note(e.dropped)
			}
			continue
		}
		s.w.Write(e.line)
		s.mu.Lock()
		s.size -= len(e.line)
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
