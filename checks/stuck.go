package checks

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// StuckCalls keeps the calls that can hang (stuckCalls), one record per
// kind of call, for every check of a daemon: the checks built again on a
// reload (Runner.Apply) or a re-detect of the node's role or GPU (a new
// Runner), and the three NVMe checks that read the same drives, all see
// the call still running on a drive or a mount, and do not start another.
// The daemon creates one where it builds the Env (daemon.Assemble); an Env
// copied for a reload keeps the pointer. The zero value is ready to use.
type StuckCalls struct {
	statfs stuckCalls[unix.Statfs_t]
	lvm    stuckCalls[lvmRead]
	nvme   stuckCalls[NVMeHealth]
}

// stuckCalls returns env's record, or, for an Env built without one (by a
// test, by hand), a new record of the caller's own.
func (e *Env) stuckCalls() *StuckCalls {
	if e.Stuck != nil {
		return e.Stuck
	}
	return &StuckCalls{}
}

// stuckCalls runs calls that can hang in the kernel where no context
// reaches them (statfs of a mount whose NFS server is gone, an NVMe admin
// command to a controller that does not answer, an lvm in D state), each
// on a goroutine of its own, and waits for them until a deadline. A call
// still running at some caller's deadline is stuck: its key is not called
// again until that call returns, as node_exporter's filesystem collector
// skips its "stuck mounts". A stuck item so costs one goroutine, however
// many runs, reloads and checks ask for it, and the other items' answers
// are kept. A caller that finds its key's call running and not (yet)
// stuck (another check asking the same drive at the same time, a check's
// old instance that a reload stopped) waits for that call's answer, within
// its own deadline, rather than calling again.
type stuckCalls[T any] struct {
	mu sync.Mutex
	// inFlight: the keys whose call has not returned.
	inFlight map[string]*pendingCall[T]
}

// pendingCall is one running call; v and err are set before done is closed.
type pendingCall[T any] struct {
	done chan struct{}
	v    T
	err  error
	// stuck: a caller's deadline passed before the call returned (guarded
	// by stuckCalls.mu).
	stuck bool
}

// callAnswer is what became of one key's call.
type callAnswer[T any] struct {
	v   T
	err error
	// stuck: no answer before the deadline, or the call of an earlier run
	// has still not returned (then it was not called again).
	stuck bool
}

// callEach calls f for every key that has no call running, each on its own
// goroutine, joins the calls running and not stuck, and waits for their
// answers until timeout has passed or ctx is done; the answers are in the
// order of keys. A call that does not answer by the timeout is marked
// stuck; one whose wait only ctx ended is not (a check stopped by a reload
// says nothing of the drive).
func callEach[T any](ctx context.Context, s *stuckCalls[T], timeout time.Duration, keys []string, f func(key string) (T, error)) []callAnswer[T] {
	out := make([]callAnswer[T], len(keys))
	calls := make([]*pendingCall[T], len(keys))
	s.mu.Lock()
	if s.inFlight == nil {
		s.inFlight = map[string]*pendingCall[T]{}
	}
	for i, k := range keys {
		c := s.inFlight[k]
		switch {
		case c != nil && c.stuck:
			out[i].stuck = true
			continue
		case c == nil:
			c = &pendingCall[T]{done: make(chan struct{})}
			s.inFlight[k] = c
			go func() {
				v, err := f(k)
				s.mu.Lock()
				c.v, c.err = v, err
				delete(s.inFlight, k)
				s.mu.Unlock()
				close(c.done)
			}()
		}
		calls[i] = c
	}
	s.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	expired, cancelled := false, false
	for i, c := range calls {
		if c == nil {
			continue
		}
		if !expired && !cancelled {
			select {
			case <-c.done:
			case <-t.C:
				expired = true
			case <-ctx.Done():
				cancelled = true
			}
		}
		// An answer that came with the deadline counts.
		select {
		case <-c.done:
			out[i].v, out[i].err = c.v, c.err
			continue
		default:
		}
		out[i].stuck = true
		if expired {
			s.mu.Lock()
			c.stuck = true
			s.mu.Unlock()
		}
	}
	return out
}
