package privileged

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeHelper answers one connection with peer (after the request, which
// it reads as read says) and returns the client and a channel closed when
// peer returned and its connection is closed.
func fakeHelper(t *testing.T, peer func(c *net.UnixConn)) (*Client, chan struct{}) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.AcceptUnix()
		l.Close()
		if err != nil {
			return
		}
		defer c.Close()
		peer(c)
	}()
	return &Client{Path: p}, done
}

// answerOf is a JSON answer of exactly size bytes (data of the most bytes
// that fit, then spaces), saying fd where a descriptor rides with it, and
// its data.
func answerOf(t *testing.T, size int, fd bool) ([]byte, []byte) {
	t.Helper()
	head, tail := `{"data":"`, `"}`
	if fd {
		tail = `","fd":true}`
	}
	n := base64.StdEncoding.DecodedLen(size-len(head)-len(tail)) / 3 * 3
	data := bytes.Repeat([]byte("autopilot"), n/9+1)[:n]
	b := []byte(head + base64.StdEncoding.EncodeToString(data) + tail)
	if len(b) > size {
		t.Fatalf("an answer of %d bytes does not fit %d", len(b), size)
	}
	return append(b, bytes.Repeat([]byte(" "), size-len(b))...), data
}

// sendSplit writes b in pieces of size piece, the descriptors of files
// (each opened by the peer and closed after) with the pieces files names.
func sendSplit(c *net.UnixConn, b []byte, piece int, files map[int][]string) {
	for i := 0; len(b) > 0; i++ {
		n := min(piece, len(b))
		var oob []byte
		var open []*os.File
		for _, name := range files[i] {
			f, err := os.Open(name)
			if err != nil {
				panic(err)
			}
			open = append(open, f)
		}
		if len(open) > 0 {
			fds := make([]int, len(open))
			for j, f := range open {
				fds[j] = int(f.Fd())
			}
			oob = unix.UnixRights(fds...)
		}
		// A write to a stream socket may take part of the piece; the
		// rest follows, the descriptors with the first part only.
		sent, _, err := c.WriteMsgUnix(b[:n], oob, nil)
		if err == nil && sent < n {
			_, err = c.Write(b[sent:n])
		}
		for _, f := range open {
			f.Close()
		}
		if err != nil {
			return
		}
		b = b[n:]
	}
}

