package checks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("APIServerSourceIPUnavailable", newSourceIPCheck) }

// AuditCursorKey is the name under which APIServerSourceIPUnavailable keeps,
// in the state file, where it left off in the audit log.
const AuditCursorKey = "audit"

// maxAuditLine bounds one line of the audit log (within max_read_bytes); a
// longer line is skipped as malformed. Metadata-level records are about a
// kilobyte; a RequestResponse record of a large list can be megabytes. A
// variable for tests.
var maxAuditLine int64 = 16 << 20

// auditAddrsShown is how many distinct addresses a message names.
const auditAddrsShown = 5

// sourceIPCheck: KubeGate's source-IP attribution path is broken when the
// kube-apiserver's audit records of requests by real users (not the
// cluster's own components) no longer carry a client address: sourceIPs,
// which kube-apiserver fills with the X-Forwarded-For entries, then
// X-Real-Ip, then the connection's remote address, holds only loopback or
// the proxy's own addresses.
//
// Each probe reads what kube-apiserver appended to its audit log (JSON lines
// of audit.k8s.io/v1 Events) since the last probe: that is the window. The
// first probe without a saved position reads the tail of the log and looks
// at the records of the last interval (by stageTimestamp; not those stamped
// more than auditSkew ahead of the clock). A new file at the
// path (kube-apiserver's rotation renames the file within its directory and
// opens a new one) is followed after the rest of the old one, found in the
// same directory by its inode and the hash of its start; the same file
// shorter than the position, or with another start, was truncated (and
// maybe written again) and is read from its start. At most max_read_bytes
// are read per probe: of a longer window the newest part. The position
// (device, inode, offset, hash of the start) is kept in the state file
// (Env.Memos), so a daemon restart within the boot resumes where the last
// probe left off and its first window spans the restart.
//
// Limit: the position is saved with the conditions, but a probe's result
// reaches the store after the probe has moved the position; a crash between
// the two loses that one window's result (the next probe starts after it).
type sourceIPCheck struct {
	env      *Env
	path     string
	excluded []string
	proxies  []netip.Prefix
	maxRead  int64
	interval time.Duration

	busy      chan struct{} // held by the probe in progress (a timed-out one may still run)
	loggedErr string        // the kind of malformed line logged last, "" after a probe without one (under busy)
	cur       bootValue[auditCursor]
}

// auditCursor is where the check left off: the file (device and inode) and
// the offset after the last whole line read, and when. Head is a hash of
// the file's first HeadLen bytes (up to auditHeadLen): a file that was
// truncated and written past the offset again, or a new file that got a
// freed inode number, does not match it.
type auditCursor struct {
	// Path is the audit_log the position is in (absent in a state file of
	// an earlier version: taken for the configured one). Another path
	// (audit_log changed by a reload or a restart) is a first probe.
	Path    string    `json:"path,omitempty"`
	Dev     uint64    `json:"dev"`
	Ino     uint64    `json:"ino"`
	Offset  int64     `json:"offset"`
	Head    uint64    `json:"head"`
	HeadLen int64     `json:"head_len"`
	At      time.Time `json:"at"`
}

// auditHeadLen is how much of the start of the log the cursor's hash covers.
const auditHeadLen = 1024

// fileHead hashes the first n bytes of f; ok is false when f is shorter.
func fileHead(f *os.File, n int64) (sum uint64, ok bool, err error) {
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, false, nil
		}
		return 0, false, err
	}
	h := fnv.New64a()
	h.Write(buf)
	return h.Sum64(), true, nil
}

// sameHead reports whether f starts as the file the cursor was taken in.
func (cur auditCursor) sameHead(f *os.File) (bool, error) {
	sum, ok, err := fileHead(f, cur.HeadLen)
	return ok && sum == cur.Head, err
}

func (c auditCursor) valid() bool { return c.Ino != 0 }

