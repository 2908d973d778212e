package kmsg

import (
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
	r, w := os.NewFile(uintptr(p[0]), "pipe-r"), os.NewFile(uintptr(p[1]), "pipe-w")
	kf, err := newKmsgFile(r)
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
// device (the reader logs it and tells EPIPE by errors.Is).
func TestKmsgFileReadError(t *testing.T) {
	d, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kf, err := newKmsgFile(d)
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	_, err = kf.Read(make([]byte, 16))
	var pe *os.PathError
	if !errors.As(err, &pe) || !errors.Is(err, syscall.EISDIR) || pe.Path != d.Name() {
		t.Fatalf("Read of a directory = %v, want EISDIR naming %s", err, d.Name())
	}
}
