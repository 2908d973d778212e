package backoff

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// A run says each kind (errno, wrapped or not) once, waits as its Backoff
// does, and Worked ends it: the next run says every kind again.
func TestFailuresSayEachKindOncePerRun(t *testing.T) {
	f := Failures{Backoff: Backoff{Min: 4 * time.Millisecond, Max: 16 * time.Millisecond}}
	emfile := fmt.Errorf("accept: %w", syscall.EMFILE)
	var firsts []bool
	var waits []time.Duration
	for _, err := range []error{emfile, syscall.EMFILE, syscall.ENOBUFS, errors.New("other"), emfile, errors.New("other")} {
		w, first := f.Failed(err)
		firsts, waits = append(firsts, first), append(waits, w)
	}
	if want := []bool{true, false, true, true, false, false}; fmt.Sprint(firsts) != fmt.Sprint(want) {
		t.Errorf("first of its kind: %v, want %v", firsts, want)
	}
	for i, w := range waits {
		step := min(4*time.Millisecond<<i, 16*time.Millisecond)
		if w < step/2 || w > step {
			t.Errorf("wait %d = %v, want in [%v, %v]", i, w, step/2, step)
		}
	}
	if n := f.Worked(); n != 6 {
		t.Errorf("Worked = %d, want the run's 6", n)
	}
	if n := f.Worked(); n != 0 {
		t.Errorf("Worked again = %d, want 0", n)
	}
	if w, first := f.Failed(emfile); !first || w > 4*time.Millisecond {
		t.Errorf("after Worked: %v, first %v; want a new run from Min", w, first)
	}
}
