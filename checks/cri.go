package checks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// The CRI probe is one unary gRPC call, RuntimeService/Status, made as the
// gRPC wire protocol defines it (HTTP/2 without TLS on the runtime's unix
// socket, a length-prefixed protobuf message each way, the status in the
// trailers) with x/net's HTTP/2 Framer and hpack and protowire. The daemon
// does not link grpc-go and the CRI API's generated code for this one call:
// they cost about 5 MiB of its resident memory (see README, Cost).
//
// The call is made on the caller's goroutine: it writes its request's
// frames and reads the connection's until its stream's trailers, answering
// what HTTP/2 asks of a client on the way (SETTINGS' acks, PINGs, the
// connection's window). x/net's HTTP/2 Transport, which it replaces, ran a
// reader goroutine per connection and a goroutine per request: a probe cost
// the process 505-1,002 µs of CPU against 366-437 µs made so, its socket on
// a tmpfs (BenchmarkProbeCost, PROBECOST_DIR=/dev/shm; README, Cost). It
// makes one call on a connection at a time, which is all the probe needs.
// The tests call a real grpc-go server (checks/cri_test.go,
// keptconn*_test.go), runtimes of scripted frames for what grpc-go does not
// do on demand (crisync_test.go, crireview_test.go), and Debian's
// containerd (tests/).

const (
	criStatusPath = "/runtime.v1.RuntimeService/Status"
	// criRuntimeReady is the condition type kubelet requires to be true
	// (runtimeapi.RuntimeReady).
	criRuntimeReady = "RuntimeReady"
	// criMaxResponse bounds the response read (a Status answer is a few
	// hundred bytes; grpc-go's own default limit is 4 MiB).
	criMaxResponse = 1 << 20
)

// grpcCodes are the names of gRPC status codes, as grpc-go prints them.
var grpcCodes = [...]string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
	"Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// rpcError is a failed call, worded as grpc-go words it ("rpc error: code =
// DeadlineExceeded desc = ...").
type rpcError struct {
	code int
	desc string
}

func (e *rpcError) Error() string {
	name := "Code(" + strconv.Itoa(e.code) + ")"
	if e.code >= 0 && e.code < len(grpcCodes) {
		name = grpcCodes[e.code]
	}
	return "rpc error: code = " + name + " desc = " + e.desc
}

// criNotInitialized reports whether err is containerd's answer while its CRI
// plugin has not initialised yet: containerd tells systemd it is ready
// (Type=notify) and serves the socket before the plugin has restored its
// state, which can take seconds on a node with many containers, and until
// then the CRI's calls fail with Unknown "server is not initialized yet".
func criNotInitialized(err error) bool {
	var re *rpcError
	return errors.As(err, &re) && re.code == codeUnknown && re.desc == "server is not initialized yet"
}

const (
	codeCanceled          = 1
	codeUnknown           = 2
	codeDeadlineExceeded  = 4
	codePermissionDenied  = 7
	codeResourceExhausted = 8
	codeInternal          = 13
	codeUnavailable       = 14
)

// criCondition is one RuntimeCondition of a StatusResponse.
type criCondition struct {
	Type    string
	Status  bool
	Reason  string
	Message string
}

// criClient makes the CRI call over a connection it keeps between probes
// (HTTP/2, as kubelet's own gRPC client keeps one): a new connection for
// every probe cost a connect and the HTTP/2 preface and settings each time.
// The kept connection is used only while the socket it was made on is still
// at the path (a runtime that removed or replaced its socket is probed as a
// new client would find it), and a call whose kept connection fails before
// an answer (the runtime restarted since the last probe) is made once more
// on a new connection, so a restart is never taken for an outage.
//
// A call owns the connection while it runs, and it is closed once unused
// for keptConnIdle (keptSlot).
type criClient struct {
	socket string
	sock   *keptSocket
	// header is the request's header block but its grpc-timeout: fields
	// encoded as never-indexed literals, which leave the peer's header
	// table untouched, so that one block serves every connection whatever
	// its SETTINGS_HEADER_TABLE_SIZE.
	header []byte

	kept keptSlot[*h2Conn]
	mu   sync.Mutex // retried
	// retried counts the calls made again on a new connection (tests).
	retried int
}

