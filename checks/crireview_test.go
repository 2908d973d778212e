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
	"testing/synctest"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// scriptRuntime is a CRI runtime of scripted HTTP/2 frames, for what
// grpc-go's server does not do on demand. Each connection sends its
// SETTINGS, acknowledges the client's, and calls answer for each request
// whose frames all came (closeConn: the connection is then closed); answer
// writes what the script says, and may read the client's frames itself
// (awaitPingAck). tableSize0 makes it advertise SETTINGS_HEADER_TABLE_SIZE 0
// and decode with a table of 0 bytes (grpc-go's server only advertises it;
// its decoder keeps 4096); wrap wraps what it writes. What the runtime
// refused of the client (a connection error, a request not for
// RuntimeService/Status) is kept in refused, and fails the test.
type scriptRuntime struct {
	answer     func(p *scriptPeer, id uint32) (closeConn bool)
	wrap       func(net.Conn) net.Conn
	tableSize0 bool
	// window0 makes the runtime's SETTINGS_INITIAL_WINDOW_SIZE 0.
	window0  bool
	accepted atomic.Int32
	wg       sync.WaitGroup // its goroutines
	mu       sync.Mutex
	errs     []error
}

// scriptPeer is one connection of a scriptRuntime.
type scriptPeer struct {
	r    *scriptRuntime
	c    net.Conn
	bw   *bufio.Writer
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	n    int // requests answered on this connection
	msg  []byte
	// settingsAcked: the client acknowledged the runtime's SETTINGS.
	settingsAcked bool
}

func (p *scriptPeer) block(fields ...string) []byte {
	p.hbuf.Reset()
	for i := 0; i < len(fields); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(p.hbuf.Bytes())
}

func (p *scriptPeer) headers(id uint32, end bool, fields ...string) {
	p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: end, BlockFragment: p.block(fields...)})
}

// ok writes a healthy answer to stream id.
func (p *scriptPeer) ok(id uint32) {
	p.headers(id, false, ":status", "200", "content-type", "application/grpc")
	p.fr.WriteData(id, false, frame(p.msg))
	p.headers(id, true, "grpc-status", "0")
}

// writeAside writes b to the connection on a goroutine of its own, while
// the connection's reads go on: a flood whose acks the client writes as it
// reads does not fill both sockets' buffers and stall.
func (p *scriptPeer) writeAside(b []byte) {
	p.r.wg.Go(func() { p.c.Write(b) })
}

// awaitPingAck reads the client's frames until the ack of a PING of data
// (false: the connection ended first).
func (p *scriptPeer) awaitPingAck(data [8]byte) bool {
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			return false
		}
		if f, ok := f.(*http2.PingFrame); ok && f.IsAck() && f.Data == data {
			return true
		}
	}
}

func (r *scriptRuntime) refuse(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

func (r *scriptRuntime) refused() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// serveScript serves r on a new socket and returns its path.
func serveScript(t *testing.T, r *scriptRuntime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	wg := &r.wg
	var mu sync.Mutex
	var conns []net.Conn
	msg, _ := proto.Marshal(conditions(&runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}))
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
			go func() { defer wg.Done(); r.serve(c, msg) }()
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
		for _, err := range r.refused() {
			t.Errorf("runtime: %v", err)
		}
	})
	return sock
}

func (r *scriptRuntime) serve(c net.Conn, msg []byte) {
	defer c.Close()
	w := c
	if r.wrap != nil {
		w = r.wrap(c)
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	p := &scriptPeer{r: r, c: c, bw: bufio.NewWriter(w), msg: msg}
	p.fr = http2.NewFramer(p.bw, bufio.NewReader(c))
	p.enc = hpack.NewEncoder(&p.hbuf)
	var tableSize uint32 = 4096
	var settings []http2.Setting
	if r.tableSize0 {
		tableSize = 0
		settings = append(settings, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
	}
	if r.window0 {
		settings = append(settings, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	}
	p.fr.ReadMetaHeaders = hpack.NewDecoder(tableSize, nil)
	p.fr.WriteSettings(settings...)
	p.bw.Flush()
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) || strings.Contains(err.Error(), "hpack") {
				r.refuse(err)
				p.fr.WriteGoAway(0, http2.ErrCode(ce), nil)
				p.bw.Flush()
			}
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				p.settingsAcked = true
			} else {
				p.fr.WriteSettingsAck()
				p.bw.Flush()
			}
		case *http2.MetaHeadersFrame:
			if path := f.PseudoValue("path"); path != criStatusPath {
				r.refuse(fmt.Errorf("stream %d: path %q", f.StreamID, path))
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				closeConn := r.answer(p, f.StreamID)
				p.n++
				p.bw.Flush()
				if closeConn {
					return
				}
			}
		}
	}
}

