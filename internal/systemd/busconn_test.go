package systemd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

// rawMsg builds a message by hand: typ, serial, reply serial (0: none),
// signature (""=none), body bytes as given (must be aligned from offset 0).
func rawMsg(order interface {
	binary.ByteOrder
	binary.AppendByteOrder
}, typ byte, serial, replyTo uint32, sig string, body []byte) []byte {
	var b []byte
	ob := byte('l')
	if order == binary.BigEndian {
		ob = 'B'
	}
	b = append(b, ob, typ, 0, 1)
	b = order.AppendUint32(b, uint32(len(body)))
	b = order.AppendUint32(b, serial)
	b = order.AppendUint32(b, 0)
	pad := func() {
		for len(b)%8 != 0 {
			b = append(b, 0)
		}
	}
	if replyTo != 0 {
		pad()
		b = append(b, fieldReplySerial, 1, 'u', 0)
		b = order.AppendUint32(b, replyTo)
	}
	if sig != "" {
		pad()
		b = append(b, fieldSignature, 1, 'g', 0, byte(len(sig)))
		b = append(b, sig...)
		b = append(b, 0)
	}
	order.PutUint32(b[12:], uint32(len(b)-16))
	pad()
	return append(b, body...)
}

// A variant whose own signature is not one complete type: parseVariant's
// default case skips it without the check skip's 'v' case makes.
func TestVariantOfAnIncompleteTypeIsAnError(t *testing.T) {
	for _, sig := range []string{"(", "{", "a"} {
		body := append([]byte{byte(len(sig))}, sig...)
		body = append(body, 0)
		m := parse(t, rawMsg(binary.LittleEndian, msgReturn, 5, 4, "v", body))
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("variant of type %q: panic: %v", sig, r)
				}
			}()
			if _, err := parseVariant(m); err == nil {
				t.Errorf("variant of type %q accepted", sig)
			}
		}()
	}
}

// The same over a fake bus: a Properties.Get answered with such a variant
// panics the caller's goroutine (the daemon's check).
func TestUnitsOverABusAnsweringAnIncompleteType(t *testing.T) {
	fb := startFakeBus(t, func(conn int, pending []*godbus.Message) [][]byte {
		m := pending[len(pending)-1]
		if m.Headers[godbus.FieldMember].Value() == "ListUnitsByNames" {
			return [][]byte{encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+1000, m.Serial(), "",
				[]godbusUnitStatus{{"a.socket", "", "loaded", "active", "running", "", "/u/a", 0, "", "/"}})}
		}
		return [][]byte{rawMsg(binary.LittleEndian, msgReturn, m.Serial()+1000, m.Serial(), "v", []byte{1, '(', 0})}
	})
	bus := NewDBusAt(fb.sock)
	defer bus.Close()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Units panicked: %v", r)
		}
	}()
	if _, err := bus.Unit(context.Background(), "a.socket"); err == nil || !errors.Is(err, errBadMessage) {
		t.Errorf("Unit over a bus answering a variant of type \"(\": %v, want a malformed message", err)
	}
}

// scriptBus: authenticates, answers Hello, then for each batch of calls
// (read as godbus decodes them) calls script, which writes what it likes
// to the raw connection.
func scriptBus(t *testing.T, script func(conn int, c net.Conn, calls []*godbus.Message)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "bus")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			conn := n
			mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				if l, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(l, "\x00AUTH EXTERNAL ") {
					return
				}
				c.Write([]byte("OK 0123456789abcdef0123456789abcdef\r\n"))
				if l, err := r.ReadString('\n'); err != nil || l != "BEGIN\r\n" {
					return
				}
				for {
					m, err := godbus.DecodeMessage(r)
					if err != nil {
						return
					}
					if m.Headers[godbus.FieldMember].Value() == "Hello" {
						c.Write(encodeReply(t, binary.LittleEndian, godbus.TypeMethodReply, 1, m.Serial(), "", ":1.7"))
						continue
					}
					calls := []*godbus.Message{m}
					for r.Buffered() > 0 {
						m, err := godbus.DecodeMessage(r)
						if err != nil {
							return
						}
						calls = append(calls, m)
					}
					script(conn, c, calls)
				}
			}()
		}
	}()
	return sock
}