const (
	// criStreamWindow is the flow-control window a stream of ours
	// starts with (SETTINGS_INITIAL_WINDOW_SIZE): more than the bound of
	// a response, so that a stream never waits for a WINDOW_UPDATE of its
	// own and an endless answer meets the bound, not a stall.
	criStreamWindow = criMaxResponse + 64<<10
	// criConnWindow is the connection's window (HTTP/2's initial one,
	// left as it is): what the calls' DATA consumed of it is given back
	// with the next request once it is a quarter of it, at once once it
	// is half of it (a large answer, read while it comes).
	criConnWindow = 65535
	// criMaxHeaderList bounds a header block's decoded fields
	// (SETTINGS_MAX_HEADER_LIST_SIZE; grpc-go's own default is 16 MiB).
	criMaxHeaderList = 64 << 10
	// criMaxFrame is the largest frame the runtime may send us
	// (SETTINGS_MAX_FRAME_SIZE, HTTP/2's initial 16 KiB, left as it is).
	criMaxFrame = 16 << 10
	// criMaxNoise bounds the frames a call reads that carry nothing of
	// its answer (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, DATA without
	// data, frames of other streams or of unknown types), those read
	// before its request included: past it the call fails and its
	// connection is dropped, so that a runtime flooding them does not
	// hold the probe until its deadline, each PING and SETTINGS answered.
	// 10,000 is what grpc-go (ControlBufferThrottleLimit: the acks it
	// queues before it stops reading) and x/net's server
	// (maxQueuedControlFrames: before it closes the connection) allow a
	// peer.
	criMaxNoise = 10000
)

// errFlood is a call that read more than criMaxNoise frames that carry
// nothing of its answer.
var errFlood = fmt.Errorf("http2: the runtime sent more than %d frames in one call that carry nothing of its answer (PING, SETTINGS, DATA without data, ...)", criMaxNoise)

// h2Conn is one HTTP/2 connection of the CRI call, read and written only by
// the call that owns it: no goroutine of its own. Frames the runtime sends
// after an answer (a PING, a WINDOW_UPDATE, a GOAWAY) wait in the socket
// until the next call reads them, before it sends its request (readPending).
type h2Conn struct {
	conn net.Conn
	// writeFailed: a write of what the answer's frames asked of us (an
	// acknowledgement) failed; the answer is still read, the connection
	// not kept.
	writeFailed bool
	bw          *bufio.Writer
	br          *bufio.Reader
	fr          *http2.Framer
	hbuf        []byte
	next        uint32 // the next stream's id
	used        bool   // an earlier call was answered on it (kept)
	goaway      bool   // the runtime sent GOAWAY: no new stream
	// unacked is what DATA consumed of the connection's window and no
	// WINDOW_UPDATE gave back yet.
	unacked uint32
	// noise counts the frames this call read that carry nothing of its
	// answer (criMaxNoise).
	noise int
}

