package privileged

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// A helper that refuses to start answers each request queued on its
// socket with the reason, read to its end first (the answer, not a reset,
// reaches the daemon), and leaves none queued: one would start it again as
// soon as it exited.
func TestRefuseAnswersEveryQueuedRequest(t *testing.T) {
	p := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []*net.UnixConn
	for _, op := range []string{OpKmsg, OpNVMeSMART, OpDMVerity} {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b, _ := json.Marshal(request{Op: op, Ctrl: "nvme0", Path: "/dev/mapper/control"})
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		c.CloseWrite()
		conns = append(conns, c)
	}
	const reason = "the privileged helper refuses to start: flag provided but not defined: -lvmm"
	if n := Refuse(l, reason); n != len(conns) {
		t.Errorf("Refuse answered %d requests, want %d", n, len(conns))
	}
	for i, c := range conns {
		b, err := io.ReadAll(c)
		if err != nil {
			t.Errorf("request %d: reading the answer: %v", i, err)
			continue
		}
		var resp response
		if err := json.Unmarshal(b, &resp); err != nil {
			t.Errorf("request %d: answer %q: %v", i, b, err)
			continue
		}
		if err := resp.err(); err == nil || err.Error() != reason || !errors.Is(err, ErrRefused) {
			t.Errorf("request %d: answered %v, want %q, ErrRefused", i, err, reason)
		}
	}
	// Nothing is left queued, and a client sees the reason as the helper's
	// error.
	if n := Refuse(l, reason); n != 0 {
		t.Errorf("a second Refuse answered %d requests, want none left queued", n)
	}
}