func newSourceIPCheck(env *Env) (Check, error) {
	k := env.Config.Checks.APIServerSourceIPUnavailable
	c := &sourceIPCheck{env: env, path: k.AuditLog, excluded: slices.Clone(k.ExcludedUserPrefixes),
		maxRead: k.MaxReadBytes, interval: k.Interval.Duration, busy: make(chan struct{}, 1),
		cur: bootValue[auditCursor]{key: AuditCursorKey, valid: func(c auditCursor) bool { return c.valid() && c.Offset >= 0 }}}
	for _, a := range k.ProxyAddresses {
		p, err := config.ParseAddressOrPrefix(a)
		if err != nil {
			return nil, fmt.Errorf("proxy_addresses: %q: %v", a, err)
		}
		c.proxies = append(c.proxies, p)
	}
	if c.maxRead <= 0 {
		c.maxRead = config.MinAuditReadBytes
	}
	return c, nil
}

func (c *sourceIPCheck) cursor() auditCursor { return c.cur.get() }

func (c *sourceIPCheck) setCursor(cur auditCursor) { c.cur.set(c.env.Memos, cur) }

// auditRecord is what the check needs of one audit event.
type auditRecord struct {
	User  string // the impersonated user, if any, else the authenticated one
	Addrs []netip.Addr
	Stage time.Time
}

// auditEventJSON is the part of an audit.k8s.io/v1 Event the check reads.
type auditEventJSON struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	SourceIPs      []string `json:"sourceIPs"`
	StageTimestamp string   `json:"stageTimestamp"`
}

// malformedLine is why a line of the audit log was skipped: kind is what
// the once-per-kind log compares (the text carries the offending value,
// which may differ from line to line), msg what the message says.
type malformedLine struct{ kind, msg string }

func (e *malformedLine) Error() string { return e.msg }

func malformed(kind, format string, args ...any) error {
	return &malformedLine{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// parseAuditLine parses one line of kube-apiserver's JSON audit log.
func parseAuditLine(line []byte) (auditRecord, error) {
	var ev auditEventJSON
	if err := json.Unmarshal(line, &ev); err != nil {
		kind := "not JSON"
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			kind = "JSON of another shape"
		}
		return auditRecord{}, malformed(kind, "not a JSON object: %v", err)
	}
	if ev.Kind != "Event" || ev.APIVersion != "audit.k8s.io/v1" {
		return auditRecord{}, malformed("not an audit event", "kind %q apiVersion %q, not an audit.k8s.io/v1 Event", ev.Kind, ev.APIVersion)
	}
	ts, err := time.Parse(time.RFC3339Nano, ev.StageTimestamp)
	if err != nil {
		return auditRecord{}, malformed("stageTimestamp", "stageTimestamp %q: not an RFC 3339 time", ev.StageTimestamp)
	}
	r := auditRecord{User: ev.User.Username, Stage: ts}
	if ev.ImpersonatedUser != nil && ev.ImpersonatedUser.Username != "" {
		r.User = ev.ImpersonatedUser.Username
	}
	for _, s := range ev.SourceIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return auditRecord{}, malformed("sourceIPs", "sourceIPs entry %q is not an IP address", s)
		}
		r.Addrs = append(r.Addrs, a.Unmap())
	}
	return r, nil
}

// auditSegment is a byte range of one file of the log to read.
type auditSegment struct {
	f        *os.File
	from, to int64
	// live: the file kube-apiserver is writing; an unterminated last line
	// is being written and is left for the next probe.
	live bool
	// cut: from was moved forward (max_read_bytes, or the tail read of the
	// first probe): the part of a line before the first newline is skipped
	// (as it is wherever from is not after a newline).
	cut bool
}

// auditTally is what one window's records say.
type auditTally struct {
	lines       int // records and malformed lines read
	excluded    int // records by the cluster's own components
	counted     int // records by other users
	withClient  int // of those, records that carry a client address
	clientAddrs []netip.Addr
	proxyAddrs  []netip.Addr
	malformed   int
	firstErr    string
	firstKind   string // of firstErr (malformedLine.kind)
}

func addAddr(list []netip.Addr, a netip.Addr) []netip.Addr {
	if slices.Contains(list, a) {
		return list
	}
	return append(list, a)
}

