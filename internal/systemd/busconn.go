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
)

// busConn is a connection to the system bus that makes method calls: a few
// calls are written at once and their answers read back, one exchange at a
// time. Nothing but the answers is asked for (no signal is subscribed), so
// it wakes only for them. An exchange that fails in any way (the bus went,
// a malformed message, the caller's context ended midway) leaves the
// connection closed: the caller dials a new one.
type busConn struct {
	c *net.UnixConn
	// turn holds one token while an exchange runs.
	turn   chan struct{}
	dead   atomic.Bool
	serial uint32
	out    []byte // the calls of an exchange, encoded
	buf    []byte // read buffer
	rd     []byte // what buf holds that is not read yet
	// Name is the unique name the bus gave the connection (Hello).
	Name string
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
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	c := &busConn{c: nc.(*net.UnixConn), turn: make(chan struct{}, 1), buf: make([]byte, 4096)}
	if err := c.hello(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// hello authenticates and says Hello: the NUL byte, AUTH EXTERNAL with the
// uid in hex, and once the bus said OK, BEGIN and the Hello call at once.
func (c *busConn) hello(ctx context.Context) error {
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
	c.serial++
	b, err := appendCall([]byte("BEGIN\r\n"), c.serial, busCall{dest: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", iface: "org.freedesktop.DBus", member: "Hello"})
	if err != nil {
		return err
	}
	if _, err := c.c.Write(b); err != nil {
		return c.fail(ctx, err)
	}
	m, err := c.answer(c.serial)
	if err != nil {
		return c.fail(ctx, err)
	}
	if m.typ == msgError {
		return fmt.Errorf("D-Bus Hello: %w", errorOf(m))
	}
	c.Name, err = parseString(m)
	return err
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

// next reads the next message. Its body points into the read buffer: it is
// good until the next read.
func (c *busConn) next() (message, error) {
	if len(c.rd) < 16 {
		if err := c.fill(16); err != nil {
			return message{}, err
		}
	}
	n, err := messageLen(c.rd)
	if err != nil {
		return message{}, err
	}
	if len(c.rd) < n {
		if err := c.fill(n); err != nil {
			return message{}, err
		}
	}
	b := c.rd[:n]
	c.rd = c.rd[n:]
	return parseMessage(b)
}

// answer reads messages until the answer (a return or an error) to the
// call with the given serial; others (the bus's NameAcquired signal) are
// passed over.
func (c *busConn) answer(serial uint32) (message, error) {
	for {
		m, err := c.next()
		if err != nil {
			return message{}, err
		}
		if (m.typ == msgReturn || m.typ == msgError) && m.replySerial == serial {
			return m, nil
		}
	}
}

// bound makes the connection's reads and writes end with ctx: its deadline,
// or at once when it is done. stop undoes it.
func (c *busConn) bound(ctx context.Context) (stop func() bool) {
	dl, _ := ctx.Deadline()
	c.c.SetDeadline(dl)
	return context.AfterFunc(ctx, func() { c.c.SetDeadline(time.Unix(1, 0)) })
}

// fail is err, or ctx's error when ctx ended the I/O.
func (c *busConn) fail(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if e := ctx.Err(); e != nil {
			return e
		}
		// The connection's deadline is ctx's, which may pass a moment
		// before ctx says it is done.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return context.DeadlineExceeded
		}
	}
	return err
}

// exchange writes calls at once and hands each answer to got, with the
// call's index, in the order they arrive; an error answer comes as a
// message of type msgError (errorOf). got's error ends the exchange (the
// connection stays usable only if every answer was read).
func (c *busConn) exchange(ctx context.Context, calls []busCall, got func(i int, m message) error) error {
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.turn }()
	if c.dead.Load() {
		return net.ErrClosed
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	stop := c.bound(ctx)
	first := c.serial + 1
	out := c.out[:0]
	for _, call := range calls {
		c.serial++
		var err error
		if out, err = appendCall(out, c.serial, call); err != nil {
			stop()
			c.serial = first - 1
			ok = true // nothing was sent
			return err
		}
	}
	c.out = out
	if _, err := c.c.Write(out); err != nil {
		stop()
		return c.fail(ctx, err)
	}
	pending := len(calls)
	seen := make([]bool, len(calls))
	var gotErr error
	for pending > 0 {
		m, err := c.next()
		if err != nil {
			stop()
			return c.fail(ctx, err)
		}
		if m.typ != msgReturn && m.typ != msgError {
			continue
		}
		i := int(m.replySerial - first)
		if m.replySerial < first || i >= len(calls) || seen[i] {
			continue
		}
		seen[i] = true
		pending--
		if gotErr == nil {
			gotErr = got(i, m)
		}
	}
	// When ctx ended just as the last answer came, the deadline that ends
	// reads may be set: the connection is closed (ok false) though every
	// answer was read.
	ok = stop()
	return gotErr
}

// Connected is false once the connection failed or was closed.
func (c *busConn) Connected() bool { return !c.dead.Load() }

// Close closes the connection.
func (c *busConn) Close() {
	if !c.dead.Swap(true) {
		c.c.Close()
	}
}
