package kmsg

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// kmsgFile reads what is ready at once, one read(2) per Read; with nothing
// ready it waits in the poller until the read deadline; the end of the
// file is a read of 0; an error carries the path. Tested on a pipe opened
// without blocking (a character device other than /dev/kmsg is refused
// by openDevice; the real device is read in ./tests).
func TestKmsgFileReads(t *testing.T) {
	kf, w := newPipeFile(t, 0)
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

// A quiet log costs one system call per read timeout. After a wait that its
// deadline ended, the device is still in the epoll instance as an armed
// one-shot that has not fired (the wait's harvest would have seen it), so
// nothing can be ready: the next Read neither reads the device (a read(2)
// that would fail with EAGAIN) nor re-arms it (an epoll_ctl), it only
// harvests the epoll instance and waits. On a paravirtualized VM each
// kernel entry goes through the hypervisor; the daemon's reader times out
// every 10 s. A record that comes between two waits is read at once all the
// same, as one that comes during a wait.
func TestKmsgFileQuietWaitsMakeNoReadOrRearm(t *testing.T) {
	for _, gather := range []time.Duration{0, 10 * time.Millisecond} {
		kf, w := newPipeFile(t, gather)
		buf := make([]byte, BufSize)
		quiet := func(what string) {
			t.Helper()
			kf.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
			if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("gather %s: %s: Read with nothing ready = %v, want the deadline exceeded", gather, what, err)
			}
		}
		quiet("the first wait")
		reads, ctls := kf.readCalls, kf.ctlCalls
		for i := range 5 {
			quiet("wait " + strconv.Itoa(i+2))
		}
		if r, c := kf.readCalls-reads, kf.ctlCalls-ctls; r != 0 || c != 0 {
			t.Errorf("gather %s: 5 waits after one that its deadline ended made %d read(2) and %d epoll_ctl(2) calls; want 0 and 0", gather, r, c)
		}
		// A record written between two waits is read at once.
		w.Write([]byte("6,1,1,-;between\n"))
		kf.SetReadDeadline(time.Now().Add(10 * time.Second))
		start := time.Now()
		if n, err := kf.Read(buf); err != nil || string(buf[:n]) != "6,1,1,-;between\n" {
			t.Fatalf("gather %s: Read after a record written between waits = %q, %v", gather, buf[:n], err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("gather %s: the record written between waits was read after %s", gather, d)
		}
		quiet("the wait after the record")
		// And one that comes during the wait that follows ends it.
		kf.SetReadDeadline(time.Now().Add(10 * time.Second))
		go func() {
			time.Sleep(20 * time.Millisecond)
			w.Write([]byte("6,2,2,-;during\n"))
		}()
		if n, err := kf.Read(buf); err != nil || string(buf[:n]) != "6,2,2,-;during\n" {
			t.Fatalf("gather %s: Read while waiting = %q, %v", gather, buf[:n], err)
		}
	}
}

// A Seek moves the reader without a record coming: the one-shot still armed
// by a wait that its deadline ended does not fire for what the seek made
// readable, so the next Read reads first. On the real device (as root;
// BenchmarkDeviceRead seeks so): the ring buffer holds this boot's records.
func TestKmsgFileReadsAfterASeek(t *testing.T) {
	dev, err := Open("/dev/kmsg")
	if err != nil {
		testenv.Skip(t, "cannot open /dev/kmsg: "+err.Error())
	}
	defer dev.Close()
	buf := make([]byte, BufSize)
	if _, err := dev.Seek(0, io.SeekEnd); err != nil {
		t.Fatal(err)
	}
	dev.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	for {
		if _, err := dev.Read(buf); errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
	}
	if _, err := dev.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	dev.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := dev.Read(buf); err != nil && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Read after a seek to the start = %v, want a record", err)
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
// (each Read of an 8-byte buffer takes one "record" of 8 bytes), gathering
// for gather (0: not), and the write end.
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

// prime makes kf's average say that records come fast: waits ended by a
// 1 ms deadline, two records after each.
func prime(t *testing.T, kf *kmsgFile, w *os.File) {
	t.Helper()
	buf := make([]byte, 8)
	sleeps := kf.sleeps
	for range 12 {
		kf.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read with nothing ready = %v", err)
		}
		w.Write([]byte("record.\nrecord.\n"))
		readRecords(t, kf, 2)
	}
	if kf.sleeps == sleeps {
		t.Fatalf("records 1 ms apart, 12 times: no gathering sleep (%v a record on average)", kf.perRecord)
	}
}

// A sleep after which more than stormBytes are read without a wait (a log
// that could fill the ring buffer while the reader sleeps) stops gathering
// for stormCalm; a read deadline ends a sleep.
func TestKmsgFileStopsGatheringInAStorm(t *testing.T) {
	const gather = 500 * time.Millisecond
	kf, w := newPipeFile(t, gather)
	buf := make([]byte, 8)
	prime(t, kf, w)

	// The next wait is a sleep, and a deadline ends it early.
	sleeps := kf.sleeps
	kf.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read during a sleep = %v", err)
	}
	if kf.sleeps != sleeps+1 {
		t.Fatalf("the wait after fast records was not a sleep")
	}
	if waited := time.Since(start); waited > gather*3/4 {
		t.Errorf("a read deadline 30 ms away ended a %s sleep after %s", gather, waited)
	}

	// Fast again; then a sleep during which a storm comes.
	prime(t, kf, w)
	sleeps = kf.sleeps
	const storm = stormBytes/8 + 100
	go func() {
		time.Sleep(gather / 5)
		w.Write(bytes.Repeat([]byte("record.\n"), storm))
	}()
	start = time.Now()
	readRecords(t, kf, storm)
	if slept := time.Since(start); slept < gather*3/4 {
		t.Errorf("the records came %s into a %s sleep and were read after %s", gather/5, gather, slept)
	}
	if kf.sleeps != sleeps+1 || kf.calmAt.IsZero() {
		t.Fatalf("%d gathering sleeps (want 1), calm until %v (want set)", kf.sleeps-sleeps, kf.calmAt)
	}
	// For a second (README: "turns gathering off for a second").
	if left := time.Until(kf.calmAt); left < stormCalm/2 || left > stormCalm {
		t.Errorf("gathering is off for %s more after the storm, want about %s", left, stormCalm)
	}
	// Calm: the next wait is in the poller although the records came fast.
	kf.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with nothing ready = %v", err)
	}
	if kf.sleeps != sleeps+1 {
		t.Fatalf("a gathering sleep right after a storm")
	}
}

