package rawsys

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// pair is a connected pair on network ("tcp" or "unix"): the dialed end
// and the accepted one.
func pair(t *testing.T, network string) (net.Conn, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func TestWrapKeepsWhatHasNoDescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Wrap(a) != a {
		t.Fatal("a net.Pipe end was wrapped; it has no descriptor")
	}
}

// Bytes go through both ways intact, a write larger than the socket's
// buffer included (it waits for the reader in the poller).
func TestReadWrite(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c, s := pair(t, network)
			rc, rs := Wrap(c), Wrap(s)
			if _, ok := rc.(*Conn); !ok {
				t.Fatalf("Wrap(%T) = %T, want *Conn", c, rc)
			}
			big := make([]byte, 8<<20)
			for i := range big {
				big[i] = byte(i * 7)
			}
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(rs, int64(len(big))))
				got <- b
			}()
			n, err := rc.Write(big)
			if err != nil || n != len(big) {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(big))
			}
			if b := <-got; !bytes.Equal(b, big) {
				t.Fatalf("read %d bytes, not what was written", len(b))
			}
			if _, err := rs.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 16)
			n, err = rc.Read(buf)
			if err != nil || string(buf[:n]) != "pong" {
				t.Fatalf("Read = %q, %v", buf[:n], err)
			}
			if n, err := rc.Read(nil); n != 0 || err != nil {
				t.Fatalf("Read(nil) = %d, %v", n, err)
			}
		})
	}
}

// Each error a caller tells apart (a deadline, the peer's close, our own
// close, a reset) is the one the plain connection returns, to the word.
func TestErrorsAreThePlainConnections(t *testing.T) {
	type outcome struct {
		msg                                   string
		timeout, deadline, eof, closed, reset bool
	}
	of := func(err error) outcome {
		var ne net.Error
		return outcome{msg: err.Error(), timeout: errors.As(err, &ne) && ne.Timeout(),
			deadline: errors.Is(err, os.ErrDeadlineExceeded), eof: err == io.EOF,
			closed: errors.Is(err, net.ErrClosed), reset: errors.Is(err, syscall.ECONNRESET)}
	}
	cases := map[string]struct {
		do   func(c, peer net.Conn) error
		want func(outcome) bool
	}{
		"deadline": {func(c, _ net.Conn) error {
			c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			_, err := c.Read(make([]byte, 8))
			return err
		}, func(o outcome) bool { return o.timeout && o.deadline }},
		"peer closed": {func(c, peer net.Conn) error {
			peer.Close()
			_, err := c.Read(make([]byte, 8))
			return err
		}, func(o outcome) bool { return o.eof }},
		"closed": {func(c, _ net.Conn) error {
			c.Close()
			_, err := c.Write([]byte("x"))
			return err
		}, func(o outcome) bool { return o.closed }},
		"reset": {func(c, peer net.Conn) error {
			peer.(*net.TCPConn).SetLinger(0)
			peer.Close()
			for {
				// The reset arrives after the close: a read waits for it.
				if _, err := c.Read(make([]byte, 8)); err != nil {
					return err
				}
			}
		}, func(o outcome) bool { return o.reset }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c1, s1 := pair(t, "tcp")
			plain := of(tc.do(c1, s1))
			c2, s2 := pair(t, "tcp")
			raw := of(tc.do(Wrap(c2), s2))
			if !tc.want(raw) {
				t.Errorf("raw: %+v", raw)
			}
			// The messages name the addresses, which differ: the same
			// with each pair's own.
			plain.msg = replaceAddrs(plain.msg, c1)
			raw.msg = replaceAddrs(raw.msg, c2)
			if raw != plain {
				t.Errorf("raw %+v, plain %+v", raw, plain)
			}
		})
	}
}

func replaceAddrs(msg string, c net.Conn) string {
	return string(bytes.ReplaceAll(bytes.ReplaceAll([]byte(msg), []byte(c.LocalAddr().String()), []byte("LOCAL")), []byte(c.RemoteAddr().String()), []byte("REMOTE")))
}

