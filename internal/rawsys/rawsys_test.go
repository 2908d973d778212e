package rawsys

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