// byteConn writes one byte a write: every frame comes split across reads.
type byteConn struct{ net.Conn }

func (c byteConn) Write(p []byte) (int, error) {
	for i := range p {
		if _, err := c.Conn.Write(p[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(p), nil
}

// What HTTP/2 allows a runtime and grpc-go's server does not do on demand,
// each answered on one kept connection (or, where the runtime closes or
// goes away, on as many as it makes): frames split across reads, SETTINGS
// changed mid-connection (frame size, header table, window, an unknown
// one), padding, a flood of 5,000 PINGs, RST_STREAM NO_ERROR after the
// trailers, unknown frame types, PRIORITY and WINDOW_UPDATEs, a header
// block in CONTINUATIONs, a close or GOAWAY with debug data after each
// answer, the message in 1-byte DATA frames.
func TestCRIProbeScriptedRuntimes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		answer    func(p *scriptPeer, id uint32) bool
		wrap      func(net.Conn) net.Conn
		wantConns int32
	}{
		{"split across reads", func(p *scriptPeer, id uint32) bool { p.ok(id); return false }, func(c net.Conn) net.Conn { return byteConn{c} }, 1},
		{"settings changed before each answer", func(p *scriptPeer, id uint32) bool {
			p.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: uint32(p.n % 2 * 4096)},
				http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}, http2.Setting{ID: 0x99, Val: 7})
			p.enc.SetMaxDynamicTableSizeLimit(uint32(256 * (p.n + 1)))
			p.ok(id)
			return false
		}, nil, 1},
		{"padded", func(p *scriptPeer, id uint32) bool {
			p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, PadLength: 200, BlockFragment: p.block(":status", "200", "content-type", "application/grpc")})
			p.fr.WriteDataPadded(id, false, frame(p.msg), make([]byte, 255))
			p.fr.WriteDataPadded(id, false, nil, make([]byte, 255))
			p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, PadLength: 1, BlockFragment: p.block("grpc-status", "0")})
			return false
		}, nil, 1},
		{"ping flood", func(p *scriptPeer, id uint32) bool {
			for i := range 5000 {
				p.fr.WritePing(false, [8]byte{byte(i), byte(i >> 8)})
			}
			p.ok(id)
			return false
		}, nil, 1},
		{"rst no_error after trailers", func(p *scriptPeer, id uint32) bool {
			p.ok(id)
			p.fr.WriteRSTStream(id, http2.ErrCodeNo)
			return false
		}, nil, 1},
		{"unknown frames and priority", func(p *scriptPeer, id uint32) bool {
			p.fr.WriteRawFrame(0xfa, 0, 0, []byte("x"))
			p.fr.WriteRawFrame(0xfb, 0xff, id, bytes.Repeat([]byte("y"), 1000))
			p.fr.WritePriority(id, http2.PriorityParam{StreamDep: 0, Weight: 7})
			p.headers(id, false, ":status", "200", "content-type", "application/grpc")
			p.fr.WriteRawFrame(0xfc, 0, id, nil)
			p.fr.WriteWindowUpdate(0, 100)
			p.fr.WriteWindowUpdate(id, 100)
			p.fr.WriteData(id, false, frame(p.msg))
			p.headers(id, true, "grpc-status", "0")
			return false
		}, nil, 1},
		{"continuation", func(p *scriptPeer, id uint32) bool {
			b := p.block(":status", "200", "content-type", "application/grpc", "x-big", strings.Repeat("z", 40000))
			// In frames of HTTP/2's default maximum, 16 KiB, or less.
			p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b[:10]})
			for b = b[10:]; len(b) > 16384; b = b[16384:] {
				p.fr.WriteContinuation(id, false, b[:16384])
			}
			p.fr.WriteContinuation(id, true, b)
			p.fr.WriteData(id, false, frame(p.msg))
			p.headers(id, true, "grpc-status", "0")
			return false
		}, nil, 1},
		{"closes after each answer", func(p *scriptPeer, id uint32) bool { p.ok(id); return true }, nil, 3},
		{"goaway with debug data after each answer, then closes", func(p *scriptPeer, id uint32) bool {
			p.ok(id)
			p.fr.WriteGoAway(id, http2.ErrCodeNo, []byte("max_age"))
			return true
		}, nil, 3},
		{"goaway before answering the second, then closes", func(p *scriptPeer, id uint32) bool {
			if p.n == 1 {
				p.fr.WriteGoAway(id-2, http2.ErrCodeNo, []byte("max_idle"))
				return true
			}
			p.ok(id)
			return false
		}, nil, 3},
		{"message split in 1-byte DATA frames", func(p *scriptPeer, id uint32) bool {
			p.headers(id, false, ":status", "200", "content-type", "application/grpc")
			for _, b := range frame(p.msg) {
				p.fr.WriteData(id, false, []byte{b})
			}
			p.headers(id, true, "grpc-status", "0")
			return false
		}, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &scriptRuntime{answer: tc.answer, wrap: tc.wrap}
			c := newCRIClient(serveScript(t, r))
			defer c.close()
			for i := range 3 {
				if err := probeH2(c); err != nil {
					t.Fatalf("probe %d: %v", i, err)
				}
			}
			if n := r.accepted.Load(); n != tc.wantConns {
				t.Errorf("%d connections, want %d", n, tc.wantConns)
			}
		})
	}
}

