package logsink

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// A writer that does not take lines (a pipe no one reads: the journal's
// stream while journald is stopped) holds up no Write; what does not fit is
// dropped and counted; once the writer takes lines again the queued ones
// come, in order, then one line with the number dropped.
func TestWriteNeverBlocksAndDropsAreSaid(t *testing.T) {
	r, w := io.Pipe()
	s := New(w, 100)
	s.Note = func(n uint64) { fmt.Fprintf(w, "dropped %d\n", n) }
	// The writer goroutine takes line 0 and blocks in the pipe; 10 bytes
	// each, ten more fit, the other 9 are dropped.
	for i := range 20 {
		s.Write(fmt.Appendf(nil, "line %03d\n", i)) // returns at once
	}
	if d := s.Dropped(); d < 9 || d > 10 {
		t.Fatalf("dropped %d of 20 lines of 10 bytes with 100 bytes of room; want 9 or 10 (the first one may be queued or being written)", d)
	}
	sc := bufio.NewScanner(r)
	var got []string
	for sc.Scan() {
		got = append(got, sc.Text())
		if strings.HasPrefix(sc.Text(), "dropped") {
			break
		}
	}
	want := fmt.Sprintf("dropped %d", s.Dropped())
	if got[len(got)-1] != want || len(got) != 20-int(s.Dropped())+1 {
		t.Fatalf("read %q; want %d lines in order, then %q", got, 20-s.Dropped(), want)
	}
	for i, l := range got[:len(got)-1] {
		if l != fmt.Sprintf("line %03d", i) {
			t.Fatalf("line %d: %q; want the lines in the order written: %q", i, l, got)
		}
	}
	// Close waits for the queue to be written, and no longer than it is told.
	s.Write([]byte("last\n"))
	go func() { sc.Scan() }()
	if !s.Close(10 * time.Second) {
		t.Fatal("Close did not see the queue written")
	}
	s2 := New(w, 100) // no reader now
	s2.Write([]byte("never read\n"))
	if s2.Close(10 * time.Millisecond) {
		t.Fatal("Close reported a queue written that a writer never took")
	}
	r.Close()
}

// A line longer than the whole queue, written while nothing is queued, is
// written, not dropped as one the journal did not take (the bound is the
// queue's size plus that one line).
func TestALineLongerThanTheQueueIsWritten(t *testing.T) {
	r, w := io.Pipe()
	s := New(w, 100)
	s.Note = func(n uint64) { fmt.Fprintf(w, "dropped %d\n", n) }
	long := strings.Repeat("x", 300) + "\n"
	s.Write([]byte(long))
	// Close writes what is queued (or the note of a drop) and ends.
	closed := make(chan bool)
	go func() { closed <- s.Close(10 * time.Second) }()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != long || s.Dropped() != 0 {
		t.Fatalf("a line of %d bytes into a queue of 100: read %d bytes %.20q (%v), %d dropped; want the line, none dropped", len(long), len(line), line, err, s.Dropped())
	}
	if !<-closed {
		t.Fatal("Close did not see the queue written")
	}
	r.Close()
}