// newCRIClient makes the CRI call's client.
func newCRIClient(socket string) *criClient {
	c := &criClient{socket: socket}
	c.sock = newKeptSocket(socket, c)
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [...][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", criStatusPath},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	c.header = b.Bytes()
	return c
}

// CloseIdleConnections closes the kept connection (keptSocket's check).
func (c *criClient) CloseIdleConnections() { c.close() }

// close closes the kept connection; a call running keeps its own.
func (c *criClient) close() { c.kept.close() }

// Close closes h's connection (keptSlot).
func (h *h2Conn) Close() error { return h.conn.Close() }

// keptSocket is the unix socket a transport keeps a connection to between
// probes (the CRI call's, cilium-agent's API): it dials the path and
// remembers which socket file it reached, and same tells whether that file
// is still the one at the path. A service that removed or replaced its
// socket is then probed as a new client would find it, not over the kept
// connection to what may be its old process.
//
// The connection's reads and writes are raw (rawsys), and so is the stat of
// every probe (same) where the socket's path stays in memory
// (rawsys.InMemory, asked at the dial): a probe does not wake the runtime's
// monitor thread. A path through a symbolic link (cilium's default
// /var/run/cilium/cilium.sock) is stat'ed the usual way, following the link
// as it is at each probe: a link pointed at another socket is noticed.
type keptSocket struct {
	path string
	tr   idleCloser // the transport that keeps the connection
	// dialed is the socket file the kept connection was made on
	// (dialedOK: the stat at the dial found one); raw: the stat of
	// every probe is a raw one.
	mu       sync.Mutex
	dialed   rawsys.FileID
	dialedOK bool
	raw      bool
	// dialer connects to the path (nil: dialUnix; tests replace it).
	dialer func(ctx context.Context, network, address string) (net.Conn, error)
}

// idleCloser is a transport that keeps connections (net/http's; the CRI
// call's criClient).
type idleCloser interface{ CloseIdleConnections() }

// newKeptSocket makes a keptSocket of path for tr: an *http.Transport
// dials through it; another transport's dial must call its dial.
func newKeptSocket(path string, tr idleCloser) *keptSocket {
	k := &keptSocket{path: path, tr: tr}
	if t, ok := tr.(*http.Transport); ok {
		t.DialContext = k.dial
	}
	return k
}

// dial is the transport's DialContext.
func (k *keptSocket) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	// The file before the connect: a socket made anew between the two is
	// then not taken for the one connected to. Whether later probes may
	// stat it raw is asked only of a socket found: InMemory resolves the
	// path's links (an lstat a component, a readlink a link), which a
	// probe of a socket not there (cilium-agent's on a node without it,
	// every 30 s) made for nothing
	// (TestKeptSocketDialOfAnAbsentSocketResolvesNoLinks).
	id, serr := statID(k.path, false)
	raw := serr == nil && rawsys.InMemory(k.path)
	dialer := k.dialer
	if dialer == nil {
		dialer = func(ctx context.Context, _, path string) (net.Conn, error) { return dialUnix(ctx, path) }
	}
	conn, err := dialer(ctx, "unix", k.path)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return nil, &socketDeniedError{err}
		}
		return nil, err
	}
	k.mu.Lock()
	k.dialed, k.dialedOK, k.raw = id, serr == nil, raw
	k.mu.Unlock()
	return conn, nil
}

// sunPathMax is the size of a unix socket address's path (sun_path): a
// path of that length or longer is no address connect(2) takes.
const sunPathMax = len(unix.RawSockaddrUnix{}.Path)

// dialUnix connects to the unix socket at path. A path too long for a
// socket address (sunPathMax: a socket under a deep host_root) is
// connected through an O_PATH descriptor of the socket
// (/proc/self/fd/<fd>, which the kernel follows to the socket file): before,
// the connect failed with EINVAL ("invalid argument") and a healthy
// service was reported unreachable. Errors name path.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	if len(path) < sunPathMax {
		return rawsys.Dial(ctx, "unix", path)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: &os.SyscallError{Syscall: "open", Err: err}}
	}
	defer unix.Close(fd)
	conn, err := rawsys.Dial(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	var oe *net.OpError
	if errors.As(err, &oe) {
		oe.Addr = &net.UnixAddr{Name: path, Net: "unix"}
	}
	return conn, err
}

// socketDeniedError is a connect to a service's socket that the kernel
// refused (EACCES, EPERM): `autopilot-health check` run without sudo
// (containerd's and cilium-agent's sockets are root's, 0660), or a root
// that SELinux or AppArmor refuses. It says nothing of the service's
// health: the probe's run fails (Unknown, CheckFailed), it is not True,
// and nothing is restarted for it.
type socketDeniedError struct{ err error }

func (e *socketDeniedError) Error() string {
	if probeUID() == 0 {
		return e.err.Error() + " (to root: SELinux or AppArmor refuses it, or the socket's owner, mode or ACL, past which the daemon's unit gives it no capability; so its service's health is not known)"
	}
	return e.err.Error() + " (run it as root: this user may not connect to the socket, so its service's health is not known)"
}

func (e *socketDeniedError) Unwrap() error { return e.err }

// socketDenied returns the refused connect in err, if it is one.
func socketDenied(err error) (*socketDeniedError, bool) {
	var d *socketDeniedError
	return d, errors.As(err, &d)
}

