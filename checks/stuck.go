package checks

import (
	"context"
	"sync"
	"time"
)

// stuckCalls runs calls that can hang in the kernel where no context
// reaches them (statfs of a mount whose NFS server is gone, an NVMe admin
// command to a controller that does not answer, an lvm in D state), each
// on a goroutine of its own, and waits for them until a deadline. A call
// still running at the deadline is stuck: its key is not called again
// until that call returns, as node_exporter's filesystem collector skips
// its "stuck mounts". A stuck item so costs one goroutine, however many
// runs pass, and the other items' answers are kept.
type stuckCalls struct {
	mu sync.Mutex
	// inFlight: the keys whose call has not returned. At the start of a
	// run (a check's runs never overlap) these are the stuck ones.
	inFlight map[string]bool
}

// callAnswer is what became of one key's call.
type callAnswer[T any] struct {
	v   T
	err error
	// stuck: no answer before the deadline, or the call of an earlier run
	// has still not returned (then it was not called again).
	stuck bool
}

// callEach calls f for every key not stuck, each on its own goroutine, and
// waits for their answers until timeout has passed or ctx is done; the
// answers are in the order of keys.
func callEach[T any](ctx context.Context, s *stuckCalls, timeout time.Duration, keys []string, f func(key string) (T, error)) []callAnswer[T] {
	out := make([]callAnswer[T], len(keys))
	type answer struct {
		i   int
		v   T
		err error
	}
	// Buffered for every key: a call that returns after the deadline
	// hands its answer to no one and never blocks.
	answers := make(chan answer, len(keys))
	pending := 0
	s.mu.Lock()
	if s.inFlight == nil {
		s.inFlight = map[string]bool{}
	}
	for i, k := range keys {
		if s.inFlight[k] {
			out[i].stuck = true
			continue
		}
		s.inFlight[k] = true
		pending++
		go func() {
			v, err := f(k)
			s.mu.Lock()
			delete(s.inFlight, k)
			s.mu.Unlock()
			answers <- answer{i, v, err}
		}()
	}
	s.mu.Unlock()
	if pending == 0 {
		return out
	}
	done := make([]bool, len(keys))
	t := time.NewTimer(timeout)
	defer t.Stop()
wait:
	for pending > 0 {
		select {
		case a := <-answers:
			out[a.i].v, out[a.i].err, done[a.i] = a.v, a.err, true
			pending--
		case <-t.C:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	// Answers that came with the deadline count.
	for drained := false; !drained; {
		select {
		case a := <-answers:
			out[a.i].v, out[a.i].err, done[a.i] = a.v, a.err, true
		default:
			drained = true
		}
	}
	for i := range out {
		if !done[i] {
			out[i].stuck = true
		}
	}
	return out
}
