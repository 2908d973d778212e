package systemd

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// busConn is a connection to the system bus that makes method calls: a few
// calls are written at once and their answers read back, one exchange at a
// time. Nothing but the answers is asked for (no signal is subscribed), so
// it wakes only for them. An exchange whose caller's context ends while it
// reads leaves the connection as it is: what was read of a message stays in
// the buffer, and the answers that come later are passed over by their
// serials. One that fails otherwise (the bus went, a malformed message, a
// write cut short) closes it: the caller dials a new one.
//
// Its reads and writes are raw system calls (rawsys): the reads of the
// checks that run every 30 s and every minute do not wake the runtime's
// monitor thread.
type busConn struct {
	c net.Conn
	// turn holds one token while an exchange runs.
	turn   chan struct{}
	dead   atomic.Bool
	serial uint32
	out    []byte // the calls of an exchange, encoded
	buf    []byte // read buffer
	rd     []byte // what buf holds that is not read yet
	// skip is what is left to pass over of a message larger than
	// maxMessage (a peer's signal, not an answer), across exchanges.
	skip int
}

// systemBusSocket is the system bus's socket: DBUS_SYSTEM_BUS_ADDRESS's
// first unix path (or abstract name), else /run/dbus/system_bus_socket.
func systemBusSocket() (string, error) {
	addr := os.Getenv("DBUS_SYSTEM_BUS_ADDRESS")
	if addr == "" {
		return "/run/dbus/system_bus_socket", nil
	}
	for _, a := range strings.Split(addr, ";") {
		transport, kv, ok := strings.Cut(a, ":")
		if !ok || transport != "unix" {
			continue
		}
		for _, p := range strings.Split(kv, ",") {
			k, v, _ := strings.Cut(p, "=")
			v, err := url.PathUnescape(v)
			if err != nil {
				continue
			}
			switch k {
			case "path":
				return v, nil
			case "abstract":
				return "@" + v, nil
			}
		}
	}
	return "", fmt.Errorf("DBUS_SYSTEM_BUS_ADDRESS=%q names no unix socket", addr)
}

