package checks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

const auditLogPath = "/var/log/kubernetes/audit/audit.log"

var auT0 = time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC)

// auditLine is one record as kube-apiserver v1.37 writes it (the shape of
// testdata/audit/kube-apiserver-v1.37.log), for user from sourceIPs at.
func auditLine(user string, at time.Time, ips ...string) string {
	b, _ := json.Marshal(ips)
	if ips == nil {
		b = []byte("[]")
	}
	ts := at.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	return fmt.Sprintf(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"7b1d0b7e-5a4c-4a53-9f0e-0c4c1a2f3e4d","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/configmaps","verb":"list","user":{"username":%q,"groups":["system:authenticated"]},"sourceIPs":%s,"userAgent":"kubectl/v1.37.2 (linux/amd64) kubernetes/7d0e3b1","objectRef":{"resource":"configmaps","namespace":"default","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":%q,"stageTimestamp":%q,"annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":""}}`+"\n",
		user, b, ts, ts)
}

// auditHost is a host root with an audit log, a clock and a state store.
type auditHost struct {
	t     *testing.T
	root  string
	now   time.Time
	store *report.Store
}

func newAuditHost(t *testing.T) *auditHost {
	h := &auditHost{t: t, root: t.TempDir(), now: auT0, store: report.NewStore("boot-1")}
	if err := os.MkdirAll(filepath.Dir(h.path()), 0o755); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *auditHost) path() string { return filepath.Join(h.root, auditLogPath) }

func (h *auditHost) env(mutate func(k *config.APIServerSourceIPUnavailable)) *Env {
	env := testEnv(h.t, func(c *config.Config) {
		c.HostRoot = h.root
		if mutate != nil {
			mutate(&c.Checks.APIServerSourceIPUnavailable)
		}
	})
	env.Role = report.RoleControlPlane
	env.Now = func() time.Time { return h.now }
	env.Memos = h.store
	return env
}

func (h *auditHost) check(mutate func(k *config.APIServerSourceIPUnavailable)) Check {
	h.t.Helper()
	c, err := newSourceIPCheck(h.env(mutate))
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// append writes lines to the audit log (creating it).
func (h *auditHost) append(lines ...string) {
	h.t.Helper()
	f, err := os.OpenFile(h.path(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(lines, "")); err != nil {
		h.t.Fatal(err)
	}
}

func probeAudit(t *testing.T, c Check, status report.Status, reason report.Reason, msg string) {
	t.Helper()
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != status || r.Reason != reason || r.Message != msg {
		t.Errorf("got %s/%s %q (err %v)\nwant %s/%s %q", r.Status, r.Reason, r.Message, err, status, reason, msg)
	}
}

const (
	users  = "users outside the cluster's own components"
	noRecs = auditLogPath + " has no record of a request by a user outside the cluster's own components (user names starting with system:)"
)

// The real lines kube-apiserver v1.37.2 wrote in the integration test:
// alice through a proxy (X-Forwarded-For first, then the remote address),
// alice direct, a node, the admin, kube-apiserver's own loopback client.
func TestParseRealAuditLines(t *testing.T) {
	f, err := os.Open("testdata/audit/kube-apiserver-v1.37.log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type rec struct {
		user  string
		addrs string
	}
	want := []rec{
		{"alice", "203.0.113.7 127.0.0.1"},
		{"alice", "127.0.0.1"},
		{"alice", "203.0.113.9 127.0.0.1"},
		{"system:node:n1", "203.0.113.7 127.0.0.1"},
		{"admin", "127.0.0.1"},
		{"system:apiserver", "127.0.0.1"},
		{"system:apiserver", "127.0.0.1"},
	}
	var got []rec
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		r, err := parseAuditLine(sc.Bytes())
		if err != nil {
			t.Fatalf("%v: %s", err, sc.Text())
		}
		if r.Stage.IsZero() || r.Stage.Year() != 2026 {
			t.Errorf("stageTimestamp %v", r.Stage)
		}
		var as []string
		for _, a := range r.Addrs {
			as = append(as, a.String())
		}
		got = append(got, rec{r.User, strings.Join(as, " ")})
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestParseAuditLineErrors(t *testing.T) {
	ok := auditLine("alice", auT0, "127.0.0.1")
	for _, tc := range []struct{ line, err string }{
		{`garbage`, "not a JSON object: invalid character 'g' looking for beginning of value"},
		{`{"kind":"Event","apiVersion":"audit.k8s.io/v1"`, "not a JSON object: unexpected end of JSON input"},
		{`[1,2]`, "not a JSON object: json: cannot unmarshal array into Go value of type checks.auditEventJSON"},
		{`{"kind":"Policy","apiVersion":"audit.k8s.io/v1"}`, `kind "Policy" apiVersion "audit.k8s.io/v1", not an audit.k8s.io/v1 Event`},
		{strings.Replace(ok, "audit.k8s.io/v1", "audit.k8s.io/v1beta1", 1), `kind "Event" apiVersion "audit.k8s.io/v1beta1", not an audit.k8s.io/v1 Event`},
		{strings.Replace(ok, `"stageTimestamp":"2026-12-02T18:00:00.000000Z"`, `"stageTimestamp":"yesterday"`, 1), `stageTimestamp "yesterday": not an RFC 3339 time`},
		{strings.Replace(ok, `"stageTimestamp":"2026-12-02T18:00:00.000000Z",`, ``, 1), `stageTimestamp "": not an RFC 3339 time`},
		{strings.Replace(ok, `"127.0.0.1"`, `"127.0.0.1:443"`, 1), `sourceIPs entry "127.0.0.1:443" is not an IP address`},
		{strings.Replace(ok, `"sourceIPs":["127.0.0.1"]`, `"sourceIPs":"127.0.0.1"`, 1), "not a JSON object: json: cannot unmarshal string into Go struct field auditEventJSON.sourceIPs of type []string"},
	} {
		_, err := parseAuditLine([]byte(tc.line))
		if err == nil || err.Error() != tc.err {
			t.Errorf("%s:\n got %v\nwant %s", tc.line, err, tc.err)
		}
	}
	// The impersonated user is the one the request is made for; an
	// IPv4-mapped address is the IPv4 address.
	imp := strings.Replace(auditLine("system:serviceaccount:kubegate:proxy", auT0, "::ffff:203.0.113.7"),
		`"sourceIPs"`, `"impersonatedUser":{"username":"alice","groups":["dev"]},"sourceIPs"`, 1)
	r, err := parseAuditLine([]byte(imp))
	if err != nil || r.User != "alice" || !slices.Equal(r.Addrs, []netip.Addr{netip.MustParseAddr("203.0.113.7")}) {
		t.Errorf("impersonated: %+v %v", r, err)
	}
}

// The windows of a log that is appended to: the first probe looks at the
// last interval by timestamp, the later ones at what was written since.
func TestSourceIPWindows(t *testing.T) {
	h := newAuditHost(t)
	old := auT0.Add(-2 * time.Minute)
	h.append(
		auditLine("alice", old, "198.51.100.1", "127.0.0.1"), // before the window
		auditLine("alice", auT0.Add(-30*time.Second), "127.0.0.1"),
		auditLine("system:kube-controller-manager", auT0.Add(-20*time.Second), "10.0.0.9"), // the cluster's own
		auditLine("bob", auT0.Add(-10*time.Second), "::1"),
	)
	c := h.check(nil)
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 2 audit records of requests by "+users+" in the last 1m carries a client address: their sourceIPs hold only 127.0.0.1, ::1 (loopback or the proxy's own)")

	h.now = auT0.Add(time.Minute)
	h.append(auditLine("alice", h.now.Add(-5*time.Second), "203.0.113.7", "127.0.0.1"),
		auditLine("alice", h.now.Add(-4*time.Second), "127.0.0.1"),
		auditLine("carol", h.now.Add(-3*time.Second), "203.0.113.8", "203.0.113.7", "127.0.0.1"))
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"2 of 3 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carry a client address (203.0.113.7, 203.0.113.8)")

	// Records written late with an earlier timestamp still count: the window
	// of a later probe is what was written since the last one.
	h.now = auT0.Add(2 * time.Minute)
	h.append(auditLine("alice", auT0, "127.0.0.1"))
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" since 2026-12-02T18:01:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own)")

	h.now = auT0.Add(3 * time.Minute)
	h.append(auditLine("system:node:n1", h.now, "203.0.113.7", "127.0.0.1"), auditLine("system:apiserver", h.now, "127.0.0.1"))
	probeAudit(t, c, report.StatusUnknown, report.ReasonNoAuditRecords,
		noRecs+" since 2026-12-02T18:02:00Z (2 records, all by those components)")

	h.now = auT0.Add(4 * time.Minute)
	probeAudit(t, c, report.StatusUnknown, report.ReasonNoAuditRecords, noRecs+" since 2026-12-02T18:03:00Z (no records)")

	// sourceIPs empty: no client address either.
	h.now = auT0.Add(5 * time.Minute)
	h.append(auditLine("alice", h.now, []string(nil)...))
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" since 2026-12-02T18:04:00Z carries a client address: their sourceIPs hold none (loopback or the proxy's own)")
}

// The first probe's window is the last interval by the clock: records
// stamped more than a minute after it are not in it. A node that boots with
// its clock behind (an RTC that lost time, before chrony steps it) finds the
// records of the boot before in the log, stamped hours ahead: before, they
// were "in the last 1m", and the first probe judged this boot's API server
// by the last records of the one before (here True, an alert, while this
// boot's API server has served no one yet).
func TestSourceIPFirstWindowWithTheClockBehind(t *testing.T) {
	h := newAuditHost(t)
	h.now = auT0.Add(-2 * time.Hour) // the clock two hours behind
	// The records of the boot before, its proxy broken.
	h.append(
		auditLine("alice", auT0.Add(-3*time.Minute), "127.0.0.1"),
		auditLine("bob", auT0.Add(-time.Minute), "::1"),
	)
	probeAudit(t, h.check(nil), report.StatusUnknown, report.ReasonNoAuditRecords, noRecs+" in the last 1m (no records)")

	// A record stamped up to a minute after the probe's clock (written
	// while it reads) is in the window; a fresh start reads it.
	h.append(auditLine("alice", h.now.Add(30*time.Second), "203.0.113.7", "127.0.0.1"))
	h.store = report.NewStore("boot-1")
	probeAudit(t, h.check(nil), report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" in the last 1m carry a client address (203.0.113.7)")
}

// A line being written (no newline yet) is left for the next probe; bad
// lines are counted and skipped, never fatal.
func TestSourceIPPartialAndMalformedLines(t *testing.T) {
	h := newAuditHost(t)
	h.append(auditLine("system:apiserver", auT0, "127.0.0.1"))
	c := h.check(nil)
	probeAudit(t, c, report.StatusUnknown, report.ReasonNoAuditRecords, noRecs+" in the last 1m (1 record, by those components)")

	line := auditLine("alice", auT0, "203.0.113.7", "127.0.0.1")
	h.append(line[:100])
	probeAudit(t, c, report.StatusUnknown, report.ReasonNoAuditRecords, noRecs+" since 2026-12-02T18:00:00Z (no records)")
	h.append(line[100:])
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carry a client address (203.0.113.7)")

	h.append("not json\n", "\n", `{"kind":"Event","apiVersion":"audit.k8s.io/v1","stageTimestamp":"x"}`+"\n", "\x00\xff\n",
		auditLine("alice", auT0, "127.0.0.1"))
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own); 3 malformed lines skipped (first: not a JSON object: invalid character 'o' in literal null (expecting 'u'))")

	// A line longer than the line limit is skipped whole.
	defer func(n int64) { maxAuditLine = n }(maxAuditLine)
	maxAuditLine = 1000
	long := strings.Replace(auditLine("alice", auT0, "203.0.113.7"), `"verb":"list"`, `"verb":"list","x":"`+strings.Repeat("a", 3000)+`"`, 1)
	h.append(long, auditLine("alice", auT0, "127.0.0.1"))
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own); 1 malformed line skipped (first: a line longer than 1000 bytes)")
	// Also one still being written.
	h.append(long[:2500])
	probeAudit(t, c, report.StatusUnknown, report.ReasonNoAuditRecords,
		noRecs+" since 2026-12-02T18:00:00Z (no records); 1 malformed line skipped (first: a line longer than 1000 bytes)")
	// Its rest, once written, is that line's, counted then: not a line of
	// its own (before, a second malformed line, and a record had the rest
	// been one).
	h.append(long[2500:], auditLine("alice", auT0, "203.0.113.7"))
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carry a client address (203.0.113.7)")
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

// kube-apiserver's rotation (lumberjack: rename in the same directory, a new
// file), logrotate's copytruncate, and a rotated file that is gone.
func TestSourceIPRotation(t *testing.T) {
	h := newAuditHost(t)
	h.append(auditLine("alice", auT0, "127.0.0.1"))
	c := h.check(nil)
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" in the last 1m carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own)")

	// Written after the last probe, then rotated: read in the renamed file.
	h.append(auditLine("alice", auT0, "203.0.113.7", "127.0.0.1"))
	rename(t, h.path(), filepath.Join(filepath.Dir(h.path()), "audit-2026-12-02T18-00-30.000.log"))
	h.append(auditLine("alice", auT0, "127.0.0.1"))
	h.now = auT0.Add(time.Minute)
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 2 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carry a client address (203.0.113.7); the log was rotated; read the rest of audit-2026-12-02T18-00-30.000.log")
	h.append(auditLine("alice", auT0, "127.0.0.1"))
	h.now = auT0.Add(2 * time.Minute)
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" since 2026-12-02T18:01:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own)")

	// Rotated and the old file removed (compressed, or past maxbackup).
	rename(t, h.path(), filepath.Join(filepath.Dir(h.path()), "gone.log"))
	h.append(auditLine("alice", auT0, "203.0.113.9"))
	os.Remove(filepath.Join(filepath.Dir(h.path()), "gone.log"))
	h.now = auT0.Add(3 * time.Minute)
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" since 2026-12-02T18:02:00Z carry a client address (203.0.113.9); the log was rotated and the old file is no longer in /var/log/kubernetes/audit: its records after the last probe were not read")

	// Truncated in place (copytruncate): read from the start.
	if err := os.Truncate(h.path(), 0); err != nil {
		t.Fatal(err)
	}
	h.append(auditLine("bob", auT0, "127.0.0.1"))
	h.now = auT0.Add(4 * time.Minute)
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		fmt.Sprintf("none of the 1 audit records of requests by %s since 2026-12-02T18:03:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own); the log was truncated (%d bytes, was %d at the last probe)",
			users, len(auditLine("bob", auT0, "127.0.0.1")), len(auditLine("alice", auT0, "203.0.113.9"))))

	// Truncated and written past the old position again before the probe
	// (or a new file that got the freed inode number): its start differs.
	if err := os.Truncate(h.path(), 0); err != nil {
		t.Fatal(err)
	}
	h.append(auditLine("carol", auT0, "203.0.113.5"), auditLine("carol", auT0, "127.0.0.1"))
	h.now = auT0.Add(5 * time.Minute)
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 2 audit records of requests by "+users+" since 2026-12-02T18:04:00Z carry a client address (203.0.113.5); the log was rewritten from its start since the last probe")

	// A file in the directory with the old inode number but another start
	// is not the rotated log.
	other := filepath.Join(filepath.Dir(h.path()), "other.log")
	if err := os.WriteFile(other, []byte(auditLine("dave", auT0, "203.0.113.6")), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(other)
	sc := c.(*sourceIPCheck)
	cur := sc.cursor()
	cur.Ino, cur.Offset, cur.HeadLen, cur.Head = fi.Sys().(*syscall.Stat_t).Ino, 10, 10, 1
	sc.setCursor(cur)
	h.now = auT0.Add(6 * time.Minute)
	// (audit.log, a new file to the check, is read from its start.)
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 2 audit records of requests by "+users+" since 2026-12-02T18:05:00Z carry a client address (203.0.113.5); the log was rotated and the old file is no longer in /var/log/kubernetes/audit: its records after the last probe were not read")

	// No log at all.
	os.Remove(h.path())
	probeAudit(t, c, report.StatusUnknown, report.ReasonNoAuditRecords,
		auditLogPath+" does not exist (is kube-apiserver started with --audit-log-path="+auditLogPath+"?)")
}

// A directory that cannot be listed is an error, not a rotated log that
// is gone (the probe then fails with it instead of saying "no longer in").
// As root no mode makes a directory unreadable: a regular file in its place
// fails the listing the same way.
func TestFindRotatedErrors(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(log, []byte(auditLine("alice", auT0, "203.0.113.7")), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(log)
	if err != nil {
		t.Fatal(err)
	}
	dev, ino := fileID(fi)
	f, _, err := findRotated(log, auditCursor{Dev: dev, Ino: ino, HeadLen: 1})
	if f != nil || err == nil || !strings.Contains(err.Error(), "looking for the rotated audit log: open "+log+": not a directory") {
		t.Errorf("a file as the directory: %v, %v", f, err)
	}
	// Listed, and the inode is not there: gone, no error.
	f, _, err = findRotated(dir, auditCursor{Dev: dev, Ino: ino + 1, HeadLen: 1})
	if f != nil || err != nil {
		t.Errorf("no such inode: %v, %v", f, err)
	}
	// Listed, and there.
	want, _, _ := fileHead(mustOpen(t, log), 10)
	f, _, err = findRotated(dir, auditCursor{Dev: dev, Ino: ino, HeadLen: 10, Head: want})
	if f == nil || err != nil {
		t.Fatalf("the rotated file: %v, %v", f, err)
	}
	f.Close()
}

func mustOpen(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// More than max_read_bytes since the last probe: the newest part is read,
// from the first line that starts in it; the rest is said in the message.
func TestSourceIPReadIsBounded(t *testing.T) {
	h := newAuditHost(t)
	h.append(auditLine("alice", auT0, "127.0.0.1"))
	c := h.check(func(k *config.APIServerSourceIPUnavailable) { k.MaxReadBytes = 1 << 20 })
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" in the last 1m carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own)")

	oldLine := auditLine("alice", auT0, "203.0.113.7")
	newLine := auditLine("alice", auT0, "127.0.0.1")
	var lines []string
	size := 0
	for size < 2<<20 {
		lines = append(lines, oldLine)
		size += len(oldLine)
	}
	nNew := (1 << 20) / len(newLine) // fits, with part of one old line before it
	for range nNew {
		lines = append(lines, newLine)
		size += len(newLine)
	}
	h.append(lines...)
	h.now = auT0.Add(time.Minute)
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		fmt.Sprintf("none of the %d audit records of requests by %s since 2026-12-02T18:00:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own); %d bytes of older records not read (more than max_read_bytes, 1048576, since the last probe)",
			nNew, users, size-(1<<20)))

	// Across a rotation, the newest bytes are those of the new file.
	h.append(strings.Repeat(oldLine, (600<<10)/len(oldLine)))
	rename(t, h.path(), h.path()+".1")
	h.append(strings.Repeat(newLine, (600<<10)/len(newLine)))
	h.now = auT0.Add(2 * time.Minute)
	r, err := c.Probe(context.Background())
	if err != nil || r.Status != report.StatusFalse || !strings.Contains(r.Message, "(203.0.113.7); the log was rotated; read the rest of audit.log.1; ") ||
		!strings.Contains(r.Message, "bytes of older records not read") {
		t.Errorf("%+v %v", r, err)
	}
}

// A daemon restart within the boot resumes where the last probe left off
// (the position is in the state file); a new boot starts afresh.
func TestSourceIPResumesAfterRestart(t *testing.T) {
	h := newAuditHost(t)
	state := t.TempDir()
	h.append(auditLine("alice", auT0, "203.0.113.7"))
	c := h.check(nil)
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" in the last 1m carry a client address (203.0.113.7)")
	select {
	case <-h.store.Dirty():
	default:
		t.Error("moving the position did not mark the state dirty")
	}
	if err := h.store.Save(state, auT0); err != nil {
		t.Fatal(err)
	}

	// Down for 10 minutes; then, in the same boot.
	h.append(auditLine("alice", auT0.Add(time.Minute), "127.0.0.1"))
	h.now = auT0.Add(10 * time.Minute)
	h.store = report.NewStore("boot-1")
	if _, err := h.store.Load(state); err != nil {
		t.Fatal(err)
	}
	c2 := h.check(nil)
	probeAudit(t, c2, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own)")

	// A new boot: the last interval, by timestamp.
	if err := h.store.Save(state, h.now); err != nil {
		t.Fatal(err)
	}
	h.append(auditLine("alice", h.now.Add(-10*time.Second), "203.0.113.9"))
	h.store = report.NewStore("boot-2")
	if _, err := h.store.Load(state); err != nil {
		t.Fatal(err)
	}
	c3 := h.check(nil)
	probeAudit(t, c3, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" in the last 1m carry a client address (203.0.113.9)")

	// The one-shot check keeps nothing: each run looks at the last interval.
	env := h.env(nil)
	env.Memos = nil
	for range 2 {
		c4, _ := newSourceIPCheck(env)
		probeAudit(t, c4, report.StatusFalse, report.ReasonSourceIPAvailable,
			"1 of 1 audit records of requests by "+users+" in the last 1m carry a client address (203.0.113.9)")
	}
}

// proxy_addresses and excluded_user_prefixes are configurable; the user of
// an impersonating request is the impersonated one.
func TestSourceIPConfigured(t *testing.T) {
	h := newAuditHost(t)
	imp := strings.Replace(auditLine("system:serviceaccount:kubegate:proxy", auT0, "203.0.113.7", "10.0.0.5"),
		`"sourceIPs"`, `"impersonatedUser":{"username":"alice"},"sourceIPs"`, 1)
	h.append(auditLine("alice", auT0, "10.0.0.5"), auditLine("bob", auT0, "fd00::7"),
		auditLine("kubegate-sync", auT0, "198.51.100.4"))
	c := h.check(func(k *config.APIServerSourceIPUnavailable) {
		k.ProxyAddresses = []string{"10.0.0.0/24", "fd00::7"}
		k.ExcludedUserPrefixes = []string{"system:", "kubegate-"}
	})
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 2 audit records of requests by "+users+" in the last 1m carries a client address: their sourceIPs hold only 10.0.0.5, fd00::7 (loopback or the proxy's own)")
	h.append(imp)
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carry a client address (203.0.113.7)")

	// Five addresses are named, then a count.
	h.append(auditLine("alice", auT0, "203.0.113.1", "203.0.113.2", "203.0.113.3"), auditLine("alice", auT0, "203.0.113.4", "203.0.113.5", "203.0.113.6", "203.0.113.1", "203.0.113.7"))
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"2 of 2 audit records of requests by "+users+" since 2026-12-02T18:00:00Z carry a client address (203.0.113.1, 203.0.113.2, 203.0.113.3, 203.0.113.4, 203.0.113.5, and 2 more)")

	if _, err := newSourceIPCheck(h.env(func(k *config.APIServerSourceIPUnavailable) { k.ProxyAddresses = []string{"nope"} })); err == nil {
		t.Error("a bad proxy address was accepted")
	}
}

func TestParseAddressOrPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.5":            "10.0.0.5/32",
		"10.0.0.9/24":         "10.0.0.0/24",
		"fd00::7":             "fd00::7/128",
		"::ffff:10.0.0.5":     "10.0.0.5/32",
		"::ffff:10.0.0.0/120": "10.0.0.0/24",
	} {
		p, err := config.ParseAddressOrPrefix(in)
		if err != nil || p.String() != want {
			t.Errorf("%s: %v %v, want %s", in, p, err, want)
		}
	}
	for _, in := range []string{"", "10.0.0.0/33", "fe80::1%eth0", "host.example", "10.0.0.5:80"} {
		if p, err := config.ParseAddressOrPrefix(in); err == nil {
			t.Errorf("%q parsed as %v", in, p)
		}
	}
}

// The line parser never panics; what it accepts is a record with valid,
// unmapped addresses.
func FuzzParseAuditLine(f *testing.F) {
	if b, err := os.ReadFile("testdata/audit/kube-apiserver-v1.37.log"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f.Add([]byte(l))
		}
	}
	f.Add([]byte(auditLine("alice", auT0, "::ffff:1.2.3.4", "fe80::1%eth0")))
	f.Add([]byte(`{"kind":"Event","apiVersion":"audit.k8s.io/v1","stageTimestamp":"2026-12-02T18:00:00Z","impersonatedUser":null}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := parseAuditLine(line)
		if err != nil {
			return
		}
		for _, a := range r.Addrs {
			if !a.IsValid() || a.Is4In6() {
				t.Errorf("address %v", a)
			}
		}
	})
}

