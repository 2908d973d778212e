package daemon

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The sockets a process listens on are read from the kernel's lists: this
// process's own listener, by the path it was bound to, also once its file
// is removed; a closed one, a datagram socket and a connection are not
// listed, and a process that is not there lists none.
func TestListeningSockets(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a b.sock"), filepath.Join(dir, "b.sock")
	la, err := net.Listen("unix", a)
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	lb, err := net.Listen("unix", b)
	if err != nil {
		t.Fatal(err)
	}
	gram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "g.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer gram.Close()
	conn, err := net.Dial("unix", a)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := ListeningSockets(os.Getpid())
	if !slices.Contains(got, a) || !slices.Contains(got, b) || slices.Contains(got, filepath.Join(dir, "g.sock")) {
		t.Errorf("listening: %q; want %s and %s, not the datagram socket", got, a, b)
	}
	os.Remove(a)
	lb.Close()
	got = ListeningSockets(os.Getpid())
	if !slices.Contains(got, a) || slices.Contains(got, b) {
		t.Errorf("after a's file removed and b closed: %q; want %s (its file removed) and not %s", got, a, b)
	}
	if got := ListeningSockets(1 << 30); got != nil {
		t.Errorf("no such process: %q", got)
	}
}