func TestStat(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	id, err := Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if id != (FileID{Dev: uint64(st.Dev), Ino: st.Ino}) {
		t.Fatalf("Stat = %+v, os.Stat says dev %d ino %d", id, st.Dev, st.Ino)
	}
	// A link is followed, as os.Stat does.
	link := filepath.Join(dir, "l")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	if lid, err := Stat(link); err != nil || lid != id {
		t.Fatalf("Stat(link) = %+v, %v; want %+v", lid, err, id)
	}
	_, err = Stat(filepath.Join(dir, "none"))
	_, osErr := os.Stat(filepath.Join(dir, "none"))
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != osErr.Error() {
		t.Fatalf("Stat of a missing path: %v; os.Stat's: %v", err, osErr)
	}
	if _, err := Stat("a\x00b"); err == nil {
		t.Fatal("a path with a NUL byte was stat'ed")
	}
}

// MonotonicMicros is the clock the kernel log's timestamps use:
// CLOCK_MONOTONIC as x/sys reads it, between two readings of that.
func TestMonotonicMicros(t *testing.T) {
	read := func() uint64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		return uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3
	}
	before := read()
	got := MonotonicMicros()
	after := read()
	if got < before || got > after {
		t.Fatalf("MonotonicMicros = %d, not between %d and %d", got, before, after)
	}
}

// MonotonicMicros reads the clock without entering the kernel (the vDSO,
// as the runtime's own clock does): the kernel log reader and the monitor
// read it at every read timeout, and on a paravirtualized VM each kernel
// entry costs a trip through the hypervisor. Proved on a thread where
// clock_gettime(2) is refused (a seccomp filter of that thread alone,
// which the vDSO's reading never reaches): a system call would leave the
// reading 0.
func TestMonotonicMicrosMakesNoSystemCall(t *testing.T) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	before := uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3
	type answer struct {
		got, refusedAs uint64
		err            error
	}
	done := make(chan answer, 1)
	go func() {
		// The goroutine ends locked: its thread, filtered, exits with it.
		runtime.LockOSThread()
		const seccompRetErrno, seccompRetAllow = 0x00050000, 0x7fff0000
		prog := []unix.SockFilter{
			{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
			{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_CLOCK_GETTIME},
			{Code: unix.BPF_RET | unix.BPF_K, K: seccompRetErrno | uint32(unix.EPERM)},
			{Code: unix.BPF_RET | unix.BPF_K, K: seccompRetAllow},
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- answer{err: err}
			return
		}
		if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
			done <- answer{err: err}
			return
		}
		// The filter holds: the system call is refused on this thread.
		var ts unix.Timespec
		_, _, e := syscall.RawSyscall(unix.SYS_CLOCK_GETTIME, unix.CLOCK_MONOTONIC, uintptr(unsafe.Pointer(&ts)), 0)
		done <- answer{got: MonotonicMicros(), refusedAs: uint64(e)}
	}()
	a := <-done
	if errors.Is(a.err, unix.EINVAL) {
		// qemu-user refuses every seccomp filter: make test-arm64 skips
		// this test by name (ARM64_SKIP); the native run (amd64 in CI)
		// proves the property, and CI fails where it cannot.
		testenv.Skip(t, fmt.Sprintf("seccomp filters cannot be installed here (an emulator?): %v", a.err))
	}
	if a.err != nil {
		t.Fatalf("installing the seccomp filter: %v", a.err)
	}
	if syscall.Errno(a.refusedAs) != unix.EPERM {
		t.Fatalf("the filter did not refuse clock_gettime(2): errno %d", a.refusedAs)
	}
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	after := uint64(ts.Sec)*1e6 + uint64(ts.Nsec)/1e3
	if a.got < before || a.got > after {
		t.Fatalf("MonotonicMicros = %d with clock_gettime(2) refused, not between %d and %d: it entered the kernel", a.got, before, after)
	}
}