// dialBusConn connects to the bus at socket, authenticates (EXTERNAL, as
// this process's uid) and says Hello, within ctx.
func dialBusConn(ctx context.Context, socket string) (*busConn, error) {
	nc, err := rawsys.Dial(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	c := &busConn{c: nc, turn: make(chan struct{}, 1), buf: make([]byte, 4096)}
	if err := c.hello(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// hello authenticates and says Hello: the NUL byte, AUTH EXTERNAL with the
// uid in hex, and once the bus said OK, BEGIN and the Hello call (an
// exchange, as any call).
func (c *busConn) hello(ctx context.Context) error {
	if err := c.auth(ctx); err != nil {
		return err
	}
	hello := busCall{dest: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", iface: "org.freedesktop.DBus", member: "Hello"}
	return c.exchange(ctx, []busCall{hello}, func(_ int, m message) error {
		if m.typ == msgError {
			return fmt.Errorf("D-Bus Hello: %w", errorOf(m))
		}
		_, err := parseString(m) // the connection's unique name
		return err
	})
}

// auth is the authentication exchange, BEGIN included.
func (c *busConn) auth(ctx context.Context) error {
	stop := c.bound(ctx)
	defer stop()
	uid := hex.EncodeToString([]byte(strconv.Itoa(os.Getuid())))
	if _, err := c.c.Write([]byte("\x00AUTH EXTERNAL " + uid + "\r\n")); err != nil {
		return c.fail(ctx, err)
	}
	line, err := c.readLine()
	if err != nil {
		return c.fail(ctx, err)
	}
	if !strings.HasPrefix(line, "OK ") {
		return fmt.Errorf("D-Bus authentication refused: %q", line)
	}
	if _, err := c.c.Write([]byte("BEGIN\r\n")); err != nil {
		return c.fail(ctx, err)
	}
	return nil
}

// readLine reads one line of the authentication exchange.
func (c *busConn) readLine() (string, error) {
	for {
		if i := bytes.Index(c.rd, []byte("\r\n")); i >= 0 {
			line := string(c.rd[:i])
			c.rd = c.rd[i+2:]
			return line, nil
		}
		if len(c.rd) >= 512 {
			return "", errors.New("D-Bus authentication: a line of more than 512 bytes")
		}
		if err := c.fill(len(c.rd) + 1); err != nil {
			return "", err
		}
	}
}

// fill reads until the buffer holds at least n unread bytes.
func (c *busConn) fill(n int) error {
	if n > len(c.buf) {
		nb := make([]byte, max(n, 2*len(c.buf)))
		c.rd = nb[:copy(nb, c.rd)]
		c.buf = nb
	} else if len(c.rd) > 0 && &c.rd[0] != &c.buf[0] {
		c.rd = c.buf[:copy(c.buf, c.rd)]
	} else if len(c.rd) == 0 {
		c.rd = c.buf[:0]
	}
	for len(c.rd) < n {
		k, err := c.c.Read(c.buf[len(c.rd):])
		c.rd = c.buf[:len(c.rd)+k]
		if err != nil && len(c.rd) < n {
			return err
		}
	}
	return nil
}

// next reads the next message of at most maxMessage bytes, passing over
// larger ones. Its body points into the read buffer: it is good until the
// next read.
func (c *busConn) next() (message, error) {
	for {
		if err := c.skipOver(); err != nil {
			return message{}, err
		}
		if len(c.rd) < 16 {
			if err := c.fill(16); err != nil {
				return message{}, err
			}
		}
		n, err := messageLen(c.rd)
		if err != nil {
			return message{}, err
		}
		if n > maxMessage {
			c.skip = n
			continue
		}
		return c.whole(n)
	}
}

// skipOver reads past what is left of a message too large to read.
func (c *busConn) skipOver() error {
	for c.skip > 0 {
		if len(c.rd) == 0 {
			k, err := c.c.Read(c.buf)
			c.rd = c.buf[:k]
			if err != nil && k == 0 {
				return err
			}
		}
		k := min(c.skip, len(c.rd))
		c.rd, c.skip = c.rd[k:], c.skip-k
	}
	return nil
}

// whole reads the rest of the message of n bytes that starts the buffer.
func (c *busConn) whole(n int) (message, error) {
	if len(c.rd) < n {
		if err := c.fill(n); err != nil {
			return message{}, err
		}
	}
	b := c.rd[:n]
	c.rd = c.rd[n:]
	return parseMessage(b)
}

// bound makes the connection's reads and writes end when ctx is done (at
// its deadline, when ctx's own timer fires, or when it is cancelled): a
// deadline in the past, set then, ends them at once. stop undoes it; it
// reports false when ctx ended the I/O, and returns only once that is done
// and the past deadline is cleared, so that it never cuts short a later
// exchange.
//
// The connection's deadline is not set to ctx's: the connection lives as
// long as the daemon, and a deadline set on it is a timer of the runtime's
// poller, moved by each exchange and left in the processor's timer heap at
// the earliest time it held, so that the idle daemon woke there with
// nothing to do: 5 s after the 30 s grid's points, the deadline of
// TunnelDisconnected's calls (README, "Where the idle minute's wake-ups
// go"). ctx's timer is stopped when the check ends.
func (c *busConn) bound(ctx context.Context) (stop func() bool) {
	ended := make(chan struct{})
	stopEnd := context.AfterFunc(ctx, func() {
		c.c.SetDeadline(time.Unix(1, 0))
		close(ended)
	})
	return func() bool {
		if stopEnd() {
			return true
		}
		<-ended
		c.c.SetDeadline(time.Time{})
		return false
	}
}

// fail is err, or ctx's error when ctx ended the I/O.
func (c *busConn) fail(ctx context.Context, err error) error {
	if endedBy(ctx, err) {
		if e := ctx.Err(); e != nil {
			return e
		}
		return context.DeadlineExceeded
	}
	return err
}

// endedBy reports whether err is the connection's deadline and ctx's end
// set it: ctx is done, or its deadline (the connection's) passed a moment
// before ctx says so.
func endedBy(ctx context.Context, err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// exchange writes calls at once and hands each answer to got, with the
// call's index, in the order they arrive; an error answer comes as a
// message of type msgError (errorOf). got's error is returned once every
// answer is read. On a connection found closed it returns errNotSent: it
// sent nothing.
func (c *busConn) exchange(ctx context.Context, calls []busCall, got func(i int, m message) error) error {
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.turn }()
	if c.dead.Load() {
		return errNotSent
	}
	first := c.serial + 1
	if first == 0 || first+uint32(len(calls)) < first {
		// Serials wrap after 2^32 calls; 0 is not one. A new
		// connection starts again from 1.
		c.Close()
		return errNotSent
	}
	out := c.out[:0]
	for i, call := range calls {
		var err error
		if out, err = appendCall(out, first+uint32(i), call); err != nil {
			return err // nothing was sent
		}
	}
	c.out = out
	c.serial += uint32(len(calls))
	stop := c.bound(ctx)
	if n, err := c.c.Write(out); err != nil {
		stop()
		if n > 0 || !endedBy(ctx, err) {
			c.Close() // the stream holds part of a message, or the bus went
		}
		return c.fail(ctx, err)
	}
	pending := len(calls)
	seen := make([]bool, len(calls))
	var gotErr error
	for pending > 0 {
		m, err := c.next()
		if err != nil {
			stop()
			// When ctx ended the wait the connection is sound: a message
			// read in part stays in the buffer, and the answers still to
			// come are passed over by their serials.
			if !endedBy(ctx, err) {
				c.Close()
			}
			return c.fail(ctx, err)
		}
		if m.typ != msgReturn && m.typ != msgError {
			continue
		}
		if m.replySerial < first || m.replySerial-first >= uint32(len(calls)) || seen[m.replySerial-first] {
			continue // an answer to an earlier exchange, cut short
		}
		seen[m.replySerial-first] = true
		pending--
		if gotErr == nil {
			gotErr = got(int(m.replySerial-first), m)
		}
	}
	stop()
	return gotErr
}

// errNotSent: the connection was closed (an earlier exchange failed on it)
// before this one sent anything; the caller may dial and try again.
var errNotSent = fmt.Errorf("D-Bus connection closed before the call was sent: %w", net.ErrClosed)

// Connected is false once the connection failed or was closed.
func (c *busConn) Connected() bool { return !c.dead.Load() }

// Close closes the connection.
func (c *busConn) Close() {
	if !c.dead.Swap(true) {
		c.c.Close()
	}
}