func unitsReply(order binary.ByteOrder, serial, replyTo uint32, name string, desc string) []byte {
	// godbus encoding through encodeReply needs a testing.TB; use a dummy
	return encodeReply(tb{}, order, godbus.TypeMethodReply, serial, replyTo, "",
		[]godbusUnitStatus{{name, desc, "loaded", "active", "running", "", "/u/a", 0, "", "/"}})
}

type tb struct{ testing.TB }

func (tb) Helper()           {}
func (tb) Fatal(args ...any) { panic(args) }

// Answers written one byte at a time, big-endian, larger than the read
// buffer, after a method call from the bus, an answer to a serial never
// sent and a duplicate; then a second call on the same connection.
func TestHostileStream(t *testing.T) {
	big := strings.Repeat("d", 20000)
	sock := scriptBus(t, func(conn int, c net.Conn, calls []*godbus.Message) {
		m := calls[0]
		var out []byte
		// a method call from the bus
		out = append(out, rawMsg(binary.BigEndian, msgCall, 7, 0, "", nil)...)
		// an answer to a serial never sent
		out = append(out, unitsReply(binary.LittleEndian, 8, m.Serial()+5, "wrong.service", "")...)
		out = append(out, unitsReply(binary.BigEndian, 9, m.Serial(), "a.service", big)...)
		// a duplicate, left for the next exchange
		out = append(out, unitsReply(binary.BigEndian, 10, m.Serial(), "dup.service", big)...)
		for i := range out {
			if _, err := c.Write(out[i : i+1]); err != nil {
				return
			}
		}
	})
	bus := NewDBusAt(sock)
	defer bus.Close()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		ls, err := bus.LoadState(ctx, "a.service")
		cancel()
		if err != nil || ls != "loaded" {
			t.Fatalf("call %d: %q %v", i, ls, err)
		}
	}
	if bus.Reconnects != 0 {
		t.Errorf("%d reconnects", bus.Reconnects)
	}
}

// The context cancelled at every point of an exchange (while the bus
// dribbles the answer), then the next call gets its own answer.
func TestCancelMidReadThenNextCall(t *testing.T) {
	var mu sync.Mutex
	slow := true
	sock := scriptBus(t, func(conn int, c net.Conn, calls []*godbus.Message) {
		for _, m := range calls {
			var out []byte
			if names, ok := m.Body[0].([]string); ok {
				out = unitsReply(binary.LittleEndian, m.Serial()+100, m.Serial(), names[0], "")
			} else {
				path := string(m.Headers[godbus.FieldPath].Value().(godbus.ObjectPath))
				out = encodeReply(tb{}, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+100, m.Serial(), "", godbus.MakeVariant([]byte(path)))
			}
			mu.Lock()
			s := slow
			mu.Unlock()
			if s {
				for i := range out {
					if _, err := c.Write(out[i : i+1]); err != nil {
						return
					}
					time.Sleep(50 * time.Microsecond)
				}
			} else {
				c.Write(out)
			}
		}
	})
	bus := NewDBusAt(sock)
	defer bus.Close()
	for d := time.Duration(0); d < 30*time.Millisecond; d += 2 * time.Millisecond {
		mu.Lock()
		slow = true
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		bus.Units(ctx, "first.socket")
		cancel()
		mu.Lock()
		slow = false
		mu.Unlock()
		u, err := bus.Units(context.Background(), "second.socket")
		if err != nil || u[0].Name != "second.socket" || u[0].Invocation != bytesHex("/u/a") {
			t.Fatalf("after a cancel at %v: %+v %v", d, u, err)
		}
	}
	// A caller's context that ends leaves the connection as it is: what
	// was read of a message stays, later answers are passed over.
	if bus.Reconnects != 0 {
		t.Errorf("%d reconnects after cancelled calls; want the connection kept", bus.Reconnects)
	}
}