// A runtime that said GOAWAY after an answer (grpc-go's first GOAWAY of a
// graceful close: last stream 2^31-1, and a PING) and then reads requests
// but answers none (grpc-go's server past MaxConnectionAge's grace, which
// closes the connection a second later): the next call reads the GOAWAY
// before it sends its request, and is made on a new connection.
func TestCRIProbeAfterAGoAwayThatAnswersNoMore(t *testing.T) {
	r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
		if p.n == 0 {
			p.ok(id)
			p.fr.WriteGoAway(1<<31-1, http2.ErrCodeNo, []byte("max_age"))
			p.fr.WritePing(false, [8]byte{1, 6, 1, 8, 0, 3, 3, 9})
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
		t.Errorf("%d connections, %d calls made again; want 3 and 2", n, c.retried)
	}
}

// The same against grpc-go's server with MaxConnectionAge: a probe after
// the server's GOAWAY came is answered well within a second (the server
// would leave a request sent on the old connection unanswered for one).
func TestCRIProbeAfterMaxConnectionAge(t *testing.T) {
	sock, rl := servePadded(t, 1<<10, grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge: 50 * time.Millisecond, MaxConnectionAgeGrace: time.Millisecond}))
	c := newCRIClient(sock)
	defer c.close()
	for i := range 5 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		// Await the GOAWAY on the kept connection, read with the answer or
		// in its socket (none kept: the call read the GOAWAY itself).
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			kept := c.kept.peek()
			done := kept == nil || kept.br.Buffered() > 0 || rawsys.Pending(kept.conn)
			if done {
				break
			}
			if time.Now().After(end) {
				t.Fatal("no GOAWAY on the kept connection 5 s after MaxConnectionAge")
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := c.status(ctx)
		cancel()
		if err != nil {
			t.Fatalf("probe %d after the server's GOAWAY: %v", i, err)
		}
	}
	t.Logf("%d connections, %d calls made again", rl.accepted.Load(), c.retried)
}

