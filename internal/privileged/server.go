package privileged

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/backoff"
	"github.com/syself/autopilot-health/internal/hostio"
)

// Server answers the daemon's requests.
type Server struct {
	Log *slog.Logger
	// KmsgPath is the kernel log (default /dev/kmsg).
	KmsgPath string
	// DevDir holds the NVMe controllers (default /dev).
	DevDir string
	// DMControl is the device-mapper control node (default
	// /dev/mapper/control), the only one the helper opens; DMControlRdev
	// the device number it must have (default 10:236, MAPPER_CTRL_MINOR).
	DMControl     string
	DMControlRdev uint64
	// LVM is the lvm binary (default /usr/sbin/lvm), the only program the
	// helper runs: the daemon's lvm_command must name it.
	LVM string
	// MaxConcurrent bounds the requests handled at once (default 4), and
	// 16 times it the connections open at once.
	MaxConcurrent int
	// Idle, when set, is called each time the last open connection closes:
	// the daemon asks in bursts (the kernel log at its start, then its
	// 2- and 5-minute checks), and the helper lets go between them of what
	// a burst touched (its main). It must not block.
	Idle func()

	mu sync.Mutex
	// served counts the requests answered, by operation (Served).
	served map[string]int
	// open counts the connections open.
	open int
	// acceptFailures counts the accepts that failed and were tried again
	// (AcceptFailures).
	acceptFailures int
	// inFlight: the call running on each resource (inFlightKey), hung or
	// not; one at a time per resource.
	inFlight map[string]*call

	// Tests: hungAfter replaces answerBy; handler replaces handle;
	// returned is called after a hung call returned and its key is free.
	hungAfter func(request) time.Duration
	handler   func(context.Context, request) (response, int)
	returned  func(key string)
}

// call is the call in flight on one resource.
type call struct {
	what  string // its operation ("nvme-smart", "lvm vgs")
	since time.Time
	// done is closed when it returns; hung when it is found hung (both
	// under Server.mu, hung with abandoned set).
	done, hung chan struct{}
	// abandoned: no one waits for its answer any more (found hung, or the
	// helper stops), so it cleans up after itself. Under Server.mu.
	abandoned bool
}

// requestTimeout bounds a request's exchange (an LVM report has its own
// timeout, at most 5 min, on top).
const requestTimeout = 30 * time.Second

// maxLVMTimeout is the longest timeout of an LVM report the helper runs.
const maxLVMTimeout = 5 * time.Minute

// scanTimeout bounds a scan's exchange, on both sides.
const scanTimeout = 5 * time.Minute

// opTimeout is how long the client of req waits for its answer: a scan at
// its cap digests up to 10,000 files; an LVM report has its own timeout on
// top of the exchange's.
func opTimeout(req request) time.Duration {
	switch req.Op {
	case OpLVM:
		// A bad one is refused, in time: one out of range counts as the
		// most allowed, not as itself (which could overflow the sum).
		return requestTimeout + min(max(req.Timeout, 0), maxLVMTimeout)
	case OpScan:
		return scanTimeout
	}
	return requestTimeout
}

// answerMargin: a call not done this long before its client stops waiting
// (opTimeout) is hung, and the client is told so while it still listens.
const answerMargin = 3 * time.Second

// answerBy is how long after its request was read a call may run, slot
// wait included, before it is found hung (opTimeout less answerMargin).
func (s *Server) answerBy(req request) time.Duration {
	if s.hungAfter != nil {
		return s.hungAfter(req)
	}
	return opTimeout(req) - answerMargin
}

var nvmeCtrl = regexp.MustCompile(`^nvme[0-9]+$`)

// inFlightKey names what req touches that can hang in the kernel, where no
// context reaches it: the NVMe controller (open and the admin ioctl of a
// dead drive), the lvm binary (an lvm in D state, which no kill reaps), the
// device-mapper control node (its ioctls wait on the devices' locks), the
// host's root for a scan (stat and read of a hung filesystem), the kernel
// log. "": nothing that can hang (a request refused before any I/O).
func (s *Server) inFlightKey(req request) string {
	switch req.Op {
	case OpKmsg:
		return s.kmsgPath()
	case OpNVMeIdentify, OpNVMeSMART:
		if !nvmeCtrl.MatchString(req.Ctrl) {
			return ""
		}
		return s.nvmeDev(req.Ctrl)
	case OpDMVerity:
		if req.Path != s.dmControl() {
			return ""
		}
		return req.Path
	case OpLVM:
		return s.lvm()
	case OpScan:
		return "/"
	}
	return ""
}