// Concurrent callers: each gets its own unit's answer.
func TestConcurrentCallers(t *testing.T) {
	sock := scriptBus(t, func(conn int, c net.Conn, calls []*godbus.Message) {
		var out []byte
		for i := len(calls) - 1; i >= 0; i-- {
			m := calls[i]
			switch m.Headers[godbus.FieldMember].Value() {
			case "ListUnitsByNames":
				out = append(out, encodeReply(tb{}, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+100, m.Serial(), "",
					[]godbusUnitStatus{{m.Body[0].([]string)[0], "", "loaded", "active", "running", "", godbus.ObjectPath("/u/" + strings.TrimSuffix(m.Body[0].([]string)[0], ".service")), 0, "", "/"}})...)
			case "Get":
				var v any = "x"
				switch m.Body[1].(string) {
				case "InvocationID":
					v = []byte(string(m.Headers[godbus.FieldPath].Value().(godbus.ObjectPath)))
				case "NRestarts":
					v = uint32(3)
				case "ExecMainStartTimestamp":
					v = uint64(5)
				}
				out = append(out, encodeReply(tb{}, binary.LittleEndian, godbus.TypeMethodReply, m.Serial()+100, m.Serial(), "", godbus.MakeVariant(v))...)
			}
		}
		c.Write(out)
	})
	bus := NewDBusAt(sock)
	defer bus.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				name := string(rune('a'+g)) + strings.Repeat("x", i) + ".service"
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Millisecond+time.Millisecond)
				if i%2 == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
				}
				u, err := bus.Unit(ctx, name)
				cancel()
				if err != nil {
					if i%2 == 0 { // a 10 s context, a bus that answers at once
						errs <- err
					}
					continue
				}
				if u.Name != name || u.Invocation != bytesHex("/u/"+strings.TrimSuffix(name, ".service")) {
					errs <- errors.New("wrong answer: " + name + " " + u.Invocation)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d reconnects", bus.Reconnects)
}

func bytesHex(s string) string {
	const h = "0123456789abcdef"
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		b.WriteByte(h[s[i]>>4])
		b.WriteByte(h[s[i]&15])
	}
	return b.String()
}

// Same stream written in chunks of several sizes (all in one write: the
// messages concatenated in one read), and the bus closing mid-message on
// its first connection.
func TestChunksAndCloseMidMessage(t *testing.T) {
	for _, chunk := range []int{1, 3, 7, 16, 4095, 4097, 1 << 30} {
		sock := scriptBus(t, func(conn int, c net.Conn, calls []*godbus.Message) {
			var out []byte
			for i := len(calls) - 1; i >= 0; i-- {
				m := calls[i]
				out = append(out, rawMsg(binary.LittleEndian, msgSignal, 3, 0, "", nil)...)
				switch m.Headers[godbus.FieldMember].Value() {
				case "ListUnitsByNames":
					out = append(out, unitsReply(binary.BigEndian, 9, m.Serial(), "a.service", strings.Repeat("z", 5000))...)
				case "Get":
					if m.Body[1] == "Result" {
						out = append(out, encodeReply(tb{}, binary.LittleEndian, godbus.TypeError, 11, m.Serial(), "org.example.E", "nope")...)
					} else {
						out = append(out, encodeReply(tb{}, binary.BigEndian, godbus.TypeMethodReply, 11, m.Serial(), "", godbus.MakeVariant(uint32(m.Serial())))...)
					}
				}
			}
			if conn == 1 {
				out = out[:len(out)-5]
			}
			for len(out) > 0 {
				n := min(chunk, len(out))
				c.Write(out[:n])
				out = out[n:]
			}
			if conn == 1 {
				c.Close()
			}
		})
		bus := NewDBusAt(sock)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := bus.Unit(ctx, "a.service")
		var be *BusError
		if !errors.As(err, &be) || be.Name != "org.example.E" {
			t.Errorf("chunk %d: %v", chunk, err)
		}
		if ls, err := bus.LoadState(ctx, "a.service"); err != nil || ls != "loaded" || bus.Reconnects != 1 {
			t.Errorf("chunk %d: %q %v %d", chunk, ls, err, bus.Reconnects)
		}
		cancel()
		bus.Close()
	}
}