// probeUID is the user a probe connects as (os.Geteuid).
var probeUID = os.Geteuid

// same reports whether the socket at the path is the one last dialed.
func (k *keptSocket) same() bool {
	k.mu.Lock()
	dialed, ok, raw := k.dialed, k.dialedOK, k.raw
	k.mu.Unlock()
	if !ok {
		return false // nothing dialed (or no file found at the dial)
	}
	id, err := statID(k.path, raw)
	return err == nil && id == dialed
}

// check drops the kept connection when the socket at the path is not the
// one it was made on (removed, or made anew by a restarted service): call
// it before each probe.
func (k *keptSocket) check() {
	if !k.same() {
		k.tr.CloseIdleConnections()
	}
}

// statID is the file at path's FileID: by a raw stat where the path's
// lookup stays in memory (raw), else by os.Stat.
func statID(path string, raw bool) (rawsys.FileID, error) {
	if raw {
		return rawsys.Stat(path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return rawsys.FileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return rawsys.FileID{}, fmt.Errorf("stat %s: no device and inode", path)
	}
	return rawsys.FileID{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}

func (c *criClient) status(ctx context.Context) error {
	conds, err := c.call(ctx)
	if err != nil {
		return fmt.Errorf("CRI RuntimeService/Status on %s: %w", c.socket, err)
	}
	for _, cond := range conds {
		if cond.Type == criRuntimeReady {
			if !cond.Status {
				return fmt.Errorf("CRI RuntimeService/Status on %s: RuntimeReady is false: %s %s", c.socket, cond.Reason, cond.Message)
			}
			return nil
		}
	}
	// As kubelet judges it: a runtime that does not say it is ready is not.
	return fmt.Errorf("CRI RuntimeService/Status on %s: no RuntimeReady condition in the answer", c.socket)
}

// call makes the call and returns the runtime's conditions: once more on a
// new connection when a kept one failed without an answer.
func (c *criClient) call(ctx context.Context) ([]criCondition, error) {
	c.sock.check()
	conds, stale, err := c.callOnce(ctx)
	if stale && ctx.Err() == nil {
		c.mu.Lock()
		c.retried++
		c.mu.Unlock()
		conds, _, err = c.exchange(ctx, nil)
	}
	return conds, err
}

// callOnce makes the call on the kept connection, or a new one; stale says
// it failed without an answer on a connection kept from an earlier call.
func (c *criClient) callOnce(ctx context.Context) (conds []criCondition, stale bool, err error) {
	return c.exchange(ctx, c.kept.take())
}

// errStale words a connection that took no new stream: gone away below
// our stream, or between calls.
var errStale = errors.New("connection lost")

// exchange makes the call on h (nil: a new connection), and keeps the
// connection after a whole answer. The call's context ends it: its end
// closes the connection, which a read or write waiting on it then returns
// from (a deadline set on the connection would not end a wait on a
// connection without deadlines, and the connection's state midway through
// a frame is not one to keep); a hung runtime that never reads holds
// nothing past the call's deadline.
func (c *criClient) exchange(ctx context.Context, h *h2Conn) (conds []criCondition, stale bool, err error) {
	reused := h != nil
	if h == nil {
		conn, err := c.sock.dial(ctx, "unix", c.socket)
		if err != nil {
			return nil, false, transportError(ctx, err)
		}
		h = newH2Conn(conn)
	}
	if tr := httptrace.ContextClientTrace(ctx); tr != nil && tr.GotConn != nil {
		tr.GotConn(httptrace.GotConnInfo{Conn: h.conn, Reused: reused})
	}
	stop := context.AfterFunc(ctx, func() { h.conn.Close() })
	conds, answered, keep, err := h.roundTrip(ctx, c.header)
	if !stop() || ctx.Err() != nil || h.goaway || h.writeFailed || h.next >= 1<<31-1 {
		keep = false // closed by the context, or no further stream on it
	}
	if keep {
		h.used = true
		c.kept.put(h)
	} else {
		h.conn.Close()
	}
	var re *rpcError
	if err != nil && !errors.As(err, &re) {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		err = transportError(ctx, err)
	}
	return conds, reused && !answered && ctx.Err() == nil, err
}

func newH2Conn(conn net.Conn) *h2Conn {
	h := &h2Conn{conn: conn, bw: bufio.NewWriterSize(conn, 1024), br: bufio.NewReaderSize(conn, 4096), next: 1}
	h.fr = http2.NewFramer(h.bw, &frameCounter{r: h.br, h: h})
	// A frame longer than HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which
	// the client does not raise, is the runtime's error, as grpc-go's client
	// (kubelet's) reads it; the Framer's own limit is 16 MiB, and it keeps a
	// buffer of the largest frame read for the connection's life.
	h.fr.SetMaxReadFrameSize(criMaxFrame)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.fr.MaxHeaderListSize = criMaxHeaderList
	h.fr.SetReuseFrames()
	h.bw.WriteString(http2.ClientPreface)
	h.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: criStreamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: criMaxHeaderList})
	return h
}

