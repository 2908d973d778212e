package report

import (
	"errors"
	"testing"
	"time"
)

// A write's end passes its hooks the values that write held, not those of
// a later encoding; an earlier write told after a later one passes nothing
// (its values are older than what is on disk); Save tells its own end.
func TestWriteEndedPassesTheValuesOfThatWrite(t *testing.T) {
	s := NewStore("b")
	v := 1
	s.Keep("k", func() any { return v })
	var got []any
	var errs []error
	s.OnWritten("k", func(x any, err error) { got = append(got, x); errs = append(errs, err) })
	_, g1, err := s.EncodeWrite(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	v = 2
	_, g2, _ := s.EncodeWrite(time.Now())
	v = 3
	fail := errors.New("read-only file system")
	s.WriteEnded(g2, fail)
	s.WriteEnded(g1, nil)
	if len(got) != 1 || got[0] != 2 || errs[0] != fail {
		t.Fatalf("told %v %v; want the second write's value 2 with its error", got, errs)
	}
	if s.WritesReported() {
		t.Error("a store no writer reports says its writes are told")
	}
	if err := s.Save(t.TempDir(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if !s.WritesReported() || len(got) != 2 || got[1] != 3 || errs[1] != nil {
		t.Errorf("after Save: reported %v, told %v %v; want true and value 3 written", s.WritesReported(), got, errs)
	}
}
