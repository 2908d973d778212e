package privileged

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/testenv"
)

// Out of descriptors, the helper's accepts fail with EMFILE (the
// connection stays in the backlog) for as long as that lasts: Serve tries
// again (with backoff: TestOutOfDescriptorsStopDuringABackoffAtOnce counts
// the tries on synctest's clock), logs it once, not once per try, and
// serves the waiting connection once descriptors are free again. Before, Serve returned the error and
// the helper exited (systemd started it again every second, its start-up
// lines with it, for as long as descriptors were short). Real descriptors:
// the test process's own RLIMIT_NOFILE lowered to what it holds.
func TestOutOfDescriptorsAcceptBacksOffAndServesOn(t *testing.T) {
	var logs testenv.SyncBuffer
	s := &Server{Log: slog.New(slog.NewTextHandler(&logs, nil))}
	p := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()

	// Every descriptor taken, the client's socket made before: the accept
	// finds none. The helper calls accept only once a connection is there.
	conn, free := dialWithNoDescriptorLeft(t, p)
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.AcceptFailures() < 6 {
		select {
		case err := <-done:
			free()
			t.Fatalf("Serve returned out of descriptors: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			free()
			t.Fatalf("%d failed accepts in 10 s out of descriptors; want 6", s.AcceptFailures())
		}
		time.Sleep(5 * time.Millisecond) // polling the count the serving goroutine keeps
	}
	free()
	if n := strings.Count(logs.String(), "accepting a connection failed"); n != 1 {
		t.Errorf("the failed accepts logged %d times, want once:\n%s", n, logs.String())
	}
	// Descriptors free again: a request is answered.
	c := &Client{Path: p}
	if _, err := c.Identify("nvme9"); err == nil || !strings.Contains(err.Error(), "nvme9") {
		t.Errorf("Identify after descriptors are free again: %v", err)
	}
	if !strings.Contains(logs.String(), "accepting connections again") {
		t.Errorf("no line says the accepts work again:\n%s", logs.String())
	}
	conn.Close() // else Serve waits out its 30 s deadline
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// dialWithNoDescriptorLeft connects a unix socket to p with every
// descriptor of the test process taken: the socket is made first, then
// RLIMIT_NOFILE is lowered to a few above what the process holds and every
// descriptor under it taken (dups of stdin up to EMFILE), then the socket
// connects, which takes none. Before, one descriptor was left for the
// dial's socket, and where another goroutine of the process took it first
// the dial failed (EMFILE, once in a CI run). free gives the descriptors
// back and restores the limit; it runs at the test's end too, as does
// closing the connection.
func dialWithNoDescriptorLeft(t *testing.T, p string) (conn io.Closer, free func()) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &fdCloser{fd: fd}
	t.Cleanup(func() { c.Close() })
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	var fill []int
	freed := false
	free = func() {
		if freed {
			return
		}
		freed = true
		for _, fd := range fill {
			unix.Close(fd)
		}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(free)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: uint64(openFDs(t) + 16), Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	for {
		fd, err := unix.Dup(0)
		if err != nil {
			break
		}
		fill = append(fill, fd)
	}
	if len(fill) == 0 {
		free()
		t.Fatal("no descriptor to take")
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: p}); err != nil {
		free()
		t.Fatalf("connecting to %s with no descriptor left: %v", p, err)
	}
	return c, free
}

// fdCloser closes a descriptor once.
type fdCloser struct {
	once sync.Once
	fd   int
}

func (c *fdCloser) Close() error {
	c.once.Do(func() { unix.Close(c.fd) })
	return nil
}