// roundTrip sends the request on a new stream and reads frames until its
// answer: answered says the runtime answered the stream (its headers came),
// keep that the connection may serve another call. err is the call's
// failure: an *rpcError of the answer, else the connection's.
func (h *h2Conn) roundTrip(ctx context.Context, header []byte) (conds []criCondition, answered, keep bool, err error) {
	h.noise = 0
	if h.used {
		if err := h.readPending(); err != nil {
			return nil, false, false, err
		}
	}
	if h.goaway || h.next >= 1<<31-1 {
		return nil, false, false, errStale
	}
	id := h.next
	h.next += 2
	if h.unacked >= criConnWindow/4 {
		h.fr.WriteWindowUpdate(0, h.unacked)
		h.unacked = 0
	}
	h.hbuf = append(h.hbuf[:0], header...)
	if dl, ok := ctx.Deadline(); ok {
		// The server gives up when we do (kubelet's client sends it too).
		timeout := strconv.FormatInt(max(time.Until(dl).Milliseconds(), 1), 10) + "m"
		h.hbuf = hpackLiteral(h.hbuf, "grpc-timeout", timeout)
	}
	h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hbuf, EndHeaders: true})
	// The request message (StatusRequest{verbose: false}) is empty: the
	// frame is its 5-byte prefix alone.
	var empty [5]byte
	h.fr.WriteData(id, true, empty[:])
	if err := h.bw.Flush(); err != nil {
		return nil, false, false, err
	}
	httpStatus := 0
	var header2, trailer http.Header
	var body []byte
	for {
		// What the answer's frames asked of us (SETTINGS' and PINGs'
		// acks, WINDOW_UPDATEs) goes out before a read would wait; what
		// the last read asked goes out with the next call's request, in
		// the same write.
		if h.bw.Buffered() > 0 && h.readBuffered() < 9 && !h.writeFailed {
			if err := h.bw.Flush(); err != nil {
				// A runtime that answered and closed at once (a GOAWAY
				// after the answer) refuses our acknowledgement of its
				// SETTINGS with EPIPE while its answer waits in our socket:
				// it is read; a read that finds no answer fails the call.
				h.writeFailed = true
			}
		}
		f, err := h.fr.ReadFrame()
		if err != nil {
			return nil, answered, false, err
		}
		if !answerOf(f, id) {
			if err := h.countNoise(); err != nil {
				return nil, answered, false, err
			}
		}
		h.answerControl(f)
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			h.goaway = true
			if f.LastStreamID < id {
				// Our stream will not be answered: the runtime stops
				// (a graceful stop, an idle close).
				return nil, false, false, fmt.Errorf("%w: http2: server sent GOAWAY and closed the connection; LastStreamID=%v, ErrCode=%v, debug=%q",
					errStale, f.LastStreamID, f.ErrCode, f.DebugData())
			}
		case *http2.RSTStreamFrame:
			if f.StreamID != id {
				continue
			}
			return nil, false, false, rstError(ctx, f.ErrCode)
		case *http2.DataFrame:
			if f.StreamID != id {
				continue
			}
			if !answered {
				return nil, false, false, errors.New("http2: DATA before the response's headers")
			}
			body = append(body, f.Data()...)
			if len(body) > criMaxResponse {
				_, err := parseCRIStatus(httpStatus, header2, trailer, body)
				return nil, true, false, err
			}
			if f.StreamEnded() {
				conds, err := parseCRIStatus(httpStatus, header2, nil, body)
				return conds, true, true, err
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID != id {
				continue
			}
			if f.Truncated {
				return nil, answered, false, fmt.Errorf("http2: response header list larger than %d bytes", criMaxHeaderList)
			}
			if !answered {
				answered = true
				httpStatus, _ = strconv.Atoi(f.PseudoValue("status"))
				header2 = grpcFields(f)
				if httpStatus != http.StatusOK {
					// Not a gRPC answer: its body is not read.
					_, err := parseCRIStatus(httpStatus, header2, nil, nil)
					return nil, true, false, err
				}
			} else {
				if !f.StreamEnded() {
					// Trailers end the stream: a second header
					// block that does not is the runtime's error,
					// as grpc-go's client (kubelet's) reads it,
					// not one more part of the answer (an
					// endless run of them would be read until
					// the call's deadline, past criMaxNoise).
					return nil, true, false, &rpcError{codeInternal, "a HEADERS frame cannot appear in the middle of a stream"}
				}
				trailer = grpcFields(f)
			}
			if f.StreamEnded() {
				conds, err := parseCRIStatus(httpStatus, header2, trailer, body)
				return conds, true, true, err
			}
		}
	}
}