func fileAt(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// An answer arrives whole whatever its size around the room call reads it
// into (4 KiB at first, doubled when less than half of 4 KiB is left, up
// to the limit's first byte over), in one piece or split across many
// reads, and the descriptor that rides with any of its pieces (the first,
// one in the middle, the last) comes with it; none is left open.
func TestAnswerOfEverySizeAndSplit(t *testing.T) {
	file := fileAt(t, "kmsg")
	var sizes []int
	for _, at := range []int{2 << 10, 4 << 10, 6 << 10, 8 << 10, 64 << 10} {
		sizes = append(sizes, at-1, at, at+1)
	}
	sizes = append(sizes, 64, maxResponse-1, maxResponse)
	for _, size := range sizes {
		pieces := []int{size, 4 << 10, 777}
		if size <= 8<<10+1 {
			pieces = append(pieces, 1)
		}
		if size >= maxResponse-1 {
			pieces = []int{1 << 20}
		}
		for _, piece := range pieces {
			count := (size + piece - 1) / piece
			ats := []int{0, count / 2, count - 1}
			if size >= maxResponse-1 {
				ats = ats[2:]
			}
			for _, at := range ats {
				name := fmt.Sprintf("%d bytes in pieces of %d, the descriptor with piece %d", size, piece, at)
				b, data := answerOf(t, size, true)
				before := openFDs(t)
				c, done := fakeHelper(t, func(c *net.UnixConn) {
					readRequest(c)
					sendSplit(c, b, piece, map[int][]string{at: {file}})
				})
				resp, fd, err := c.call(context.Background(), request{Op: OpKmsg})
				<-done
				if err != nil || !bytes.Equal(resp.Data, data) || !resp.FD || fd < 0 {
					t.Fatalf("%s: %d bytes of data (want %d), fd %v %d, %v", name, len(resp.Data), len(data), resp.FD, fd, err)
				}
				if !sameFile(t, fd, file) {
					t.Errorf("%s: the descriptor is not the file sent", name)
				}
				unix.Close(fd)
				if after := openFDs(t); after != before {
					t.Errorf("%s: %d descriptors open after, %d before", name, after, before)
				}
			}
		}
	}
}

// readRequest reads the request to the client's CloseWrite.
func readRequest(c *net.UnixConn) {
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// What goes wrong in an answer leaves no descriptor open: two descriptors
// (the last is kept), one piece with two (the first is kept), an answer
// over the limit with a descriptor, a helper that closes mid-answer, a
// read that fails after a descriptor came.
func TestAnswerGoneWrongLeavesNoDescriptor(t *testing.T) {
	first, second := fileAt(t, "first"), fileAt(t, "second")
	ok, _ := answerOf(t, 10<<10, true)
	over := bytes.Repeat([]byte(" "), maxResponse+1)
	for _, tc := range []struct {
		name string
		peer func(c *net.UnixConn)
		want string // the error, or the file whose descriptor comes
	}{
		{"two descriptors in two pieces", func(c *net.UnixConn) {
			readRequest(c)
			sendSplit(c, ok, 4<<10, map[int][]string{0: {first}, 2: {second}})
		}, second},
		{"two descriptors in one piece", func(c *net.UnixConn) {
			readRequest(c)
			sendSplit(c, ok, 4<<10, map[int][]string{1: {first, second}})
		}, first},
		{"over the limit", func(c *net.UnixConn) {
			readRequest(c)
			sendSplit(c, over, 1<<20, map[int][]string{0: {first}, 63: {second}})
		}, "answer over 67108864 bytes"},
		{"closed mid-answer", func(c *net.UnixConn) {
			readRequest(c)
			sendSplit(c, ok[:len(ok)/2], 4<<10, map[int][]string{0: {first}})
		}, "malformed answer"},
		{"closed before the answer", func(c *net.UnixConn) {
			readRequest(c)
		}, "no answer"},
		{"a read fails after the descriptor", func(c *net.UnixConn) {
			// The request left unread: the close resets the client's
			// side once it read what came before.
			c.Read(make([]byte, 1))
			sendSplit(c, ok[:4<<10], 4<<10, map[int][]string{0: {first}})
		}, "connection reset by peer"},
	} {
		before := openFDs(t)
		c, done := fakeHelper(t, tc.peer)
		_, fd, err := c.call(context.Background(), request{Op: OpKmsg})
		<-done
		if strings.HasPrefix(tc.want, "/") {
			if err != nil || fd < 0 || !sameFile(t, fd, tc.want) {
				t.Errorf("%s: fd %d, %v; want %s's", tc.name, fd, err, tc.want)
			}
			closeFD(fd)
		} else if err == nil || fd != -1 || !strings.Contains(err.Error(), tc.want) {
			closeFD(fd)
			t.Errorf("%s: fd %d, %v; want -1 and %q", tc.name, fd, err, tc.want)
		}
		if after := openFDs(t); after != before {
			t.Errorf("%s: %d descriptors open after, %d before", tc.name, after, before)
		}
	}
}

// Calls at once, each its own answer and descriptor (go test -race).
func TestConcurrentCallsKeepTheirAnswers(t *testing.T) {
	file := fileAt(t, "kmsg")
	sizes := []int{100, 4 << 10, 5000, 64 << 10, 300 << 10}
	before := openFDs(t)
	s := &Server{handler: func(_ context.Context, req request) (response, int) {
		var size int
		fmt.Sscanf(req.Ctrl, "nvme%d", &size)
		fd, err := unix.Open(file, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return errorResponse(err), -1
		}
		return response{Data: bytes.Repeat([]byte{byte(size)}, size), FD: true}, fd
	}}
	c := serve(t, s)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 10 {
				size := sizes[(g+i)%len(sizes)]
				resp, fd, err := c.call(context.Background(), request{Op: OpNVMeIdentify, Ctrl: fmt.Sprint("nvme", size)})
				if err != nil || resp.Error != "" || fd < 0 || !bytes.Equal(resp.Data, bytes.Repeat([]byte{byte(size)}, size)) {
					t.Errorf("call for %d bytes: %d bytes, fd %d, %v %s", size, len(resp.Data), fd, err, resp.Error)
				}
				closeFD(fd)
			}
		})
	}
	wg.Wait()
	if after := openFDs(t); after > before+2 {
		t.Errorf("%d descriptors open after 160 calls, %d before", after, before)
	}
}

// An answer over the limit is refused holding no more room than the
// limit's first byte over: the rooms call grew through (4 KiB doubled to
// 64 MiB, then 64 MiB and a byte) come to 192 MiB in all, where doubling
// once more, to 128 MiB, would make it 256 (README, Cost: "The idle
// daemon's page faults").
func TestAnswerOverTheLimitHoldsNoMoreRoom(t *testing.T) {
	over := bytes.Repeat([]byte(" "), maxResponse+4<<10)
	c, done := fakeHelper(t, func(c *net.UnixConn) {
		readRequest(c)
		c.Write(over)
	})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := c.call(context.Background(), request{Op: OpNVMeIdentify, Ctrl: "nvme0"})
	runtime.ReadMemStats(&after)
	<-done
	if err == nil || !strings.Contains(err.Error(), "answer over") {
		t.Fatalf("an answer of %d bytes: %v, want it refused", len(over), err)
	}
	rooms := 4<<10*(1<<15-1) + maxResponse + 1
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(rooms)+1<<20 {
		t.Errorf("refusing an answer over the limit allocated %d MiB, want the rooms' %d MiB (and under 1 MiB more)", got>>20, rooms>>20)
	}
}