func describe(req request) string {
	if req.Op == OpLVM && req.Command != "" {
		return req.Op + " " + req.Command
	}
	return req.Op
}

// claim registers req's call on key, once no other call is in flight there:
// it waits (holding no work slot) for a call that is running, until
// deadline. A call already found hung refuses at once: refusal is the
// answer. No call and no refusal: the client gave up or the helper stops.
func (s *Server) claim(ctx context.Context, key string, req request, deadline time.Time) (c *call, refusal string) {
	for {
		s.mu.Lock()
		prev := s.inFlight[key]
		if prev == nil {
			if s.inFlight == nil {
				s.inFlight = map[string]*call{}
			}
			c = &call{what: describe(req), since: time.Now(), done: make(chan struct{}), hung: make(chan struct{})}
			s.inFlight[key] = c
			s.mu.Unlock()
			return c, ""
		}
		s.mu.Unlock()
		select {
		case <-prev.hung:
			return nil, fmt.Sprintf("%s on %s: the previous call (%s) has not returned since %s; not asked again until it does",
				req.Op, key, prev.what, prev.since.UTC().Format(time.RFC3339))
		default:
		}
		wait := time.NewTimer(time.Until(deadline))
		select {
		case <-prev.done:
		case <-prev.hung:
		case <-wait.C:
			return nil, fmt.Sprintf("%s on %s: the previous call (%s, since %s) is still running",
				req.Op, key, prev.what, prev.since.UTC().Format(time.RFC3339))
		case <-ctx.Done():
			wait.Stop()
			return nil, ""
		}
		wait.Stop()
	}
}

