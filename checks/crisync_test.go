package checks

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// probeH2 is one probe with a 2 s deadline.
func probeH2(c *criClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.status(ctx)
}

// A runtime that went away gracefully between two calls (a GOAWAY whose
// last stream is the earlier call's, the connection still open) is not an
// outage: the call is made again on a new connection.
func TestCRIProbeAfterAGoAwayBetweenCalls(t *testing.T) {
	r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
		if p.n == 0 {
			p.ok(id)
			p.fr.WriteGoAway(id, http2.ErrCodeNo, nil)
		}
		return false // later requests: read, never answered
	}}
	c := newCRIClient(serveScript(t, r))
	defer c.close()
	for i := range 3 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := r.accepted.Load(); n != 3 || c.retried != 2 {
		t.Errorf("3 probes, a GOAWAY after each answer: %d connections, %d calls made again; want 3 and 2", n, c.retried)
	}
}

// A PING of the runtime's is answered, within the call that reads it.
func TestCRIProbeAnswersAPing(t *testing.T) {
	r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
		// A PING before each answer, answered only once its ack came.
		data := [8]byte{'c', 'r', 'i', 's', 'y', 'n', 'c'}
		p.fr.WritePing(false, data)
		p.bw.Flush()
		if !p.awaitPingAck(data) {
			return true
		}
		p.ok(id)
		return false
	}}
	c := newCRIClient(serveScript(t, r))
	defer c.close()
	for i := range 3 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := r.accepted.Load(); n != 1 {
		t.Errorf("%d connections for 3 probes, want 1", n)
	}
}

// A runtime whose header table holds nothing (SETTINGS_HEADER_TABLE_SIZE 0,
// its decoder of 0 bytes) decodes every call's headers: they do not use the
// dynamic table.
func TestCRIProbeOfARuntimeWithoutAHeaderTable(t *testing.T) {
	r := &scriptRuntime{tableSize0: true, answer: func(p *scriptPeer, id uint32) bool { p.ok(id); return false }}
	c := newCRIClient(serveScript(t, r))
	defer c.close()
	for i := range 3 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d: %v (the runtime refused: %v)", i, err, r.refused())
		}
	}
	if errs := r.refused(); len(errs) > 0 || r.accepted.Load() != 1 {
		t.Errorf("%d connections; the runtime refused %v", r.accepted.Load(), errs)
	}
}

// servePadded is a grpc-go CRI server whose answer carries info bytes of
// Info (the verbose map containerd fills with its configuration).
func servePadded(t *testing.T, info int, opts ...grpc.ServerOption) (string, *restartListener) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	rl := &restartListener{Listener: ln}
	s := grpc.NewServer(opts...)
	resp := conditions(&runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true})
	resp.Info = map[string]string{"config": strings.Repeat("x", info)}
	runtimeapi.RegisterRuntimeServiceServer(s, &criServer{status: func(context.Context) (*runtimeapi.StatusResponse, error) {
		return resp, nil
	}})
	go s.Serve(rl)
	t.Cleanup(s.Stop)
	return sock, rl
}

// An answer larger than the connection's window (700 KiB; HTTP/2's window
// is 65,535 bytes) is read whole: the window is given back as it is read.
func TestCRIProbeReadsALargeAnswer(t *testing.T) {
	sock, rl := servePadded(t, 700<<10)
	c := newCRIClient(sock)
	defer c.close()
	for i := range 3 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d of a 700 KiB answer: %v", i, err)
		}
	}
	if n := rl.accepted.Load(); n != 1 {
		t.Errorf("%d connections for 3 probes, want 1", n)
	}
}

// 200 calls on one connection whose answers (about 1 KiB each) sum past
// the connection's window of 65,535 bytes: what they consumed is given
// back, and the connection never runs dry.
func TestCRIProbeGivesTheWindowBackAcrossCalls(t *testing.T) {
	sock, rl := servePadded(t, 1<<10)
	c := newCRIClient(sock)
	defer c.close()
	for i := range 200 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := rl.accepted.Load(); n != 1 {
		t.Errorf("%d connections for 200 probes, want 1", n)
	}
}

// Calls made at once (a timed-out probe's goroutine still running as the
// next starts): each owns the connection it uses, another dials its own,
// and every call is answered (run it with -race).
func TestCRIProbeConcurrentCalls(t *testing.T) {
	sock, rl := servePadded(t, 1<<10)
	c := newCRIClient(sock)
	defer c.close()
	var wg sync.WaitGroup
	errs := make(chan error, 8*25)
	for range 8 {
		wg.Go(func() {
			for range 25 {
				if err := probeH2(c); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	kept := c.kept.peek() != nil
	t.Logf("200 calls from 8 goroutines: %d connections", rl.accepted.Load())
	if !kept || rl.accepted.Load() >= 100 {
		t.Errorf("after 200 calls from 8 goroutines: kept %v, %d connections; want one kept, and connections used again", kept, rl.accepted.Load())
	}
}

// The daemon's stop (the probe's context canceled) ends a call to a hung
// runtime (accepted, never answered) at once, worded as grpc-go words it,
// without waiting for a deadline: the call's context closes its connection.
func TestCRIProbeCanceledDuringAHungCall(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if conn, err := ln.Accept(); err == nil {
			accepted <- conn // never read, never answered
		}
	}()
	c := newCRIClient(sock)
	defer c.close()
	ctx, cancel := context.WithCancel(context.Background()) // no deadline
	done := make(chan error, 1)
	go func() { done <- c.status(ctx) }()
	conn := <-accepted
	defer conn.Close()
	cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "rpc error: code = Canceled desc = context canceled") {
			t.Errorf("canceled: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call to a hung runtime went on 10 s after its context was canceled")
	}
	kept := c.kept.peek()
	if kept != nil {
		t.Error("the connection of a canceled call was kept")
	}
}
