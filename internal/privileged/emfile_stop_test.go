package privileged

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/sys/unix"
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
		var old unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
		restored := false
		restore := func() {
			if !restored {
				restored = true
				if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
					t.Fatal(err)
				}
			}
		}
		defer restore()
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(openFDs(t) + 16), Max: old.Max}); err != nil {
			t.Fatal(err)
		}
		var fill []int
		defer func() {
			for _, fd := range fill {
				unix.Close(fd)
			}
		}()
		for {
			fd, err := unix.Dup(0)
			if err != nil {
				break
			}
			fill = append(fill, fd)
		}
		if len(fill) == 0 {
			restore()
			t.Fatal("no descriptor to take")
		}
		// One given back for the client's socket, which waits in the
		// backlog before Serve starts: every accept fails with EMFILE, and
		// Serve never waits on the socket (synctest.Wait returns).
		unix.Close(fill[len(fill)-1])
		fill = fill[:len(fill)-1]
		conn, err := net.Dial("unix", p)
		if err != nil {
			restore()
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, l) }()
		time.Sleep(10*time.Second + 500*time.Millisecond) // Serve in a wait of 0.5-1 s
		synctest.Wait()
		n := s.AcceptFailures()
		restore()
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
