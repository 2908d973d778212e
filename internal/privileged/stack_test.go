package privileged

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A call reads the answer into the heap, not into a buffer on its caller's
// stack: a 64 KiB one there grew the stack of the check's worker that
// asked (a goroutine that lives as long as the daemon) to 128 KiB at each
// call, zeroed page by page, and the collections after shrank it again, so
// the next call, minutes later, faulted the same pages back in (README,
// Cost: "The idle daemon's page faults"). The stacks in use, a goroutine
// parked after one call against one parked after none, the least of 5
// tries each (the helper's own goroutines come and go beside them).
func TestCallKeepsItsBufferOffTheCallersStack(t *testing.T) {
	c := serve(t, &Server{handler: func(context.Context, request) (response, int) {
		return response{Data: []byte("an answer")}, -1
	}})
	stacks := func(call bool) uint64 {
		least := ^uint64(0)
		for range 5 {
			parked, release := make(chan error), make(chan struct{})
			go func() {
				var err error
				if call {
					_, err = c.ask(context.Background(), request{Op: OpNVMeIdentify, Ctrl: "nvme0"})
				}
				parked <- err
				<-release
			}()
			if err := <-parked; err != nil {
				t.Fatal(err)
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			close(release)
			least = min(least, m.StackInuse)
		}
		return least
	}
	runtime.GC()
	without := stacks(false)
	with := stacks(true)
	// A call itself takes a few KiB of stack (the dial, the JSON): a
	// goroutine's 8 KiB grown to 16 or 32, to 64 under -race (make
	// test-race: 32 to 64 KiB more in use, where 48 failed 2 runs of 6);
	// the 64 KiB buffer on the stack grew it to 128 (128 to 160 KiB more
	// in use, with -race or without).
	if with > without+96<<10 {
		t.Errorf("stacks in use with a goroutine parked after a call: %d KiB, %d KiB after none: the call grew its caller's stack by %d KiB, want at most 96", with>>10, without>>10, (with-without)>>10)
	}
	t.Logf("stacks in use: %d KiB after a call, %d KiB after none", with>>10, without>>10)
}

// BenchmarkCallAnswer is one call to a helper in this process answering
// size bytes of data (JSON-encoded): the client's read of the answer.
//
//	go test ./internal/privileged -run '^$' -bench CallAnswer -benchmem
func BenchmarkCallAnswer(b *testing.B) {
	for _, size := range []int{1 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			data := make([]byte, size)
			c := serve(b, &Server{handler: func(context.Context, request) (response, int) {
				return response{Data: data}, -1
			}})
			for b.Loop() {
				if _, err := c.ask(context.Background(), request{Op: OpNVMeIdentify, Ctrl: "nvme0"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// An answer over maxResponse is refused, whatever the room call read it
// into had grown to.
func TestAnswerOverTheLimitIsRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(io.Discard, c) // the request, to its CloseWrite
		c.Write(bytes.Repeat([]byte(" "), maxResponse+1))
	}()
	_, _, err = (&Client{Path: p}).call(context.Background(), request{Op: OpNVMeIdentify, Ctrl: "nvme0"})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("answer over %d bytes", maxResponse)) {
		t.Errorf("an answer of %d bytes: %v, want it refused as over %d", maxResponse+1, err, maxResponse)
	}
}