// The log reader, on any content, written in any two parts: no error, no
// panic, and the position stays on a line boundary within the file.
func FuzzAuditLog(f *testing.F) {
	f.Add([]byte(auditLine("alice", auT0, "127.0.0.1")+auditLine("bob", auT0, "203.0.113.7")), uint16(50))
	f.Add([]byte("x\n\n\x00"+auditLine("alice", auT0)), uint16(3))
	base := config.Default()
	f.Fuzz(func(t *testing.T, content []byte, split uint16) {
		defer func(n int64) { maxAuditLine = n }(maxAuditLine)
		maxAuditLine = 64
		h := newAuditHost(t)
		k := int(split) % (len(content) + 1)
		h.append(string(content[:k]))
		cfg := *base
		cfg.HostRoot = h.root
		cc, err := newSourceIPCheck(&Env{Config: &cfg, Role: report.RoleControlPlane, Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return h.now }, Memos: h.store})
		if err != nil {
			t.Fatal(err)
		}
		c := cc.(*sourceIPCheck)
		for _, part := range [][]byte{nil, content[k:]} {
			h.append(string(part))
			r, err := c.Probe(context.Background())
			if d, _ := report.Lookup("APIServerSourceIPUnavailable"); err != nil || !d.ValidReason(r.Status, r.Reason) {
				t.Fatalf("%+v %v", r, err)
			}
			cur := c.cursor()
			fi, _ := os.Stat(h.path())
			if cur.Offset < 0 || cur.Offset > fi.Size() || cur.Ino != fi.Sys().(*syscall.Stat_t).Ino {
				t.Fatalf("cursor %+v, file of %d bytes", cur, fi.Size())
			}
			if cur.Offset > 0 && content[cur.Offset-1] != '\n' && cur.Offset != fi.Size() {
				t.Fatalf("cursor %d is not after a newline", cur.Offset)
			}
		}
	})
}