// readPending reads, without waiting for more, the frames the runtime sent
// on a kept connection since the last call, before a request is sent on
// it: a GOAWAY among them makes the call a new connection's. grpc-go's
// server, past MaxConnectionAge and its grace, says GOAWAY (its first, of
// last stream 2^31-1) and then reads a new stream but never answers it,
// closing the connection a second later: a request sent after that GOAWAY
// waited that second, or the call's whole deadline where it was shorter
// (TestCRIProbeAfterMaxConnectionAge). What the frames ask (a PING's ack)
// goes out with the request.
func (h *h2Conn) readPending() error {
	for h.br.Buffered() > 0 || rawsys.Pending(h.conn) {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return err
		}
		if err := h.countNoise(); err != nil {
			return err
		}
		h.answerControl(f)
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			h.goaway = true
			return fmt.Errorf("%w: http2: server sent GOAWAY between calls; LastStreamID=%v, ErrCode=%v, debug=%q",
				errStale, f.LastStreamID, f.ErrCode, f.DebugData())
		}
	}
	return nil
}

// answerOf reports whether f carries part of the answer to stream id: its
// header blocks, DATA with data, its reset.
func answerOf(f http2.Frame, id uint32) bool {
	if f.Header().StreamID != id {
		return false
	}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame, *http2.RSTStreamFrame:
		return true
	case *http2.DataFrame:
		return len(f.Data()) > 0
	}
	return false
}

// countNoise counts a frame that carries nothing of the call's answer:
// errFlood past criMaxNoise.
func (h *h2Conn) countNoise() error {
	h.noise++
	if h.noise > criMaxNoise {
		return errFlood
	}
	return nil
}

// frameCounter passes the runtime's bytes from the connection to the
// Framer and counts against the call's bound (countNoise) each
// CONTINUATION frame without a fragment: the Framer joins a header block's
// CONTINUATIONs inside one ReadFrame (ReadMetaHeaders), where the call does
// not see them, and keeps reading empty ones however many come (x/net's
// bound on a header block is of its size), so a runtime sending them
// without end held the call until its deadline. Past the bound the next
// read fails (a failure returned with the bytes of a whole frame header
// would be dropped by io.ReadFull).
type frameCounter struct {
	r    io.Reader
	h    *h2Conn
	hdr  [9]byte
	nhdr int    // bytes of the current frame header passed
	left uint32 // bytes of the current frame's payload still to pass
	err  error  // the bound was passed: every later read fails
}

