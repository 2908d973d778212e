package privileged

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// A caller's cancel ends a call whose helper does not answer (stopped,
// wedged): the kernel log's open at the daemon's stop returns with the
// cancel, not after the client's 30 s. Before, only the deadline ended it.
func TestOpenKmsgReturnsAtTheCallersCancel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "helper.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // held open, never answered
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := (&Client{Path: path}).OpenKmsg(ctx)
		done <- err
	}()
	conn := <-accepted
	defer conn.Close()
	// The request read whole: the client waits for the answer.
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatal(err)
	}
	cancel()
	// A bound on a hang, not a timing: unanswered, the call waits 30 s.
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("OpenKmsg canceled: %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OpenKmsg has not returned 10 s after its context was canceled")
	}
}