// isProxy reports whether an address in sourceIPs is the proxy's own:
// loopback, or one of proxy_addresses.
func (c *sourceIPCheck) isProxy(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	for _, p := range c.proxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (c *sourceIPCheck) excludedUser(u string) bool {
	if u == "" {
		return true
	}
	for _, p := range c.excluded {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

// auditSkew is how far after the clock a record may be stamped and still be
// in the first probe's window: kube-apiserver writes while the probe reads.
// A record stamped later is not in the last interval: the clock was behind
// when the probe read it (a boot whose RTC lost time, before chrony steps
// the clock, finds the boot before's records hours ahead).
const auditSkew = time.Minute

// add tallies one line; since, when not zero, is the start of the window
// by stageTimestamp, which ends an interval later (and auditSkew).
func (c *sourceIPCheck) add(t *auditTally, line []byte, since time.Time) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	t.lines++
	r, err := parseAuditLine(line)
	if err != nil {
		t.malformed++
		if t.firstErr == "" {
			t.firstErr, t.firstKind = err.Error(), err.Error()
			var m *malformedLine
			if errors.As(err, &m) {
				t.firstKind = m.kind
			}
		}
		return
	}
	switch {
	case !since.IsZero() && (r.Stage.Before(since) || r.Stage.After(since.Add(c.interval+auditSkew))):
		return
	case c.excludedUser(r.User):
		t.excluded++
		return
	}
	t.counted++
	client := false
	for _, a := range r.Addrs {
		if c.isProxy(a) {
			t.proxyAddrs = addAddr(t.proxyAddrs, a)
		} else {
			client = true
			t.clientAddrs = addAddr(t.clientAddrs, a)
		}
	}
	if client {
		t.withClient++
	}
}

// fileID is a file's device and inode.
func fileID(fi fs.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), st.Ino
	}
	return 0, 0
}

// findRotated looks in dir for the file the cursor was taken in (its
// device, inode and head): the audit log renamed by its rotation. No file
// and no error where it is gone; an error where dir or the file cannot be
// read.
func findRotated(dir string, cur auditCursor) (*os.File, fs.FileInfo, error) {
	f, fi, err := findInode(dir, cur.Dev, cur.Ino)
	if f == nil || err != nil {
		return nil, nil, err
	}
	if ok, err := cur.sameHead(f); err != nil || !ok {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// findInode opens the regular file in dir with the given device and inode:
// nil and no error where dir holds none (or it was renamed again while
// being opened), an error where dir cannot be listed or the file opened.
func findInode(dir string, dev, ino uint64) (*os.File, fs.FileInfo, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("looking for the rotated audit log: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed since the listing
		}
		if d, i := fileID(fi); d != dev || i != ino {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, nil
		} else if err != nil {
			return nil, nil, fmt.Errorf("opening the rotated audit log: %w", err)
		}
		if fi, err = f.Stat(); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("opening the rotated audit log: %w", err)
		}
		if d, i := fileID(fi); d != dev || i != ino { // renamed again in between
			f.Close()
			return nil, nil, nil
		}
		return f, fi, nil
	}
	return nil, nil, nil
}