// DBus.Close while a call is in flight: the call dials a new connection
// after Close, which stays open.
func TestCloseDuringCall(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	sock := scriptBus(t, func(conn int, c net.Conn, calls []*godbus.Message) {
		if conn == 1 {
			arrived <- struct{}{}
			<-release
			return
		}
		m := calls[0]
		c.Write(unitsReply(binary.LittleEndian, 9, m.Serial(), "a.service", ""))
	})
	bus := NewDBusAt(sock)
	done := make(chan error)
	go func() {
		_, err := bus.LoadState(context.Background(), "a.service")
		done <- err
	}()
	<-arrived // the call is at the bus, waiting for its answer
	bus.Close()
	err := <-done
	close(release)
	if bus.live() != nil || err == nil {
		t.Errorf("after Close, the call (%v) left a live connection", err)
	}
}

// Any peer on the bus may send the daemon a signal, up to the bus's own
// limit: one larger than the daemon reads is passed over, before an answer
// and in the middle of an exchange that its context cuts short (the next
// exchange goes on passing it over), and the connection stays.
func TestBigMessageFromAPeerIsPassedOver(t *testing.T) {
	big := encodeReply(t, binary.LittleEndian, godbus.TypeSignal, 77, 0, "", strings.Repeat("x", maxMessage+100))
	var slow atomic.Bool
	gaveUp := make(chan struct{})
	sock := scriptBus(t, func(conn int, c net.Conn, calls []*godbus.Message) {
		for _, m := range calls {
			answer := unitsReply(binary.LittleEndian, m.Serial()+1000, m.Serial(), "a.service", "")
			if slow.Load() {
				// Half the signal, then, once the caller gave up, the
				// rest and the answer.
				c.Write(big[:len(big)/2])
				<-gaveUp
				c.Write(append(bytes.Clone(big[len(big)/2:]), answer...))
				continue
			}
			c.Write(append(bytes.Clone(big), answer...))
		}
	})
	bus := NewDBusAt(sock)
	defer bus.Close()
	if ls, err := bus.LoadState(context.Background(), "a.service"); err != nil || ls != "loaded" {
		t.Fatalf("after a big signal: %q, %v", ls, err)
	}
	slow.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := bus.LoadState(ctx, "a.service")
	cancel()
	slow.Store(false)
	close(gaveUp)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call cut short in the middle of a big signal: %v", err)
	}
	if ls, err := bus.LoadState(context.Background(), "a.service"); err != nil || ls != "loaded" {
		t.Fatalf("the call after: %q, %v", ls, err)
	}
	if bus.Reconnects != 0 {
		t.Errorf("%d reconnects: want the connection kept", bus.Reconnects)
	}
}

// deadlineConn records the deadlines set on a connection.
type deadlineConn struct {
	net.Conn
	mu  sync.Mutex
	set []time.Time
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set = append(c.set, t)
	return nil
}

func (c *deadlineConn) deadlines() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.set...)
}

// An exchange arms no deadline on the connection it keeps for the daemon's
// life: such a deadline is a timer of the runtime's poller, which each
// exchange moves and which stays in the timer heap at the earliest time it
// held, waking the idle daemon there for nothing (README, "Where the idle
// minute's wake-ups go"). ctx still ends the I/O: a deadline in the past,
// set when ctx is done and cleared before stop returns.
func TestBoundArmsNoDeadline(t *testing.T) {
	dc := &deadlineConn{}
	c := &busConn{c: dc}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	stop := c.bound(ctx)
	if !stop() {
		t.Fatal("stop reports that ctx ended the I/O; it did not")
	}
	for _, d := range dc.deadlines() {
		if d.After(time.Now()) {
			t.Errorf("an exchange set the deadline %v on the connection, want none in the future", d)
		}
	}
	// ctx ending the exchange: a past deadline at once, cleared by stop.
	dc.set = nil
	ctx2, cancel2 := context.WithCancel(context.Background())
	stop = c.bound(ctx2)
	cancel2()
	if stop() {
		t.Fatal("stop reports that ctx did not end the I/O; it was cancelled")
	}
	set := dc.deadlines()
	if len(set) != 2 || set[0].IsZero() || set[0].After(time.Now()) || !set[1].IsZero() {
		t.Errorf("deadlines set %v, want one in the past, then none", set)
	}
}