// The defaults README states.
func TestSourceIPDefaults(t *testing.T) {
	k := config.Default().Checks.APIServerSourceIPUnavailable
	if k.AuditLog != auditLogPath || !slices.Equal(k.ExcludedUserPrefixes, []string{"system:"}) || len(k.ProxyAddresses) != 0 ||
		k.MaxReadBytes != 64<<20 || k.Interval.Duration != time.Minute {
		t.Errorf("defaults %+v", k)
	}
}

// One probe over a window of the real lines of
// testdata/audit/kube-apiserver-v1.37.log repeated to 8 MiB (b.SetBytes: the
// throughput of the reader and parser).
func BenchmarkSourceIPWindow(b *testing.B) {
	lines, err := os.ReadFile("testdata/audit/kube-apiserver-v1.37.log")
	if err != nil {
		b.Fatal(err)
	}
	window := bytes.Repeat(lines, (8<<20)/len(lines))
	h := &auditHost{t: nil, root: b.TempDir(), now: auT0, store: report.NewStore("boot-1")}
	if err := os.MkdirAll(filepath.Dir(h.path()), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(h.path(), nil, 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := config.Default()
	cfg.HostRoot = h.root
	c, err := newSourceIPCheck(&Env{Config: cfg, Role: report.RoleControlPlane, Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return h.now }, Memos: h.store})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Probe(ctx); err != nil { // the position: the end of the empty log
		b.Fatal(err)
	}
	f, err := os.OpenFile(h.path(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(int64(len(window)))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := f.Write(window); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		r, err := c.Probe(ctx)
		if err != nil || r.Status != report.StatusFalse {
			b.Fatalf("%+v %v", r, err)
		}
	}
}

// Malformed lines are logged once per kind of error, not at every probe
// (the message says them each time): bad values of one field are one kind
// (the text names the value); after a probe that read records and none
// malformed, malformed lines are logged again.
func TestSourceIPLogsMalformedOnce(t *testing.T) {
	h := newAuditHost(t)
	h.append("not json\n")
	env := h.env(nil)
	var logs bytes.Buffer
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	env.Malformed = NewMalformedLines(nil)
	c, _ := newSourceIPCheck(env)
	stamp := func(v string) string {
		return `{"kind":"Event","apiVersion":"audit.k8s.io/v1","user":{"username":"alice"},"stageTimestamp":"` + v + `"}` + "\n"
	}
	good := auditLine("alice", h.now, "203.0.113.7")
	count := func() int { return strings.Count(logs.String(), "skipped malformed lines of the audit log") }
	for i, step := range []struct {
		line      string
		want      int     // log lines so far
		malformed float64 // autopilot_health_malformed_lines_total{reader="audit-log"} so far: each line once
	}{
		{"", 1, 1},
		{"nope\n", 1, 2},         // the same kind (not JSON), another text
		{"[1]\n", 2, 3},          // another kind
		{stamp("monday"), 3, 4},  // another kind
		{stamp("tuesday"), 3, 5}, // the same kind, another value
		{"", 3, 5},               // nothing new read
		{good, 3, 5},             // records, none malformed
		{stamp("friday"), 4, 6},  // back: logged again
	} {
		h.append(step.line)
		if _, err := c.Probe(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := count(); got != step.want {
			t.Fatalf("after step %d (%q): %d log lines, want %d:\n%s", i, step.line, got, step.want, logs.String())
		}
		if got := env.Malformed.Value(MalformedAuditLog); got != step.malformed {
			t.Fatalf("after step %d (%q): %v malformed lines counted, want %v", i, step.line, got, step.malformed)
		}
	}
	if !strings.Contains(logs.String(), "cannot unmarshal array") {
		t.Errorf("the log does not name the error:\n%s", logs.String())
	}
}

// A FIFO at the audit log's path is refused at once (not a regular file,
// Unknown): before, the open waited for a writer that never came, the run
// was abandoned at its timeout and every later one was refused as "an
// earlier probe is still reading the audit log".
func TestSourceIPFIFOIsRefusedAtOnce(t *testing.T) {
	h := newAuditHost(t)
	if err := syscall.Mkfifo(h.path(), 0o600); err != nil {
		t.Fatal(err)
	}
	c := h.check(nil)
	if err, want := probeFIFO(t, c, h.path()), auditLogPath+" is not a regular file"; err == nil || err.Error() != want {
		t.Errorf("a FIFO: %v; want %q", err, want)
	}
}

// audit_log is applied by a reload (and by a restart with the state file):
// the position kept is in the file the old path named, so the new path's
// file is read as a first probe reads, its last interval. Before, the new
// file was taken for the old one rotated: "the log was rotated and the old
// file is no longer in ..." and every record in it, hours old, up to
// max_read_bytes, judged the first window.
func TestSourceIPAuditLogMovedByAReload(t *testing.T) {
	const moved = "/var/log/kube-audit/audit.log"
	h := newAuditHost(t)
	h.append(auditLine("alice", auT0.Add(-10*time.Second), "203.0.113.7"))
	probeAudit(t, h.check(nil), report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" in the last 1m carry a client address (203.0.113.7)")

	// kube-apiserver now writes to another path, with records of hours
	// ago that carried a client address, and one of the last minute that
	// does not; the operator sets audit_log to it and reloads.
	p := filepath.Join(h.root, moved)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	h.now = auT0.Add(time.Minute)
	if err := os.WriteFile(p, []byte(auditLine("alice", auT0.Add(-3*time.Hour), "198.51.100.1")+
		auditLine("bob", h.now.Add(-10*time.Second), "127.0.0.1")), 0o600); err != nil {
		t.Fatal(err)
	}
	c := h.check(func(k *config.APIServerSourceIPUnavailable) { k.AuditLog = moved })
	probeAudit(t, c, report.StatusTrue, report.ReasonSourceIPMissingInAudit,
		"none of the 1 audit records of requests by "+users+" in the last 1m carries a client address: their sourceIPs hold only 127.0.0.1 (loopback or the proxy's own)")

	// From then on it reads on from where it left off in the new file.
	h.now = auT0.Add(2 * time.Minute)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(auditLine("carol", h.now.Add(-5*time.Second), "203.0.113.8")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	probeAudit(t, c, report.StatusFalse, report.ReasonSourceIPAvailable,
		"1 of 1 audit records of requests by "+users+" since 2026-12-02T18:01:00Z carry a client address (203.0.113.8)")
}