// What a raw call could block on, or misread, is left as it is.
func TestWrapRefusesWhatIsNotSafe(t *testing.T) {
	c, _ := pair(t, "unix")
	f, err := c.(*net.UnixConn).File() // a dup, set blocking
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.SetNonblock(int(f.Fd()), false); err != nil {
		t.Fatal(err)
	}
	// The dup shares the file status flags: c's descriptor blocks now.
	if _, ok := Wrap(c).(*Conn); ok {
		t.Error("a blocking descriptor was wrapped")
	}
	pc, err := net.ListenPacket("unixgram", filepath.Join(t.TempDir(), "d"))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, ok := Wrap(pc.(*net.UnixConn)).(*Conn); ok {
		t.Error("a datagram socket was wrapped")
	}
}

// A Close from another goroutine ends a Read and a Write that wait; a write
// deadline ends a Write that waits for room.
func TestCloseAndWriteDeadlineEndWaits(t *testing.T) {
	c, _ := pair(t, "tcp")
	rc := Wrap(c)
	done := make(chan error, 2)
	go func() {
		_, err := rc.Read(make([]byte, 8))
		done <- err
	}()
	go func() {
		_, err := rc.Write(make([]byte, 64<<20)) // more than the buffers hold: waits
		done <- err
	}()
	// Each waits in the poller (the peer neither writes nor reads).
	for !goroutineWaiting(t) {
		runtime.Gosched()
	}
	rc.Close()
	for range 2 {
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("after Close: %v, want net.ErrClosed", err)
		}
	}
	c2, _ := pair(t, "tcp")
	rc2 := Wrap(c2)
	// Far enough that the Write starts before it, on a loaded machine too
	// (a deadline already past writes nothing, as net's does: with 50 ms
	// that happened in 3 of 5 runs beside a CI run).
	rc2.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	n, err := rc2.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n == 64<<20 {
		t.Fatalf("Write past its deadline = %d, %v; want part written and os.ErrDeadlineExceeded", n, err)
	}
}

// goroutineWaiting reports whether two goroutines wait in the poller ("IO
// wait" in a dump of every goroutine).
func goroutineWaiting(t *testing.T) bool {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return bytes.Count(buf[:n], []byte("[IO wait")) >= 2
}

func TestInMemory(t *testing.T) {
	var fs syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &fs) != nil || fs.Type != 0x01021994 {
		testenv.Skip(t, "no tmpfs at /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "rawsys-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !InMemory(sock) {
		t.Errorf("%s on tmpfs: not in memory", sock)
	}
	link := filepath.Join(dir, "l")
	os.Symlink(sock, link)
	if InMemory(link) {
		t.Errorf("%s, a symbolic link: in memory", link)
	}
	if InMemory("relative/s") {
		t.Error("a relative path: in memory")
	}
	var tfs syscall.Statfs_t
	other := t.TempDir()
	if syscall.Statfs(other, &tfs) == nil && tfs.Type != 0x01021994 && InMemory(filepath.Join(other, "s")) {
		t.Errorf("%s, not on tmpfs: in memory", other)
	}
}

// Pending tells bytes waiting on a socket, of a Conn and of a plain
// connection, without reading them; nothing where it cannot tell.
func TestPending(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			c, s := pair(t, network)
			rc := Wrap(c)
			if Pending(rc) || Pending(c) {
				t.Fatal("pending before anything was sent")
			}
			if _, err := s.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			for !Pending(rc) {
				runtime.Gosched() // a loopback write is queued at once; tcp may take a moment
			}
			if !Pending(c) {
				t.Error("the plain connection: not pending")
			}
			b := make([]byte, 1)
			if _, err := io.ReadFull(rc, b); err != nil {
				t.Fatal(err)
			}
			if Pending(rc) {
				t.Error("pending after the byte was read")
			}
			rc.Close()
			if Pending(rc) {
				t.Error("a closed connection: pending")
			}
		})
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if Pending(a) {
		t.Error("net.Pipe (no descriptor): pending")
	}
}
