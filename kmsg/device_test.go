package kmsg

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// kmsgFile reads what is ready at once, one read(2) per Read; with nothing
// ready it waits in the poller until the read deadline; the end of the
// file is a read of 0; an error carries the path. Tested on a pipe opened
// without blocking (a character device other than /dev/kmsg is refused
// by openDevice; the real device is read in ./tests).
func TestKmsgFileReads(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	w := os.NewFile(uintptr(p[1]), "pipe-w")
	kf, err := newKmsgFile(p[0], "pipe-r")
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	buf := make([]byte, BufSize)

	w.Write([]byte("6,1,1,-;one\n"))
	kf.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := kf.Read(buf); err != nil || string(buf[:n]) != "6,1,1,-;one\n" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}

	// Nothing ready: the read waits for the deadline, in the poller.
	kf.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with nothing ready = %v, want the deadline exceeded", err)
	}
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Errorf("Read with nothing ready returned after %s, before its deadline", waited)
	}

	// A record that comes while the read waits ends the wait.
	kf.SetReadDeadline(time.Now().Add(10 * time.Second))
	go func() {
		time.Sleep(20 * time.Millisecond)
		w.Write([]byte("6,2,2,-;two\n"))
	}()
	if n, err := kf.Read(buf); err != nil || string(buf[:n]) != "6,2,2,-;two\n" {
		t.Fatalf("Read while waiting = %q, %v", buf[:n], err)
	}

	w.Close()
	if n, err := kf.Read(buf); n != 0 || err != nil {
		t.Fatalf("Read at the end = %d, %v; want 0, nil (the reader calls that the end of the file)", n, err)
	}
	if n, err := kf.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v", n, err)
	}
}

// A read error is the device's errno inside a *os.PathError naming the
// device (the reader logs it and tells EPIPE by errors.Is): here the write
// end of a pipe, which epoll watches and read(2) refuses.
func TestKmsgFileReadError(t *testing.T) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	kf, err := newKmsgFile(p[1], "pipe-w")
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	_, err = kf.Read(make([]byte, 16))
	var pe *os.PathError
	if !errors.As(err, &pe) || !errors.Is(err, syscall.EBADF) || pe.Path != "pipe-w" {
		t.Fatalf("Read of a pipe's write end = %v, want EBADF naming pipe-w", err)
	}
}

// newPipeFile returns a kmsgFile on the read end of a non-blocking pipe
// (each Read of an 8-byte buffer takes one "record" of 8 bytes) and the
// write end.
func newPipeFile(t *testing.T, gather time.Duration) (*kmsgFile, *os.File) {
	t.Helper()
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	w := os.NewFile(uintptr(p[1]), "pipe-w")
	kf, err := newKmsgFile(p[0], "pipe-r")
	if err != nil {
		t.Fatal(err)
	}
	if err := kf.gatherFor(gather); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kf.Close(); w.Close() })
	return kf, w
}

// readRecords reads n 8-byte records, each within 10 s.
func readRecords(t *testing.T, kf *kmsgFile, n int) {
	t.Helper()
	buf := make([]byte, 8)
	for i := range n {
		kf.SetReadDeadline(time.Now().Add(10 * time.Second))
		if k, err := kf.Read(buf); err != nil || k != 8 {
			t.Fatalf("record %d: Read = %d, %v", i, k, err)
		}
	}
}

// Records that come fast are gathered: the reader sleeps for the
// gathering time instead of waking for each; records that come slower
// than 1.5 per gathering time wake it one by one, with no sleep between.
func TestKmsgFileGathers(t *testing.T) {
	const gather = 50 * time.Millisecond
	kf, w := newPipeFile(t, gather)
	rec := []byte("record.\n")

	// 60 records 2 ms apart (25 per gathering time): without gathering,
	// about a wait per record.
	go func() {
		for range 60 {
			w.Write(rec)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	readRecords(t, kf, 60)
	if kf.sleeps == 0 || kf.waits > 20 {
		t.Fatalf("60 records 2 ms apart: %d waits, %d of them gathering sleeps; want a few waits, mostly sleeps", kf.waits, kf.sleeps)
	}

	// 5 records 150 ms apart: a wait each, no sleep (one would find
	// nothing and cost a wake-up of its own).
	waits, sleeps := kf.waits, kf.sleeps
	go func() {
		for range 5 {
			time.Sleep(150 * time.Millisecond)
			w.Write(rec)
		}
	}()
	readRecords(t, kf, 5)
	// The sleep after the fast records' last one may come first: it
	// finds nothing, and the wait in the poller follows.
	if got := kf.sleeps - sleeps; got > 1 {
		t.Errorf("5 records 150 ms apart: %d gathering sleeps", got)
	}
	if got := kf.waits - waits; got < 5 || got > 6 {
		t.Errorf("5 records 150 ms apart: %d waits, want one a record", got)
	}
}

// A sleep after which more than stormRecords records are ready (a log
// that could fill the ring buffer while the reader sleeps) stops
// gathering for stormCalm; a read deadline ends a sleep.
func TestKmsgFileStopsGatheringInAStorm(t *testing.T) {
	const gather = 500 * time.Millisecond
	kf, w := newPipeFile(t, gather)
	buf := make([]byte, 8)
	rec := []byte("record.\n")

	// A wait, then 3 records right after it: fast enough to gather.
	kf.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with nothing ready = %v", err)
	}
	for range 3 {
		w.Write(rec)
	}
	readRecords(t, kf, 3)

	// The next wait is a sleep, and a deadline ends it early.
	kf.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read during a sleep = %v", err)
	}
	if kf.sleeps != 1 {
		t.Fatalf("%d gathering sleeps, want 1", kf.sleeps)
	}
	if waited := time.Since(start); waited > gather*3/4 {
		t.Errorf("a read deadline 30 ms away ended a %s sleep after %s", gather, waited)
	}

	// Again fast: 3 records, then a sleep during which 600 come.
	for range 3 {
		w.Write(rec)
	}
	readRecords(t, kf, 3)
	go func() {
		time.Sleep(gather / 5)
		w.Write(bytes.Repeat(rec, stormRecords+100))
	}()
	start = time.Now()
	readRecords(t, kf, stormRecords+100)
	if slept := time.Since(start); slept < gather*3/4 {
		// The first wait ended by its deadline left the device armed:
		// the sleep must not end at the records that come meanwhile.
		t.Errorf("the records came %s into a %s sleep and were read after %s", gather/5, gather, slept)
	}
	if kf.sleeps != 2 || kf.calmAt.IsZero() {
		t.Fatalf("%d gathering sleeps (want 2), calm until %v (want set)", kf.sleeps, kf.calmAt)
	}
	// Calm: the next wait is in the poller although the records came fast.
	kf.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with nothing ready = %v", err)
	}
	if kf.sleeps != 2 {
		t.Fatalf("a gathering sleep right after a storm")
	}
}