func (c *sourceIPCheck) Probe(ctx context.Context) (Result, error) {
	select {
	case c.busy <- struct{}{}:
		defer func() { <-c.busy }()
	case <-ctx.Done():
		return Result{}, fmt.Errorf("an earlier probe is still reading the audit log: %w", ctx.Err())
	}
	c.cur.restore(c.env.Memos)
	now := c.env.Now()
	path := c.env.Path(c.path)
	// Without blocking: what is not a regular file is refused below (a
	// FIFO's open would wait for a writer, and every later probe be refused
	// as "still reading").
	f, fi, err := openNoWait(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNoAuditRecords,
			Message: fmt.Sprintf("%s does not exist (is kube-apiserver started with --audit-log-path=%s?)", c.path, c.path)}, nil
	}
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	if !fi.Mode().IsRegular() {
		return Result{}, fmt.Errorf("%s is not a regular file", c.path)
	}
	dev, ino := fileID(fi)
	size := fi.Size()

	prev := c.cursor()
	if prev.Path != "" && prev.Path != c.path {
		// audit_log was changed (a reload, or a restart with the state
		// file): the position is in the file the old path named; the new
		// one is read as a first probe reads it, not taken for the old
		// one rotated.
		prev = auditCursor{}
	}
	var notes []string
	var segs []auditSegment
	var since time.Time // the window's start by timestamp: only without a position
	same := prev.valid() && prev.Dev == dev && prev.Ino == ino
	sameHead := false
	if same && size >= prev.Offset {
		if sameHead, err = prev.sameHead(f); err != nil {
			return Result{}, err
		}
	}
	switch {
	case !prev.valid():
		since = now.Add(-c.interval)
		segs = append(segs, auditSegment{f: f, from: 0, to: size, live: true})
	case same && sameHead:
		segs = append(segs, auditSegment{f: f, from: prev.Offset, to: size, live: true})
	case same && size < prev.Offset:
		notes = append(notes, fmt.Sprintf("the log was truncated (%d bytes, was %d at the last probe)", size, prev.Offset))
		segs = append(segs, auditSegment{f: f, from: 0, to: size, live: true})
	case same:
		notes = append(notes, "the log was rewritten from its start since the last probe")
		segs = append(segs, auditSegment{f: f, from: 0, to: size, live: true})
	default:
		old, ofi, err := findRotated(filepath.Dir(path), prev)
		if err != nil {
			return Result{}, err
		}
		if old != nil {
			defer old.Close()
			from := prev.Offset
			if ofi.Size() < from {
				from = 0
			}
			segs = append(segs, auditSegment{f: old, from: from, to: ofi.Size()})
			notes = append(notes, fmt.Sprintf("the log was rotated; read the rest of %s", filepath.Base(old.Name())))
		} else {
			notes = append(notes, fmt.Sprintf("the log was rotated and the old file is no longer in %s: its records after the last probe were not read", filepath.Dir(c.path)))
		}
		segs = append(segs, auditSegment{f: f, from: 0, to: size, live: true})
	}

	// max_read_bytes: drop the oldest bytes. (The first probe reads the
	// tail on purpose: nothing to say then.)
	var total, skipped int64
	for _, s := range segs {
		total += s.to - s.from
	}
	for i := 0; total > c.maxRead && i < len(segs); i++ {
		drop := min(total-c.maxRead, segs[i].to-segs[i].from)
		segs[i].from += drop
		segs[i].cut = true
		total -= drop
		skipped += drop
	}
	if skipped > 0 && prev.valid() {
		notes = append(notes, fmt.Sprintf("%d bytes of older records not read (more than max_read_bytes, %d, since the last probe)", skipped, c.maxRead))
	}
	var tally auditTally

	next := auditCursor{Path: c.path, Dev: dev, Ino: ino, Offset: 0, At: now}
	for _, s := range segs {
		end, err := c.readSegment(ctx, s, &tally, since)
		if err != nil {
			return Result{}, err
		}
		if s.live {
			next.Offset = end
		}
	}
	next.HeadLen = min(next.Offset, auditHeadLen)
	if next.Head, _, err = fileHead(f, next.HeadLen); err != nil {
		return Result{}, err
	}
	c.setCursor(next)
	// Counted once the cursor is past them: a probe that fails before
	// reads them again.
	c.env.Malformed.Add(MalformedAuditLog, tally.malformed)
	if tally.malformed == 0 && tally.lines > 0 {
		c.loggedErr = "" // records, none malformed: malformed lines coming back are logged again
	} else if tally.malformed > 0 {
		// Logged once per kind of error, not every probe: the message
		// says it each time.
		if tally.firstKind != c.loggedErr {
			c.env.Log.Warn("skipped malformed lines of the audit log", "path", c.path, "lines", tally.malformed, "first_error", tally.firstErr)
			c.loggedErr = tally.firstKind
		}
		notes = append(notes, fmt.Sprintf("%d malformed %s skipped (first: %s)", tally.malformed, plural(tally.malformed, "line", "lines"), tally.firstErr))
	}
	return c.result(tally, prev, since, notes), nil
}

