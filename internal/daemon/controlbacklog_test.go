package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
)

// socketStart is a start's bind of one of its sockets, the control or the
// status socket.
type socketStart struct {
	name   string
	listen func(string) (interface{ Close() error }, error)
}

var socketStarts = []socketStart{
	{"control", func(p string) (interface{ Close() error }, error) { return listenControl(p, quietLog()) }},
	{"status", func(p string) (interface{ Close() error }, error) { return listenStatus(p) }},
}

// refused starts on sock, held as holder says, and returns
// the start's refusal; it fails t where the start took the socket, and
// where the socket file was replaced or removed.
func (s socketStart) refused(t *testing.T, sock, holder string) error {
	t.Helper()
	before, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.listen(sock)
	if err == nil {
		ln.Close()
		t.Fatalf("a start took the %s socket %s", s.name, holder)
	}
	if after, err := os.Stat(sock); err != nil || !os.SameFile(before, after) {
		t.Errorf("the %s socket file %s was replaced or removed (%v)", s.name, holder, err)
	}
	return err
}

// A running daemon that takes no connection (frozen, its backlog full: a
// connect fails at once, EAGAIN) is a daemon, not a stale socket: a second
// start refuses, the first's socket stays in place, for the control socket
// and the status socket alike. Before, the dial's EAGAIN read as nothing
// answering: the start removed the live daemon's socket and bound its own.
func TestStartDoesNotTakeTheSocketOfADaemonWithAFullBacklog(t *testing.T) {
	for _, tc := range socketStarts {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), tc.name+".sock")
			testenv.FullBacklogSocket(t, sock)
			err := tc.refused(t, sock, "of a daemon whose backlog is full")
			if !strings.Contains(err.Error(), "another daemon") {
				t.Errorf("the refusal: %v; want it to name another daemon", err)
			}
		})
	}
}

// A socket whose connect fails for a reason other than nothing listening
// (ECONNREFUSED) cannot be told stale: a datagram socket something holds
// (EPROTOTYPE), as EACCES from a daemon the start may not connect to. A
// start refuses, the socket kept, for the control and the status socket.
// Before, every such error read as a stale socket: the start removed it
// and bound its own.
func TestStartDoesNotTakeASocketItCannotTellIsStale(t *testing.T) {
	for _, tc := range socketStarts {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), tc.name+".sock")
			held, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			err = tc.refused(t, sock, "that a datagram socket holds")
			if !strings.Contains(err.Error(), "not known to be stale") || !strings.Contains(err.Error(), "ss -xlp src "+sock) {
				t.Errorf("the refusal: %v; want it to say the socket is not known to be stale and how to find its process", err)
			}
		})
	}
}

// A start that finds a daemon answering on its socket (one run by hand
// beside the unit's, or the unit's restarted every 5 s beside one run by
// hand) says how to find that daemon's process, as the refusals above do
// (README, "`status`: ask the running daemon": "the error, in the
// journal's `could not start` line, says how to find the process that
// holds it"), for the control and the status socket alike. Before, it said
// "another daemon is listening" and no more: the one case of the three
// where the operator most needs the process was the one not named.
func TestStartNamesHowToFindTheDaemonThatAnswers(t *testing.T) {
	for _, tc := range socketStarts {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), tc.name+".sock")
			held, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			err = tc.refused(t, sock, "that a daemon answers on")
			if !strings.Contains(err.Error(), "another daemon") || !strings.Contains(err.Error(), "ss -xlp src "+sock) {
				t.Errorf("the refusal: %v; want it to name another daemon and how to find its process", err)
			}
		})
	}
}
