package backoff

import (
	"errors"
	"syscall"
	"time"
)

// Failures is a run of failures of one operation that is tried again
// (an accept out of descriptors): the wait before each next try, and
// whether the failure's kind (its errno, else its error) is new in this
// run, for a log line once per kind. Failures{Backoff: Backoff{...}} is
// ready to use; it is not safe for concurrent use.
type Failures struct {
	Backoff
	n    int
	said map[string]bool
}

// Failed records a failure: the wait before the next try, and whether
// err's kind is the first of its kind in this run.
func (f *Failures) Failed(err error) (wait time.Duration, first bool) {
	f.n++
	wait = f.Next()
	k := kind(err)
	if f.said[k] {
		return wait, false
	}
	if f.said == nil {
		f.said = map[string]bool{}
	}
	f.said[k] = true
	return wait, true
}

// Worked ends the run (the operation worked): how many failed in it, 0
// where none did.
func (f *Failures) Worked() int {
	n := f.n
	if n > 0 {
		f.n, f.said = 0, nil
		f.Reset()
	}
	return n
}

// kind is what a run's failures are said once per: the errno, else the
// error.
func kind(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
