package systemd

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"

	godbus "github.com/godbus/dbus/v5"
)

// writeWatch is a job connection's socket, counting the writes that
// failed on it. godbus tells a call whose write failed by that write's
// error only when its reader has not closed the connection first: a bus
// that goes while a call is written (it reads the message cut short, drops
// it and closes) ends the reader with EOF, which godbus gives every call
// still waiting, and the write's own error, a moment later, finds the call
// already ended. The call's error is then the read's, which reads as a call
// systemd may have taken; the count says it was not sent whole.
//
// It also hands godbus the bus's messages whole (Read): godbus reads a
// connection that is not its own unix transport (its genericTransport)
// piecewise, and a read that fails between a message's header fields and
// their padding (the connection closed by the job's end, or by the bus,
// while a signal is read) is a panic in godbus v5.1.0 (DecodeMessageWithFDs'
// dec.align(8), outside its decoder's recover), which ends the daemon. Read
// whole, a message is decoded from memory, and a failed read reaches godbus
// at a message's first byte, where it returns it as an error.
type writeWatch struct {
	net.Conn
	failed atomic.Int64
	// msg is the rest of the message read whole (the reader's goroutine
	// only: godbus's auth, then its inWorker); framed once the bus's
	// first message began, after the auth's text lines.
	msg    []byte
	framed bool
}

// maxGodbusMessage is the D-Bus specification's limit on a message (2^27
// bytes), as godbus checks it.
const maxGodbusMessage = 1 << 27

func (w *writeWatch) Read(b []byte) (int, error) {
	if len(w.msg) == 0 {
		if err := w.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(b, w.msg)
	w.msg = w.msg[n:]
	return n, nil
}

// fill reads the next message whole into msg: its fixed 16 bytes, then its
// header fields (padded to 8) and body, as their lengths there say. Before
// the first message, the auth's lines (OK, REJECTED, DATA, ERROR,
// AGREE_UNIX_FD: none starts as a message does, 'l' or 'B') are passed on
// as read.
func (w *writeWatch) fill() error {
	var fixed [16]byte
	if !w.framed {
		n, err := w.Conn.Read(fixed[:1])
		if n == 0 {
			if err == nil {
				err = io.ErrNoProgress
			}
			return err
		}
		if fixed[0] != 'l' && fixed[0] != 'B' {
			more := make([]byte, 4096)
			m, _ := w.Conn.Read(more)
			w.msg = append(fixed[:1:1], more[:m]...)
			return nil
		}
		w.framed = true
		if _, err := io.ReadFull(w.Conn, fixed[1:]); err != nil {
			return err
		}
	} else if _, err := io.ReadFull(w.Conn, fixed[:]); err != nil {
		return err
	}
	order := binary.ByteOrder(binary.LittleEndian)
	if fixed[0] == 'B' {
		order = binary.BigEndian
	} else if fixed[0] != 'l' {
		return godbus.InvalidMessageError("invalid byte order")
	}
	body, fields := uint64(order.Uint32(fixed[4:8])), uint64(order.Uint32(fixed[12:16]))
	size := 16 + (fields+7)&^7 + body
	if size > maxGodbusMessage {
		return godbus.InvalidMessageError("message is too long")
	}
	msg := make([]byte, size)
	copy(msg, fixed[:])
	if _, err := io.ReadFull(w.Conn, msg[16:]); err != nil {
		return err
	}
	w.msg = msg
	return nil
}

func (w *writeWatch) Write(b []byte) (int, error) {
	n, err := w.Conn.Write(b)
	if err != nil {
		w.failed.Add(1)
	}
	return n, err
}

// watches holds the writeWatch of each open connection newBusConn made,
// by its godbus connection (removed once it is closed).
var watches sync.Map

// newBusConn makes an authenticated godbus connection over nc, an open
// connection to the bus, whose failed writes are counted (writesFailed).
func newBusConn(ctx context.Context, nc net.Conn) (*godbus.Conn, error) {
	w := &writeWatch{Conn: nc}
	c, err := authHello(godbus.NewConn(w, godbus.WithContext(ctx)))
	if err != nil {
		nc.Close()
		return nil, err
	}
	watches.Store(c, w)
	context.AfterFunc(c.Context(), func() { watches.Delete(c) })
	return c, nil
}

// writeCount sums the failed writes of conns' watches (those newBusConn
// made).
type writeCount []*writeWatch

func (wc *writeCount) add(c *godbus.Conn) {
	if w, ok := watches.Load(c); ok {
		*wc = append(*wc, w.(*writeWatch))
	}
}

func (wc writeCount) failed() int64 {
	var n int64
	for _, w := range wc {
		n += w.failed.Load()
	}
	return n
}

type writesKey struct{}

// writesFailed is the count of failed writes on the connections of the job
// ctx is for (0 where none is known).
func writesFailed(ctx context.Context) int64 {
	if wc, ok := ctx.Value(writesKey{}).(*writeCount); ok {
		return wc.failed()
	}
	return 0
}
