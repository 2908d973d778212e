package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two daemons started at once (the unit's, restarted, and one an operator
// runs by hand) must not both take the control socket: the one that finds
// nothing answering and the other binding between its dial and its bind
// removed the other's fresh socket as stale and bound its own, and both ran
// on the same state directory, the first without a socket file (no reload,
// no tamper clear), the second unlinking the path at its stop. The other
// start is put in that gap (socketDialed) here: exactly one gets the
// socket, the other refuses naming it, and the socket file is the winner's.
func TestTwoDaemonsStartedAtOnceGetOneControlSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "control.sock")
	// A socket file left by a daemon that is gone (SIGKILL, a crash): the
	// case where each start removes what it finds.
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	var other net.Listener
	var otherErr error
	calls := 0
	socketDialed = func() {
		calls++
		if calls == 1 {
			// The second start, between the first's dial and its bind.
			other, otherErr = listenControl(sock, quietLog())
		}
	}
	t.Cleanup(func() { socketDialed = func() {} })
	first, firstErr := listenControl(sock, quietLog())
	for _, ln := range []net.Listener{first, other} {
		if ln != nil {
			defer ln.Close()
		}
	}
	if (first == nil) == (other == nil) {
		t.Fatalf("two starts at once: first %v (err %v), second %v (err %v); want exactly one listening", first != nil, firstErr, other != nil, otherErr)
	}
	refused := firstErr
	if first != nil {
		refused = otherErr
	}
	if refused == nil || !strings.Contains(refused.Error(), sock) || !strings.Contains(refused.Error(), "another daemon") {
		t.Errorf("the refused start: %v; want an error naming the socket and another daemon", refused)
	}
	// The winner answers on the path.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("the socket file is not the listening daemon's: %v", err)
	}
	c.Close()
}