// run calls handle for req on its own goroutine and waits for it until
// deadline. A call still running then is hung: it is logged, its key stays
// in flight (claim refuses it) until it returns, and it closes the
// descriptor it may return then; the caller gives its work slot back.
func (s *Server) run(ctx context.Context, key string, c *call, req request, deadline time.Time) (response, int, bool) {
	type result struct {
		resp response
		fd   int
	}
	res := make(chan result, 1)
	handle := s.handle
	if s.handler != nil {
		handle = s.handler
	}
	go func() {
		resp, fd := handle(ctx, req)
		s.mu.Lock()
		delete(s.inFlight, key)
		late := c.abandoned
		if !late {
			res <- result{resp, fd}
		}
		close(c.done)
		s.mu.Unlock()
		if !late {
			return
		}
		closeFD(fd)
		if isClosed(c.hung) {
			s.Log.Info("a hung call returned; its resource is asked again", "op", c.what, "key", key,
				"since", c.since, "took", time.Since(c.since).Round(time.Millisecond))
		}
		if s.returned != nil {
			s.returned(key)
		}
	}()
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	var stopping bool
	select {
	case r := <-res:
		return r.resp, r.fd, true
	case <-wait.C:
	case <-ctx.Done():
		stopping = true
	}
	s.mu.Lock()
	if isClosed(c.done) { // it returned meanwhile: its answer is there
		s.mu.Unlock()
		r := <-res
		return r.resp, r.fd, true
	}
	c.abandoned = true
	if !stopping {
		close(c.hung)
	}
	s.mu.Unlock()
	if stopping {
		return response{}, -1, false
	}
	took := time.Since(c.since).Round(time.Second)
	s.Log.Warn("a call is hung: its work slot is given back, and its resource is not asked again until it returns",
		"op", c.what, "key", key, "since", c.since)
	return response{Error: fmt.Sprintf("%s on %s: no answer within %s; the call is hung in the helper, and %s is not asked again until it returns",
		req.Op, key, took, key)}, -1, true
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Serve answers on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l *net.UnixListener) error {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	n := s.MaxConcurrent
	if n <= 0 {
		n = 4
	}
	work := make(chan struct{}, n)
	conns := make(chan struct{}, 16*n)
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	// A failed accept (out of descriptors, EMFILE or ENFILE; out of socket
	// memory, ENOBUFS or ENOMEM; a connection's pending error) is tried
	// again after net/http's wait, 5 ms doubling to 1 s, and logged once
	// per kind of error in a run of failures: returning would exit the
	// helper, and systemd would start it again every second (RestartSec=)
	// for as long as the descriptors are short, its start-up lines with it.
	run := backoff.Failures{Backoff: backoff.Backoff{Min: 5 * time.Millisecond, Max: time.Second}}
	for {
		select {
		case conns <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		c, err := l.AcceptUnix()
		if err != nil {
			<-conns
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			s.mu.Lock()
			s.acceptFailures++
			s.mu.Unlock()
			wait, first := run.Failed(err)
			if first {
				s.Log.Warn("accepting a connection failed; retrying with backoff", "err", err, "retry_in", wait.Round(time.Millisecond))
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		if n := run.Worked(); n > 0 {
			s.Log.Info("accepting connections again", "failed_accepts", n)
		}
		wg.Add(1)
		s.mu.Lock()
		s.open++
		s.mu.Unlock()
		go func() {
			defer wg.Done()
			defer func() { <-conns }()
			defer s.closed()
			s.serveConn(ctx, c, work)
		}()
	}
}

// closed counts a connection closed and calls Idle when it was the last.
func (s *Server) closed() {
	s.mu.Lock()
	s.open--
	idle := s.open == 0
	s.mu.Unlock()
	if idle && s.Idle != nil {
		s.Idle()
	}
}

// AcceptFailures returns how many accepts failed and were tried again.
func (s *Server) AcceptFailures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acceptFailures
}

// Open returns how many connections are open.
func (s *Server) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// Served returns how many requests of op were answered.
func (s *Server) Served(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served[op]
}

// serveConn checks the peer and reads its request (a peer that sends
// nothing holds a connection, not one of the work slots), then waits for a
// work slot to answer it.
func (s *Server) serveConn(ctx context.Context, c *net.UnixConn, work chan struct{}) {
	defer c.Close()
	start := time.Now()
	c.SetDeadline(start.Add(requestTimeout))
	uid, err := peerUID(c)
	if err != nil || (uid != 0 && uid != uint32(os.Getuid())) {
		s.Log.Warn("refused a request: the peer is not root", "uid", uid, "err", err)
		return
	}
	b, err := io.ReadAll(io.LimitReader(c, maxRequest+1))
	if err != nil {
		s.Log.Warn("reading a request failed", "err", err)
		return
	}
	var req request
	var resp response
	fd := -1
	switch {
	case len(b) > maxRequest:
		resp = response{Error: "request too large"}
	case json.Unmarshal(b, &req) != nil:
		resp = response{Error: "malformed request"}
	default:
		var ok bool
		if resp, fd, ok = s.serveRequest(ctx, c, req, start, work); !ok {
			return
		}
	}
	if fd >= 0 {
		defer unix.Close(fd)
		resp.FD = true
	}
	out, err := json.Marshal(resp)
	if err != nil {
		out, _ = json.Marshal(response{Error: "encoding the answer: " + err.Error()})
		fd = -1
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	// One sendmsg on a stream socket writes what the send buffer takes
	// (about 200 KiB): the descriptor rides with the first part, the rest
	// follows.
	n, _, err := c.WriteMsgUnix(out, oob, nil)
	if err == nil && n < len(out) {
		_, err = c.Write(out[n:])
	}
	if err != nil {
		s.Log.Warn("answering a request failed", "op", req.Op, "err", err)
		return
	}
	s.mu.Lock()
	if s.served == nil {
		s.served = map[string]int{}
	}
	s.served[req.Op]++
	s.mu.Unlock()
	if resp.Error != "" {
		s.Log.Debug("request failed", "op", req.Op, "err", resp.Error)
	}
}

// serveRequest answers req, read at start: it claims req's resource (a hung
// one is refused at once, holding no slot), takes a work slot, and runs the
// call until answerBy from start; a call still running then is hung and
// gives its slot back (run). Not ok: no answer to give (the helper stops).
func (s *Server) serveRequest(ctx context.Context, c *net.UnixConn, req request, start time.Time, work chan struct{}) (resp response, fd int, ok bool) {
	limit := opTimeout(req)
	deadline := start.Add(s.answerBy(req))
	key := s.inFlightKey(req)
	var cl *call
	if key != "" {
		var refusal string
		if cl, refusal = s.claim(ctx, key, req, deadline); cl == nil {
			if refusal == "" {
				return response{}, -1, false
			}
			return response{Error: refusal}, -1, true
		}
	}
	// A slot, while the client still waits for the answer.
	wait := time.NewTimer(time.Until(deadline))
	select {
	case work <- struct{}{}:
		wait.Stop()
		defer func() { <-work }()
	case <-wait.C:
		s.unclaim(key, cl)
		s.Log.Warn("refused a request that waited for a free work slot until its client was about to give up", "op", req.Op)
		return response{Error: fmt.Sprintf("%s: no free work slot in the helper within %s", req.Op, time.Since(start).Round(time.Millisecond))}, -1, true
	case <-ctx.Done():
		wait.Stop()
		s.unclaim(key, cl)
		return response{}, -1, false
	}
	if limit != requestTimeout {
		// An LVM report or a scan: as long as its client waits, from now.
		c.SetDeadline(time.Now().Add(limit))
	}
	if cl == nil {
		resp, fd = s.handle(ctx, req) // refused before any I/O
		return resp, fd, true
	}
	return s.run(ctx, key, cl, req, deadline)
}

// unclaim frees key of cl, a call that was never made.
func (s *Server) unclaim(key string, cl *call) {
	if cl == nil {
		return
	}
	s.mu.Lock()
	delete(s.inFlight, key)
	close(cl.done)
	s.mu.Unlock()
}

func peerUID(c *net.UnixConn) (uint32, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

func (s *Server) handle(ctx context.Context, req request) (response, int) {
	switch req.Op {
	case OpKmsg:
		p := s.kmsgPath()
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return errorResponse(&os.PathError{Op: "open", Path: p, Err: err}), -1
		}
		return response{}, fd
	case OpNVMeIdentify, OpNVMeSMART:
		if !nvmeCtrl.MatchString(req.Ctrl) {
			return response{Error: fmt.Sprintf("%q is not an NVMe controller (nvmeN)", req.Ctrl)}, -1
		}
		dev := s.nvmeDev(req.Ctrl)
		var b []byte
		var err error
		if req.Op == OpNVMeIdentify {
			b, err = hostio.NVMeIdentify(dev)
		} else {
			b, err = hostio.NVMeSMART(dev)
		}
		if err != nil {
			return errorResponse(err), -1
		}
		return response{Data: b}, -1
	case OpDMVerity:
		p := s.dmControl()
		if req.Path != p {
			return response{Error: fmt.Sprintf("the helper reads the device-mapper tables on %s only, not %s (checks.SealedOSTampered.dm_control)", p, req.Path)}, -1
		}
		if err := s.isDMControl(p); err != nil {
			return errorResponse(err), -1
		}
		ts, err := hostio.DMControl{Path: p}.VerityTargets()
		if err != nil {
			return errorResponse(err), -1
		}
		return response{Verity: ts}, -1
	case OpLVM:
		if err := lvmAllowed(req, s.lvm()); err != nil {
			return response{Error: err.Error()}, -1
		}
		b, err := hostio.RunLVM(ctx, req.LVM, req.Timeout, req.Command, req.Args...)
		r := response{Data: b}
		if err != nil {
			e := errorResponse(err)
			e.Data = b
			r = e
		}
		return r, -1
	case OpScan:
		if req.Spec == nil {
			return response{Error: "a scan without patterns"}, -1
		}
		spec := *req.Spec
		if err := ScanPatternsAllowed(spec.Patterns); err != nil {
			return response{Error: err.Error()}, -1
		}
		if spec.MaxEntries <= 0 || spec.MaxEntries > hostio.MaxEntries {
			spec.MaxEntries = hostio.MaxEntries
		}
		es, notes, err := hostio.ScanNoting("/", spec)
		var n *hostio.ScanNotes
		if notes != (hostio.ScanNotes{}) {
			n = &notes
		}
		if err != nil {
			r := errorResponse(err)
			r.Entries, r.Notes = es, n
			return r, -1
		}
		return response{Entries: es, Notes: n}, -1
	}
	return response{Error: fmt.Sprintf("unknown operation %q", req.Op)}, -1
}

// isDMControl refuses any path but the device-mapper control node (the
// character device 10:236, or DMControlRdev); a missing node is
// hostio.ErrNoDeviceMapper, as in process.
func (s *Server) isDMControl(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s: %w", p, hostio.ErrNoDeviceMapper)
		}
		return &os.PathError{Op: "stat", Path: p, Err: err}
	}
	want := s.DMControlRdev
	if want == 0 {
		want = unix.Mkdev(10, 236)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != want {
		return fmt.Errorf("%s is not the device-mapper control node (%d:%d)", p, unix.Major(want), unix.Minor(want))
	}
	return nil
}

func (s *Server) kmsgPath() string {
	if s.KmsgPath != "" {
		return s.KmsgPath
	}
	return "/dev/kmsg"
}

func (s *Server) nvmeDev(ctrl string) string {
	dir := s.DevDir
	if dir == "" {
		dir = "/dev"
	}
	return filepath.Join(dir, ctrl)
}

func (s *Server) dmControl() string {
	if s.DMControl != "" {
		return s.DMControl
	}
	return "/dev/mapper/control"
}

func (s *Server) lvm() string {
	if s.LVM != "" {
		return s.LVM
	}
	return "/usr/sbin/lvm"
}

// lvmAllowed refuses what is not one of the disk check's LVM reports from
// the helper's own lvm binary (its --lvm), which only root may change. The
// path is the helper's, not the caller's: a caller that could name the
// program could have the helper run one it wrote, with the helper's
// capabilities.
func lvmAllowed(req request, lvm string) error {
	if req.LVM != lvm {
		return fmt.Errorf("the helper runs lvm from %s only (its --lvm), not %q (checks.DiskUsageHigh.lvm_command)", lvm, req.LVM)
	}
	if !hostio.LVMArgsAllowed(req.Command, req.Args) {
		return fmt.Errorf("the helper runs only the disk check's LVM reports, not %q %q", req.Command, req.Args)
	}
	if req.Timeout <= 0 || req.Timeout > maxLVMTimeout {
		return fmt.Errorf("LVM timeout %s out of range (at most 5m)", req.Timeout)
	}
	var st unix.Stat_t
	if err := unix.Stat(req.LVM, &st); err != nil {
		return &os.PathError{Op: "stat", Path: req.LVM, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("%s: not a regular file that only root may change (owner %d, mode %#o)", req.LVM, st.Uid, st.Mode&0o7777)
	}
	return nil
}

// ScanPatternsAllowed refuses scan patterns that are not absolute and clean,
// are /, lie under /proc, /sys or /dev, or have a glob in their first
// component: the helper digests what it reads with CAP_DAC_READ_SEARCH and
// CAP_SYSLOG (a read of /proc/kmsg would take records from the kernel log),
// so it reads files only. (A symlink on the way is caught when the file is
// opened: hostio refuses files of the kernel's filesystems.)
func ScanPatternsAllowed(patterns []string) error {
	for _, p := range patterns {
		if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("scan pattern %q: not an absolute, clean path other than /", p)
		}
		for _, fsys := range []string{"/proc", "/sys", "/dev"} {
			if p == fsys || strings.HasPrefix(p, fsys+"/") {
				return fmt.Errorf("scan pattern %q: under %s, which the helper does not scan", p, fsys)
			}
		}
		// A glob in the first component could reach them too.
		if first := strings.SplitN(strings.TrimPrefix(p, "/"), "/", 2)[0]; strings.ContainsAny(first, `*?[\`) {
			return fmt.Errorf("scan pattern %q: a glob in its first component", p)
		}
	}
	return nil
}