func (c *frameCounter) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	for b := p[:n]; len(b) > 0; {
		if c.left > 0 {
			k := min(uint32(len(b)), c.left)
			c.left -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.nhdr:], b)
		c.nhdr += k
		b = b[k:]
		if c.nhdr < len(c.hdr) {
			continue
		}
		c.nhdr = 0
		c.left = uint32(c.hdr[0])<<16 | uint32(c.hdr[1])<<8 | uint32(c.hdr[2])
		if http2.FrameType(c.hdr[3]) == http2.FrameContinuation && c.left == 0 && c.err == nil {
			c.err = c.h.countNoise()
		}
	}
	return n, err
}

// answerControl does what a frame asks of the connection, whichever call
// reads it: SETTINGS and PINGs acknowledged, DATA (this call's or an
// earlier stream's) counted against the connection's window, given back at
// once once half of it is used. What it writes is buffered: it goes out
// before a read would wait, or with the next request.
func (h *h2Conn) answerControl(f http2.Frame) {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			h.fr.WriteSettingsAck()
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			h.fr.WritePing(true, f.Data)
		}
	case *http2.DataFrame:
		h.unacked += f.Length
		if h.unacked >= criConnWindow/2 {
			h.fr.WriteWindowUpdate(0, h.unacked)
			h.unacked = 0
		}
	}
}

// readBuffered is what the connection's reader holds already read.
func (h *h2Conn) readBuffered() int { return h.br.Buffered() }

// grpcFields are a header block's gRPC status fields.
func grpcFields(f *http2.MetaHeadersFrame) http.Header {
	hd := http.Header{}
	for _, hf := range f.RegularFields() {
		if hf.Name == "grpc-status" || hf.Name == "grpc-message" {
			hd.Add(hf.Name, hf.Value)
		}
	}
	return hd
}

// hpackLiteral appends a never-indexed literal header field with a literal
// name (RFC 7541 6.2.3) to b; no Huffman coding.
func hpackLiteral(b []byte, name, value string) []byte {
	b = hpackString(append(b, 0x10), name)
	return hpackString(b, value)
}

func hpackString(b []byte, s string) []byte {
	// A 7-bit prefix integer (RFC 7541 5.1): our strings are short.
	n := len(s)
	if n < 127 {
		b = append(b, byte(n))
	} else {
		b = append(b, 127)
		for n -= 127; n >= 128; n >>= 7 {
			b = append(b, byte(n&0x7f|0x80))
		}
		b = append(b, byte(n))
	}
	return append(b, s...)
}

// transportError maps a failed exchange to the code grpc-go gives it.
func transportError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return &rpcError{codeDeadlineExceeded, "context deadline exceeded"}
	case errors.Is(err, context.Canceled):
		return &rpcError{codeCanceled, "context canceled"}
	}
	if d, ok := socketDenied(err); ok {
		return d
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &rpcError{codeUnavailable, "connection error: " + op.Error()}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return &rpcError{codeUnavailable, err.Error()}
}

// rstCodes is grpc-go's mapping of the HTTP/2 error code of an RST_STREAM
// that ends a call's stream to the call's gRPC code (http2ErrConvTab in its
// internal/transport/http_util.go, v1.85.0); a code past it is Unknown.
var rstCodes = [...]int{
	http2.ErrCodeNo:                 codeInternal,
	http2.ErrCodeProtocol:           codeInternal,
	http2.ErrCodeInternal:           codeInternal,
	http2.ErrCodeFlowControl:        codeResourceExhausted,
	http2.ErrCodeSettingsTimeout:    codeInternal,
	http2.ErrCodeStreamClosed:       codeInternal,
	http2.ErrCodeFrameSize:          codeInternal,
	http2.ErrCodeRefusedStream:      codeUnavailable,
	http2.ErrCodeCancel:             codeCanceled,
	http2.ErrCodeCompression:        codeInternal,
	http2.ErrCodeConnect:            codeInternal,
	http2.ErrCodeEnhanceYourCalm:    codeResourceExhausted,
	http2.ErrCodeInadequateSecurity: codePermissionDenied,
	http2.ErrCodeHTTP11Required:     codeInternal,
}