// A frame longer than the 16 KiB a peer may send us (SETTINGS_MAX_FRAME_SIZE,
// which the client leaves at HTTP/2's default) is the runtime's protocol
// error, as grpc-go's client (kubelet's) takes it: the call fails at once
// and the connection is not kept. Before, the framer took frames of up to
// 16 MiB and kept a buffer of the largest read on the kept connection (an
// HTTP/1 answer's first bytes read as a 4.7 MB frame).
func TestCRIProbeRefusesAFrameLargerThanItsMaximum(t *testing.T) {
	r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
		p.fr.WriteRawFrame(0xfa, 0, 0, make([]byte, 16384+1))
		p.ok(id)
		return false
	}}
	c := newCRIClient(serveScript(t, r))
	defer c.close()
	err := probeH2(c)
	if err == nil || !strings.Contains(err.Error(), "code = Unavailable desc = http2: frame too large") {
		t.Fatalf("a runtime that sent a frame of 16,385 bytes: %v, want Unavailable, frame too large", err)
	}
	kept := c.kept.peek()
	if kept != nil || r.accepted.Load() != 1 {
		t.Errorf("after the frame too large: %d connections, one kept: %v; want 1, none kept", r.accepted.Load(), kept != nil)
	}
}

// A runtime that resets the call's stream (RST_STREAM) fails the probe with
// the gRPC code grpc-go's client (kubelet's) gives that HTTP/2 error code
// (its http2ErrConvTab) and its words, the same at every probe: before, every
// code was Unavailable "stream error: stream ID n; CODE; received from peer".
// A REFUSED_STREAM on a kept connection is made again on a new one.
func TestCRIProbeResetStreamWordedAsGRPCGo(t *testing.T) {
	for _, tc := range []struct {
		code http2.ErrCode
		want string
	}{
		{http2.ErrCodeCancel, "code = Canceled desc = stream terminated by RST_STREAM with error code: CANCEL"},
		{http2.ErrCodeRefusedStream, "code = Unavailable desc = stream terminated by RST_STREAM with error code: REFUSED_STREAM"},
		{http2.ErrCodeEnhanceYourCalm, "code = ResourceExhausted desc = stream terminated by RST_STREAM with error code: ENHANCE_YOUR_CALM"},
		{http2.ErrCodeFlowControl, "code = ResourceExhausted desc = stream terminated by RST_STREAM with error code: FLOW_CONTROL_ERROR"},
		{http2.ErrCodeInadequateSecurity, "code = PermissionDenied desc = stream terminated by RST_STREAM with error code: INADEQUATE_SECURITY"},
		{http2.ErrCodeInternal, "code = Internal desc = stream terminated by RST_STREAM with error code: INTERNAL_ERROR"},
		{http2.ErrCodeNo, "code = Internal desc = stream terminated by RST_STREAM with error code: NO_ERROR"},
		{0x42, "code = Unknown desc = stream terminated by RST_STREAM with error code: unknown error code 0x42"},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
				p.fr.WriteRSTStream(id, tc.code)
				return false
			}}
			sock := serveScript(t, r)
			c := newCRIClient(sock)
			defer c.close()
			want := "CRI RuntimeService/Status on " + sock + ": rpc error: " + tc.want
			for i := range 3 {
				if err := probeH2(c); err == nil || err.Error() != want {
					t.Fatalf("probe %d: %v\nwant %s", i, err, want)
				}
			}
		})
	}
}

// A runtime that floods the call with frames that carry nothing of its
// answer (20,000 PINGs, SETTINGS or DATA frames without data, each between
// the answer's headers and its message) fails the call once it has read
// criMaxNoise of them, and its connection is not kept; before, the call
// read and answered them all, held until its deadline by an endless flood.
// TestCRIProbeScriptedRuntimes' 5,000 PINGs a call are answered.
func TestCRIProbeBoundsAFloodOfFramesNotItsAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(fr *http2.Framer, id uint32)
	}{
		{"ping", func(fr *http2.Framer, _ uint32) { fr.WritePing(false, [8]byte{'f', 'l', 'o', 'o', 'd'}) }},
		{"settings", func(fr *http2.Framer, _ uint32) { fr.WriteSettings() }},
		{"data without data", func(fr *http2.Framer, id uint32) { fr.WriteData(id, false, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
				var b bytes.Buffer
				fr := http2.NewFramer(&b, nil)
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: p.block(":status", "200", "content-type", "application/grpc")})
				for range 2 * criMaxNoise {
					tc.write(fr, id)
				}
				fr.WriteData(id, false, frame(p.msg))
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: p.block("grpc-status", "0")})
				p.writeAside(b.Bytes())
				return false
			}}
			sock := serveScript(t, r)
			c := newCRIClient(sock)
			defer c.close()
			want := "CRI RuntimeService/Status on " + sock + ": rpc error: code = Unavailable desc = http2: the runtime sent more than 10000 frames in one call that carry nothing of its answer (PING, SETTINGS, DATA without data, ...)"
			for i := range 2 {
				if err := probeH2(c); err == nil || err.Error() != want {
					t.Fatalf("probe %d: %v\nwant %s", i, err, want)
				}
				kept := c.kept.peek()
				if kept != nil {
					t.Fatalf("probe %d: the flooded connection was kept", i)
				}
			}
			if n := r.accepted.Load(); n != 2 {
				t.Errorf("%d connections for 2 probes, want 2", n)
			}
		})
	}
}

