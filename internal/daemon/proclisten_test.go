package daemon

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// The kernel's lines: only listening stream sockets of the inodes given,
// with a path (not abstract, not unbound), a path with spaces whole (two in
// a row too: the kernel writes it as it is), an inode padded, and
// each once.
func TestParseUnixListeners(t *testing.T) {
	const list = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 101 /run/autopilot-health/control.sock
0000000000000000: 00000002 00000000 00010000 0001 01 102 /run/autopilot-health/status.sock
0000000000000000: 00000002 00000000 00010000 0001 01 103 /run/other.sock
0000000000000000: 00000002 00000000 00010000 0001 01 104 @abstract
0000000000000000: 00000003 00000000 00000000 0001 03 105 /run/connected.sock
0000000000000000: 00000002 00000000 00000000 0002 01 106 /run/dgram.sock
0000000000000000: 00000002 00000000 00010000 0005 01 110 /run/seqpacket.sock
0000000000000000: 00000002 00000000 00010000 0001 01 107
0000000000000000: 00000002 00000000 00010000 0001 01 108 /run/a b.sock
0000000000000000: 00000002 00000000 00010000 0001 01 109 /run/autopilot-health/control.sock
0000000000000000: 00000002 00000000 00010000 0001 01 111 /run/two  spaces.sock
0000000000000000: 00000002 00000000 00010000 0001 01   112 /run/padded inode.sock
`
	inodes := map[string]bool{"101": true, "102": true, "104": true, "105": true, "106": true, "107": true, "108": true, "109": true, "110": true, "111": true, "112": true}
	got := parseUnixListeners(strings.NewReader(list), inodes)
	want := []string{"/run/a b.sock", "/run/autopilot-health/control.sock", "/run/autopilot-health/status.sock", "/run/padded inode.sock", "/run/two  spaces.sock"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