// rstError is the call's failure when the runtime reset its stream, worded
// as grpc-go's client (kubelet's) words it: the code by rstCodes, the
// HTTP/2 error code named, no stream id (the same words at every probe).
// A reset, whatever its code, is no answer: on a kept connection the call
// is made again once on a new one (criClient.call), where grpc-go makes
// again only a stream refused (REFUSED_STREAM) or gone away.
func rstError(ctx context.Context, code http2.ErrCode) *rpcError {
	c := codeUnknown
	if int(code) < len(rstCodes) {
		c = rstCodes[code]
	}
	// The server resets the stream (CANCEL) when the grpc-timeout we sent
	// runs out, which may be a moment before our own deadline (the timeout
	// is sent in whole milliseconds, rounded down); grpc-go's client says
	// DeadlineExceeded for a CANCEL past its deadline.
	if dl, ok := ctx.Deadline(); ok && c == codeCanceled && time.Until(dl) < 100*time.Millisecond {
		return &rpcError{codeDeadlineExceeded, "context deadline exceeded (the server's grpc-timeout)"}
	}
	return &rpcError{c, "stream terminated by RST_STREAM with error code: " + code.String()}
}

// parseCRIStatus reads a unary gRPC response to RuntimeService/Status: the
// HTTP status, the grpc-status in the headers (a trailers-only answer) or the
// trailers, and one length-prefixed StatusResponse.
func parseCRIStatus(httpStatus int, header, trailer http.Header, body []byte) ([]criCondition, error) {
	if len(body) > criMaxResponse {
		return nil, &rpcError{codeInternal, fmt.Sprintf("response larger than %d bytes", criMaxResponse)}
	}
	if httpStatus != http.StatusOK {
		// The gRPC spec's mapping of HTTP statuses that are not a gRPC answer.
		code := codeUnknown
		switch httpStatus {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout, http.StatusTooManyRequests:
			code = codeUnavailable
		}
		return nil, &rpcError{code, "unexpected HTTP status code received from server: " + strconv.Itoa(httpStatus)}
	}
	st := trailer.Get("Grpc-Status")
	msg := trailer.Get("Grpc-Message")
	if st == "" {
		st, msg = header.Get("Grpc-Status"), header.Get("Grpc-Message")
	}
	if st == "" {
		return nil, &rpcError{codeInternal, "server closed the stream without sending trailers"}
	}
	code, err := strconv.Atoi(st)
	if err != nil || code < 0 {
		return nil, &rpcError{codeUnknown, fmt.Sprintf("malformed grpc-status %q", st)}
	}
	if code != 0 {
		if m, err := url.PathUnescape(msg); err == nil {
			msg = m
		}
		return nil, &rpcError{code, msg}
	}
	if len(body) < 5 {
		return nil, &rpcError{codeInternal, fmt.Sprintf("response of %d bytes has no message", len(body))}
	}
	if body[0] != 0 {
		return nil, &rpcError{codeInternal, "compressed response (none was asked for)"}
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if uint64(n) != uint64(len(body)-5) {
		return nil, &rpcError{codeInternal, fmt.Sprintf("response frame says %d bytes, %d follow", n, len(body)-5)}
	}
	conds, err := parseStatusResponse(body[5:])
	if err != nil {
		return nil, &rpcError{codeInternal, "parsing StatusResponse: " + err.Error()}
	}
	return conds, nil
}

// parseStatusResponse decodes runtime.v1.StatusResponse (api.proto):
// status = 1 (RuntimeStatus: conditions = 1, repeated RuntimeCondition:
// type = 1, status = 2, reason = 3, message = 4); other fields are skipped.
func parseStatusResponse(b []byte) ([]criCondition, error) {
	var conds []criCondition
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
			if num != 1 || typ != protowire.BytesType {
				return nil
			}
			var c criCondition
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					c.Type = string(v)
				case num == 2 && typ == protowire.VarintType:
					c.Status = x != 0
				case num == 3 && typ == protowire.BytesType:
					c.Reason = string(v)
				case num == 4 && typ == protowire.BytesType:
					c.Message = string(v)
				}
				return nil
			})
			conds = append(conds, c)
			return err
		})
	})
	return conds, err
}

// eachField calls f for each field of a protobuf message: v is the payload
// of a length-delimited field, x the value of a varint.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}