// readSegment tallies the whole lines of s and returns the offset after the
// last line it consumed.
func (c *sourceIPCheck) readSegment(ctx context.Context, s auditSegment, t *auditTally, since time.Time) (int64, error) {
	pos := s.from
	if s.from > 0 {
		// Start at a line boundary: skip the rest of a line cut into (cut),
		// or of one the last probe left at the end of the file mid-line: a
		// line longer than the bound still being written, counted malformed
		// then (before, the rest of it was read as a line of its own).
		var b [1]byte
		if _, err := s.f.ReadAt(b[:], s.from-1); err != nil {
			return pos, err
		}
		if b[0] != '\n' {
			r := bufio.NewReader(io.NewSectionReader(s.f, s.from, s.to-s.from))
			n, found, err := skipLine(r)
			if err != nil {
				return pos, err
			}
			if !found { // no line starts in the range: one line longer than it
				return s.to, nil
			}
			pos += n
		}
	}
	r := bufio.NewReaderSize(io.NewSectionReader(s.f, pos, s.to-pos), 64<<10)
	limit := min(maxAuditLine, c.maxRead)
	var (
		buf     []byte // the line so far, when longer than the reader's buffer
		lineLen int64
		tooLong bool
	)
	for n := 0; ; n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return pos, err
			}
		}
		chunk, err := r.ReadSlice('\n')
		lineLen += int64(len(chunk))
		if errors.Is(err, bufio.ErrBufferFull) {
			if !tooLong && lineLen <= limit {
				buf = append(buf, chunk...)
			} else {
				tooLong, buf = true, buf[:0]
			}
			continue
		}
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return pos, err
		}
		if eof && (lineLen == 0 || (s.live && lineLen <= limit)) {
			return pos, nil // the end, or a line being written: read it next time
		}
		// A whole line; or at the end of the range one that will never be
		// finished (the last line of a rotated file) or is already too long.
		switch {
		case tooLong || lineLen > limit:
			t.lines++
			t.malformed++
			if t.firstErr == "" {
				t.firstErr, t.firstKind = fmt.Sprintf("a line longer than %d bytes", limit), "too long"
			}
		case len(buf) > 0:
			c.add(t, append(buf, chunk...), since)
		default:
			c.add(t, chunk, since)
		}
		pos += lineLen
		buf, lineLen, tooLong = buf[:0], 0, false
		if eof {
			return pos, nil
		}
	}
}

// skipLine reads up to and including the next newline and reports how many
// bytes that was and whether a newline was found.
func skipLine(r *bufio.Reader) (int64, bool, error) {
	var n int64
	for {
		b, err := r.ReadSlice('\n')
		n += int64(len(b))
		switch {
		case err == nil:
			return n, true, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return n, false, nil
		default:
			return n, false, err
		}
	}
}

func joinAddrs(as []netip.Addr) string {
	ss := make([]string, 0, min(len(as), auditAddrsShown)+1)
	for i, a := range as {
		if i == auditAddrsShown {
			ss = append(ss, fmt.Sprintf("and %d more", len(as)-auditAddrsShown))
			break
		}
		ss = append(ss, a.String())
	}
	return strings.Join(ss, ", ")
}

func (c *sourceIPCheck) result(t auditTally, prev auditCursor, since time.Time, notes []string) Result {
	var window string
	switch {
	case !since.IsZero():
		window = fmt.Sprintf("in the last %s", config.ShortDuration(c.interval))
	case !prev.At.IsZero():
		window = "since " + prev.At.UTC().Format(time.RFC3339)
	default:
		window = "since the last probe"
	}
	suffix := ""
	if len(notes) > 0 {
		suffix = "; " + strings.Join(notes, "; ")
	}
	users := "users outside the cluster's own components"
	inWindow := "no records"
	switch t.excluded {
	case 0:
	case 1:
		inWindow = "1 record, by those components"
	default:
		inWindow = fmt.Sprintf("%d records, all by those components", t.excluded)
	}
	switch {
	case t.counted == 0:
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNoAuditRecords,
			Message: fmt.Sprintf("%s has no record of a request by a user outside the cluster's own components (user names starting with %s) %s (%s)%s",
				c.path, strings.Join(c.excluded, ", "), window, inWindow, suffix)}
	case t.withClient > 0:
		return Result{Status: report.StatusFalse, Reason: report.ReasonSourceIPAvailable,
			Message: fmt.Sprintf("%d of %d audit records of requests by %s %s carry a client address (%s)%s",
				t.withClient, t.counted, users, window, joinAddrs(t.clientAddrs), suffix)}
	}
	held := "none"
	if len(t.proxyAddrs) > 0 {
		held = "only " + joinAddrs(t.proxyAddrs)
	}
	return Result{Status: report.StatusTrue, Reason: report.ReasonSourceIPMissingInAudit,
		Message: fmt.Sprintf("none of the %d audit records of requests by %s %s carries a client address: their sourceIPs hold %s (loopback or the proxy's own)%s",
			t.counted, users, window, held, suffix)}
}