// voluntarySwitches sums this process's threads' voluntary context
// switches: each is a thread going to sleep, to be woken.
func voluntarySwitches(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // ended meanwhile
		}
		_, v, _ := strings.Cut(string(b), "voluntary_ctxt_switches:")
		k, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(v, "\n", 2)[0]))
		n += k
	}
	return n
}

// epollEvents returns the event mask the epoll instance epfd holds for
// fd, as /proc/self/fdinfo shows it, and whether fd is in it at all.
func epollEvents(t *testing.T, epfd, fd int) (uint64, bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(epfd))
	if err != nil {
		t.Error(err)
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "tfd:" && f[1] == strconv.Itoa(fd) && f[2] == "events:" {
			ev, err := strconv.ParseUint(f[3], 16, 64)
			if err != nil {
				t.Errorf("fdinfo line %q: %v", line, err)
			}
			return ev, true
		}
	}
	return 0, false
}

// During a sleep the device wakes nothing, even after a wait that its
// deadline ended left it armed: it is out of the epoll instance, or a
// one-shot that fired (no event bit left). Left in with no events, the
// kernel's EPOLLERR|EPOLLHUP would stay in its mask, and a device whose
// wake-ups carry no event mask (the kernel log; inotify, which stands in
// for it here) would wake the poller's thread at every event (12-117
// wake-ups for 100 events, measured).
func TestKmsgFileSleepWakesNothing(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	kf, err := newKmsgFile(fd, "inotify")
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	const gather = 500 * time.Millisecond
	if err := kf.gatherFor(gather); err != nil {
		t.Fatal(err)
	}
	epfd := kf.epfd
	buf := make([]byte, BufSize)
	create := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A wait that its deadline ends leaves the device armed.
	kf.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
	if _, err := kf.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with nothing ready = %v", err)
	}
	if ev, in := epollEvents(t, epfd, fd); !in || ev&unix.EPOLLIN == 0 {
		t.Fatalf("after a wait that its deadline ended: in the epoll instance %v, events %#x; want armed", in, ev)
	}
	kf.perRecord = 0 // records come fast: the next wait with records before it sleeps
	create("first")
	kf.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := kf.Read(buf); err != nil {
		t.Fatal(err)
	}
	// 100 events from another process during the sleep that follows, and
	// a look at the epoll instance 100 ms into it.
	testenv.StartsProcesses(t)
	cmd := exec.Command("sh", "-c", `sleep 0.05; for i in $(seq 100); do : > "$1/e$i"; done`, "sh", dir)
	type look struct {
		ev uint64
		in bool
	}
	looked := make(chan look, 1)
	before := voluntarySwitches(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		ev, in := epollEvents(t, epfd, fd)
		looked <- look{ev, in}
	}()
	sleeps := kf.sleeps
	start := time.Now()
	if _, err := kf.Read(buf); err != nil {
		t.Fatal(err)
	}
	slept := time.Since(start)
	woke := voluntarySwitches(t) - before
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if kf.sleeps != sleeps+1 {
		t.Fatalf("the wait was not a gathering sleep")
	}
	l := <-looked
	if slept < 100*time.Millisecond {
		t.Fatalf("the sleep ended after %s, before the look at 100 ms", slept)
	}
	if l.in && l.ev&0xffff != 0 {
		t.Errorf("during the sleep the device is in the epoll instance with events %#x; want none (out of it, or a one-shot that fired)", l.ev)
	}
	t.Logf("100 events during a sleep: this process's threads went to sleep %d times", woke)
}

// Records at random gaps (exponential, 20 ms on average: a log written
// 50 times a second) rarely start a sleep with a gathering time of 10 ms:
// one short gap is not a busy log. Deciding on the last gap alone made
// about a quarter of the waits sleeps, each found at most a record.
func TestKmsgFileRandomGapsRarelySleep(t *testing.T) {
	kf, w := newPipeFile(t, 10*time.Millisecond)
	const n = 60
	rng := rand.New(rand.NewPCG(1, 2))
	go func() {
		for range n {
			time.Sleep(time.Duration(rng.ExpFloat64() * float64(20*time.Millisecond)))
			w.Write([]byte("record.\n"))
		}
	}()
	readRecords(t, kf, n)
	if kf.sleeps*10 > kf.waits {
		t.Errorf("%d records at random gaps: %d of %d waits were sleeps, want under a tenth", n, kf.sleeps, kf.waits)
	}
	t.Logf("%d sleeps of %d waits", kf.sleeps, kf.waits)
}
