package checks

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// h2Runtime is a CRI runtime of a few HTTP/2 frames of its own, for what
// grpc-go's server does not do on demand: a GOAWAY between two calls with
// the connection left open, a PING it waits for the answer of before it
// answers, and a header table of 0 bytes it holds its peer to (grpc-go's
// server only advertises SETTINGS_HEADER_TABLE_SIZE; its decoder keeps 4096).
type h2Runtime struct {
	ln         net.Listener
	tableSize0 bool // SETTINGS_HEADER_TABLE_SIZE 0, and a decoder of 0 bytes
	ping       bool // a PING before each answer, answered only once its ack came
	goaway     bool // a GOAWAY after a connection's first answer, the connection left open
	accepted   atomic.Int32
	answered   atomic.Int32
	mu         sync.Mutex
	errs       []error // what the runtime refused of the client
}

func serveH2Runtime(t *testing.T, r *h2Runtime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	r.ln = ln
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); r.serve(c) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return sock
}

func (r *h2Runtime) refuse(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

func (r *h2Runtime) refused() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

func (r *h2Runtime) serve(c net.Conn) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	bw := bufio.NewWriter(c)
	fr := http2.NewFramer(bw, bufio.NewReader(c))
	var tableSize uint32 = 4096
	var settings []http2.Setting
	if r.tableSize0 {
		tableSize = 0
		settings = append(settings, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
	}
	fr.ReadMetaHeaders = hpack.NewDecoder(tableSize, nil)
	fr.WriteSettings(settings...)
	bw.Flush()
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	block := func(fields ...string) []byte {
		hbuf.Reset()
		for i := 0; i < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return bytes.Clone(hbuf.Bytes())
	}
	msg, _ := proto.Marshal(conditions(&runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}))
	answer := func(id uint32) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: block(":status", "200", "content-type", "application/grpc")})
		fr.WriteData(id, false, frame(msg))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: block("grpc-status", "0")})
		bw.Flush()
		r.answered.Add(1)
	}
	gone := false
	var waiting uint32 // a stream whose answer awaits the PING's ack
	pingData := [8]byte{'c', 'r', 'i', 's', 'y', 'n', 'c'}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) || strings.Contains(err.Error(), "hpack") {
				r.refuse(err)
				fr.WriteGoAway(0, http2.ErrCode(ce), nil)
				bw.Flush()
			}
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
				bw.Flush()
			}
		case *http2.PingFrame:
			if f.IsAck() && f.Data == pingData && waiting != 0 {
				answer(waiting)
				waiting = 0
			}
		case *http2.MetaHeadersFrame:
			if path := f.PseudoValue("path"); path != criStatusPath {
				r.refuse(fmt.Errorf("stream %d: path %q", f.StreamID, path))
			}
		case *http2.DataFrame:
			if !f.StreamEnded() || gone {
				continue
			}
			if r.ping {
				waiting = f.StreamID
				fr.WritePing(false, pingData)
				bw.Flush()
				continue
			}
			answer(f.StreamID)
			if r.goaway {
				fr.WriteGoAway(f.StreamID, http2.ErrCodeNo, nil)
				bw.Flush()
				gone = true
			}
		}
	}
}

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
	r := &h2Runtime{goaway: true}
	c := newCRIClient(serveH2Runtime(t, r))
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
	r := &h2Runtime{ping: true}
	c := newCRIClient(serveH2Runtime(t, r))
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
	r := &h2Runtime{tableSize0: true}
	c := newCRIClient(serveH2Runtime(t, r))
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
	c.mu.Lock()
	kept := c.kept != nil
	c.mu.Unlock()
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
	c.mu.Lock()
	kept := c.kept
	c.mu.Unlock()
	if kept != nil {
		t.Error("the connection of a canceled call was kept")
	}
}
