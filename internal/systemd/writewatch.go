package systemd

import (
	"context"
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
type writeWatch struct {
	net.Conn
	failed atomic.Int64
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