// The client does not keep the runtime's flow-control windows for its
// request's 5 bytes of DATA: on a new connection they go out before the
// runtime's SETTINGS are read, as HTTP/2 allows (its defaults hold until
// then), but on a kept connection they go out whatever window the runtime
// gave. A runtime whose initial stream window is 0 (grpc-go's server, which
// containerd's is, gives 64 KiB) resets each later request, FLOW_CONTROL_ERROR:
// the kept connection's call is then made again on a new one, so every probe
// is answered, on a new connection each time. This test pins that.
func TestCRIProbeOfARuntimeWithAStreamWindowOf0(t *testing.T) {
	r := &scriptRuntime{window0: true, answer: func(p *scriptPeer, id uint32) bool {
		if p.settingsAcked {
			// Its window applies: the request's DATA exceeded 0 bytes.
			p.fr.WriteRSTStream(id, http2.ErrCodeFlowControl)
			return false
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
	if n := r.accepted.Load(); n != 3 || c.retried != 2 {
		t.Errorf("3 probes: %d connections, %d calls made again; want 3 and 2", n, c.retried)
	}
}

// A flood sent between calls (20,000 WINDOW_UPDATEs, which ask for no
// answer, after each connection's first answer, written before the runtime
// reads the next request) counts against the next call's bound, those read
// before its request included: that call fails on the kept connection and
// is made again on a new one, so every probe is answered and no flooded
// connection serves a second call.
func TestCRIProbeBoundsAFloodBetweenCalls(t *testing.T) {
	r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
		p.ok(id)
		if p.n == 0 {
			for range 2 * criMaxNoise {
				p.fr.WriteWindowUpdate(0, 1)
			}
		}
		return false
	}}
	c := newCRIClient(serveScript(t, r))
	defer c.close()
	for i := range 3 {
		if err := probeH2(c); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := r.accepted.Load(); n != 3 || c.retried != 2 {
		t.Errorf("3 probes, 20,000 WINDOW_UPDATEs after each connection's first answer: %d connections, %d calls made again; want 3 and 2", n, c.retried)
	}
}

// A header block in the middle of the answer's stream (after its response
// headers, not ending the stream) is the runtime's error, as kubelet's
// grpc-go client reads it (operateHeaders: Internal "a HEADERS frame cannot
// appear in the middle of a stream"): the call fails at the first such
// block and its connection is not kept. Before, each was read as the
// answer's trailers and the call read on, so 20,000 of them (frames that
// carry nothing of the answer, but were counted as its part) were all
// read, and an endless run of them held the probe until its deadline past
// the 10,000-frame bound.
func TestCRIProbeRefusesHeadersInTheMiddleOfTheStream(t *testing.T) {
	r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
		var b bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: p.block(":status", "200", "content-type", "application/grpc")})
		for range 2 * criMaxNoise {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: p.block("grpc-status", "0")})
		}
		fr.WriteData(id, false, frame(p.msg))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: p.block("grpc-status", "0")})
		p.writeAside(b.Bytes())
		return false
	}}
	sock := serveScript(t, r)
	c := newCRIClient(sock)
	defer c.close()
	want := "CRI RuntimeService/Status on " + sock + ": rpc error: code = Internal desc = a HEADERS frame cannot appear in the middle of a stream"
	for i := range 2 {
		if err := probeH2(c); err == nil || err.Error() != want {
			t.Fatalf("probe %d: %v\nwant %s", i, err, want)
		}
		kept := c.kept.peek()
		if kept != nil {
			t.Fatalf("probe %d: the connection was kept", i)
		}
	}
	if n := r.accepted.Load(); n != 2 {
		t.Errorf("%d connections for 2 probes, want 2", n)
	}
}

