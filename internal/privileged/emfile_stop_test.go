package privileged

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"
)

// The helper stopped (SIGTERM: Serve's context ends) while it waits
// between failed accepts returns at once, not after the wait (up to 1 s):
// systemd's stop of the helper is not held up by a run of EMFILE. Real
// descriptors, as TestOutOfDescriptorsAcceptBacksOffAndServesOn; the waits
// on synctest's clock.
func TestOutOfDescriptorsStopDuringABackoffAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &Server{Log: slog.New(slog.DiscardHandler)}
		p := filepath.Join(t.TempDir(), "helper.sock")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		// Every descriptor taken, the client's socket made before, which
		// waits in the backlog before Serve starts: every accept fails with
		// EMFILE, and Serve never waits on the socket (synctest.Wait
		// returns).
		conn, free := dialWithNoDescriptorLeft(t, p)
		defer conn.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, l) }()
		time.Sleep(10*time.Second + 500*time.Millisecond) // Serve in a wait of 0.5-1 s
		synctest.Wait()
		n := s.AcceptFailures()
		free()
		if n < 8 || n > 8+2*11 {
			t.Errorf("%d failed accepts in 10.5 s out of descriptors; want 8 (5 ms doubling to 1 s, each 0.5-1 times that) to 30", n)
		}
		start := time.Now()
		cancel()
		synctest.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		default:
			<-done
			t.Errorf("Serve returned %v after its context ended, not at once", time.Since(start))
		}
	})
}
