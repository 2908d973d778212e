package privileged

import (
	"encoding/json"
	"io"
	"net"
	"time"
)

// refuseLinger is how long Refuse waits for one more connection once the
// queue is empty: the daemon's requests of one burst follow each other
// within milliseconds.
const refuseLinger = 200 * time.Millisecond

// refuseRead bounds the read of one request Refuse answers.
const refuseRead = time.Second

// Refuse answers every connection queued on l, and each that comes within
// refuseLinger of the last, with reason as the helper's error (ErrRefused
// on the daemon's side), and returns
// how many it answered. A helper that refuses to start (its command line)
// calls it before it exits, under its socket unit: a connection left in the
// queue would start it again as soon as it exited, and the daemon's request
// would wait for its answer until it timed out, not knowing why. Each
// request is read to its end before the answer (closed with unread data,
// the daemon's read would end on a reset, not on the answer).
func Refuse(l *net.UnixListener, reason string) int {
	out, _ := json.Marshal(response{Error: reason, Sentinel: "refused"})
	n := 0
	for {
		l.SetDeadline(time.Now().Add(refuseLinger))
		c, err := l.AcceptUnix()
		if err != nil {
			// The deadline: the queue is empty.
			return n
		}
		c.SetDeadline(time.Now().Add(refuseRead))
		io.Copy(io.Discard, io.LimitReader(c, maxRequest+1))
		c.Write(out)
		c.Close()
		n++
	}
}