// A header block continued without end by CONTINUATION frames without a
// fragment, of the call's stream or of another, counts against the call's
// bound of frames that carry nothing of its answer: the call fails once it
// has read criMaxNoise of them, and its connection is not kept. The Framer
// joins a block's CONTINUATIONs inside one ReadFrame, where the call did
// not count them: before, it read them until its deadline (2 s here,
// DeadlineExceeded).
func TestCRIProbeBoundsAnEndlessHeaderBlock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other uint32 // added to the call's stream id
	}{{"its stream", 0}, {"another stream", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			r := &scriptRuntime{answer: func(p *scriptPeer, id uint32) bool {
				blk := p.block(":status", "200", "content-type", "application/grpc")
				c := p.c
				p.r.wg.Go(func() {
					// Its own Framer on the connection: the runtime's
					// reads go on, and a write fails once the client
					// closes the connection.
					fr := http2.NewFramer(c, nil)
					fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id + tc.other, BlockFragment: blk})
					for fr.WriteContinuation(id+tc.other, false, nil) == nil {
					}
				})
				return false
			}}
			sock := serveScript(t, r)
			c := newCRIClient(sock)
			defer c.close()
			want := "CRI RuntimeService/Status on " + sock + ": rpc error: code = Unavailable desc = http2: the runtime sent more than 10000 frames in one call that carry nothing of its answer (PING, SETTINGS, DATA without data, ...)"
			for i := range 2 {
				if err := probeH2(c); err == nil || err.Error() != want {
					t.Fatalf("probe %d: %v\nwant %s", i, err, want)
				}
				kept := c.kept.peek()
				if kept != nil {
					t.Fatalf("probe %d: the flooded connection was kept", i)
				}
			}
		})
	}
}

// A CANCEL reset that comes within 100 ms of the call's deadline is the
// runtime ending the call at the grpc-timeout the call sent (in whole
// milliseconds, rounded down, so a moment before the deadline): it is
// DeadlineExceeded, in words that say so; further from the deadline, or
// with none, it is Canceled as grpc-go words it, and another code near the
// deadline keeps its own.
func TestCRIResetCancelNearTheDeadline(t *testing.T) {
	near, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	far, cancel2 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		code http2.ErrCode
		want string
	}{
		{"cancel near", near, http2.ErrCodeCancel, "rpc error: code = DeadlineExceeded desc = context deadline exceeded (the server's grpc-timeout)"},
		{"cancel far", far, http2.ErrCodeCancel, "rpc error: code = Canceled desc = stream terminated by RST_STREAM with error code: CANCEL"},
		{"cancel no deadline", context.Background(), http2.ErrCodeCancel, "rpc error: code = Canceled desc = stream terminated by RST_STREAM with error code: CANCEL"},
		{"refused near", near, http2.ErrCodeRefusedStream, "rpc error: code = Unavailable desc = stream terminated by RST_STREAM with error code: REFUSED_STREAM"},
	} {
		if got := rstError(tc.ctx, tc.code).Error(); got != tc.want {
			t.Errorf("%s: %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

// The window's edge, on synctest's clock (time stands still in the bubble,
// so the deadline is exactly as far as set): 99 ms before the deadline is
// the runtime's grpc-timeout, 101 ms is a CANCEL of its own.
func TestCRIResetCancelWindowEdge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			left time.Duration
			want string
		}{
			{99 * time.Millisecond, "rpc error: code = DeadlineExceeded desc = context deadline exceeded (the server's grpc-timeout)"},
			{101 * time.Millisecond, "rpc error: code = Canceled desc = stream terminated by RST_STREAM with error code: CANCEL"},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), tc.left)
			if got := rstError(ctx, http2.ErrCodeCancel).Error(); got != tc.want {
				t.Errorf("%v before the deadline: %s\nwant %s", tc.left, got, tc.want)
			}
			cancel()
		}
	})
}
