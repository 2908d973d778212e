package privileged

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// A helper's answer that comes with the kernel log's descriptor while the
// caller is being canceled (the daemon's stop) leaves no descriptor open:
// one the client has already received is closed when the cancel ends the
// exchange; one still in flight goes with the socket; one whose call
// returned it anyway (the whole answer read before the cancel ended the
// read) is the caller's to close, as the kernel log reader does.
func TestDescriptorAnsweredAtTheCancelIsNotLeaked(t *testing.T) {
	for _, tc := range []struct {
		name string
		// received: the cancel comes after the client has the descriptor
		// and waits for the answer's end; else the answer (with its end)
		// is sent as the cancel comes.
		received bool
	}{{"received, then canceled", true}, {"answered as canceled", false}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "helper.sock")
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			// Each answer carries a descriptor of a file of its own: one
			// open in this process after the fake helper closed its copy
			// is the client's (or leaked). Looked for by name, not by a
			// count that other descriptors' churn would upset.
			dir := t.TempDir()
			under := func(l string) bool { return strings.HasPrefix(l, dir+"/") }
			for i := range 50 {
				answer := filepath.Join(dir, fmt.Sprint("answer", i))
				if err := os.WriteFile(answer, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				read := make(chan struct{}) // the fake helper has the request
				send := make(chan struct{}) // let it answer
				sent := make(chan struct{}) // its answer sent, its copy closed
				returned := make(chan struct{})
				go func() {
					c, err := ln.AcceptUnix()
					if err != nil {
						return
					}
					defer c.Close()
					io.ReadAll(c)
					close(read)
					<-send
					f, err := os.Open(answer)
					if err != nil {
						return
					}
					c.WriteMsgUnix([]byte(`{"fd":true}`), unix.UnixRights(int(f.Fd())), nil)
					f.Close()
					close(sent)
					if tc.received {
						<-returned // the answer's end comes after the call returned
					}
				}()
				ctx, cancel := context.WithCancel(context.Background())
				type result struct {
					fd  int
					err error
				}
				done := make(chan result, 1)
				go func() {
					fd, err := (&Client{Path: path}).OpenKmsg(ctx)
					done <- result{fd, err}
				}()
				<-read
				if tc.received {
					close(send)
					<-sent
					// The client has the descriptor (the sender's copy
					// closed).
					for deadline := time.Now().Add(10 * time.Second); len(fdsOf(t, func(l string) bool { return l == answer })) == 0; runtime.Gosched() {
						if time.Now().After(deadline) {
							t.Fatal("the client has not received the answer's descriptor in 10 s")
						}
					}
					cancel()
				} else {
					close(send)
					cancel()
				}
				r := <-done
				close(returned)
				if r.err == nil {
					if tc.received {
						t.Fatalf("OpenKmsg canceled before its answer ended returned descriptor %d, no error", r.fd)
					}
					unix.Close(r.fd) // the caller's, as the reader closes it
				} else if !errors.Is(r.err, context.Canceled) {
					t.Fatalf("OpenKmsg canceled: %v; want context.Canceled", r.err)
				}
			}
			// An answer in flight goes with its connection, which the
			// fake helper closes as it ends.
			for deadline := time.Now().Add(10 * time.Second); len(fdsOf(t, under)) > 0; runtime.Gosched() {
				if time.Now().After(deadline) {
					t.Fatalf("after 50 canceled calls answered with a descriptor, open: %v", fdsOf(t, under))
				}
			}
		})
	}
}

// fdsOf returns this process's open descriptors of the files whose path
// matches.
func fdsOf(t *testing.T, match func(path string) bool) []string {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && match(l) {
			out = append(out, e.Name()+" -> "+l)
		}
	}
	return out
}
