package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("KubeletHeartbeatFailed", newKubeletHeartbeatCheck) }

// KubeletHeartbeatKey is the name under which KubeletHeartbeatFailed keeps,
// in the state file, where it stopped reading the journal and when kubelet
// last gave up.
const KubeletHeartbeatKey = "kubeletheartbeat"

// journalDirs are where journald keeps its files (volatile, persistent).
var journalDirs = []string{"/run/log/journal", "/var/log/journal"}

// kubeletHeartbeatCheck reads kubelet's entries in the journal since its last
// run and looks for the error kubelet logs when it gives up a node-status
// update (kubelet_node_status.go: klog.ErrorS(err, "Unable to update node
// status") with err "update node status exceeds retry count"). True while
// such an entry is within the last window (the check's interval); False once
// a whole window has passed without one.
//
// Each run continues after the cursor of the last entry the previous run
// read, so nothing is read twice or skipped; the cursor and the time of the
// last such entry are kept in the state file (Env.Memos), so a daemon restart
// within the boot continues where it stopped. Without a cursor (the first run
// of the boot, the one-shot check, a unit that has logged nothing yet) it
// reads the last window. Entries logged in another boot than this one (the
// persistent journal keeps them; a quick reboot's first read reaches back
// into them) are read but never a give-up: that kubelet is gone.
type kubeletHeartbeatCheck struct {
	env *Env
	// skippedSaid: journalctl's lines that are not entries were logged
	// and have not stopped since.
	skippedSaid hostio.MalformedSaid
	unit        string
	journalctl  string
	match       [][]byte
	window      time.Duration
	maxEntries  int
	// bootID is this boot's ID as the journal writes it (no dashes), ""
	// when not known.
	bootID string

	st bootValue[kubeletHeartbeatState]

	// fallback is why the last run read the journal with journalctl and
	// not natively (its numbers left out), "" when it did not: logged
	// when it changes.
	fallback string
}

// kubeletHeartbeatState is the saved form of what the check knows.
type kubeletHeartbeatState struct {
	// Cursor is the journal cursor of the last entry of the unit read.
	Cursor string `json:"cursor,omitempty"`
	// Since is where reading began (the first read's --since); ReadTo is when
	// the last read ran: without a cursor the next read starts there.
	Since  time.Time `json:"since,omitzero"`
	ReadTo time.Time `json:"read_to,omitzero"`
	// Last is when the last matching entry read was logged (the journal's
	// time of it); LastMessage is its MESSAGE, shortened.
	Last        time.Time `json:"last,omitzero"`
	LastMessage string    `json:"last_message,omitempty"`
}

func newKubeletHeartbeatCheck(env *Env) (Check, error) {
	c := env.Config.Checks.KubeletHeartbeatFailed
	k := &kubeletHeartbeatCheck{env: env, unit: c.Unit, journalctl: c.Journalctl, window: c.Interval.Duration, maxEntries: c.MaxEntries,
		bootID: strings.ToLower(strings.ReplaceAll(env.BootID, "-", "")),
		st:     bootValue[kubeletHeartbeatState]{key: KubeletHeartbeatKey}}
	for _, m := range c.Match {
		k.match = append(k.match, []byte(m))
	}
	return k, nil
}

func (c *kubeletHeartbeatCheck) state() kubeletHeartbeatState { return c.st.get() }

func (c *kubeletHeartbeatCheck) setState(st kubeletHeartbeatState) { c.st.set(c.env.Memos, st) }

// matches says whether one of the entry's MESSAGE values contains every
// configured string.
func (c *kubeletHeartbeatCheck) matches(e journalEntry) ([]byte, bool) {
	for _, m := range e.Messages {
		all := true
		for _, want := range c.match {
			if !bytes.Contains(m, want) {
				all = false
				break
			}
		}
		if all {
			return m, true
		}
	}
	return nil, false
}

func (c *kubeletHeartbeatCheck) Probe(ctx context.Context) (Result, error) {
	c.st.restore(c.env.Memos)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if err := c.journalPresent(); err != nil {
		return Result{}, err
	}
	now := c.env.Now()
	prev := c.state()
	st := prev
	q := c.query(&st, now)
	found := 0
	read, err := c.readJournal(ctx, q, func(e journalEntry) {
		if c.bootID != "" && e.BootID != "" && e.BootID != c.bootID {
			// The kubelet of an earlier boot: the persistent journal
			// holds it, and a quick reboot's first read (the last
			// window) reaches back into it.
			return
		}
		msg, ok := c.matches(e)
		if !ok {
			return
		}
		found++
		// The last one read is the last one logged, whatever its time:
		// journalctl prints the entries in the journal's order (by
		// sequence number), and a give-up logged after the clock was set
		// back is stamped before the one logged before the step.
		st.Last, st.LastMessage = e.Realtime, shorten(string(msg), 300)
	})
	if read.Cursor != "" {
		st.Cursor = read.Cursor
	}
	if err != nil {
		if exit := (*exec.ExitError)(nil); q.After != "" && errors.As(err, &exit) {
			// journalctl refuses a cursor it cannot seek to ("Failed to seek
			// to cursor"): the next read starts from the last read's time.
			st.Cursor = ""
		}
		c.setState(st)
		return Result{}, err
	}
	st.ReadTo = now
	c.setState(st)
	note := ""
	// Lines of journalctl's output that are not entries are counted
	// (the cursor is past them: each once) and logged once, not at each
	// run, until a run reads entries and none such (skippedSaid).
	c.env.Malformed.Add(MalformedJournalctl, read.Skipped)
	if read.Skipped > 0 || read.Entries > 0 {
		c.skippedSaid.Reading(c.env.Log, read.Skipped, "not journal entries", "skipped journalctl output that is not journal entries", "unit", c.unit, "first", read.FirstBad)
	}
	if read.Skipped > 0 {
		if read.Entries == 0 {
			return Result{}, fmt.Errorf("journalctl printed %d %s (first: %s)", read.Skipped, plural(read.Skipped, "line that is not a journal entry", "lines that are not journal entries"), read.FirstBad)
		}
		note = fmt.Sprintf("; skipped %d %s (first: %s)", read.Skipped, plural(read.Skipped, "line of journalctl output that is not a journal entry", "lines of journalctl output that are not journal entries"), read.FirstBad)
	}
	window := config.ShortDuration(c.window)
	// True while the last give-up is within the window, and also when this
	// run is the first to read one that was within the window of the last
	// successful read: runs are an interval apart plus their own time (more
	// after a failed run or a restart), and a give-up logged just after one
	// run must not be first read by the next one as already too old. A time
	// in the future (the clock stepped back) counts for a minute at most.
	age := now.Sub(st.Last)
	recent := !st.Last.IsZero() && age >= -time.Minute && age <= c.window
	firstRead := found > 0 && !prev.ReadTo.IsZero() && st.Last.After(prev.ReadTo.Add(-c.window))
	switch {
	case recent:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeStatusUpdateGaveUp,
			Message: fmt.Sprintf("kubelet gave up updating the node status: %s logged at %s (within the last %s; %d such entries since the last run): %s%s",
				c.unit, st.Last.Format(time.RFC3339), window, found, st.LastMessage, note)}, nil
	case firstRead:
		return Result{Status: report.StatusTrue, Reason: report.ReasonNodeStatusUpdateGaveUp,
			Message: fmt.Sprintf("kubelet gave up updating the node status: %s logged at %s (first read in this run, within %s of the last read at %s; %d such entries): %s%s",
				c.unit, st.Last.Format(time.RFC3339), window, prev.ReadTo.Format(time.RFC3339), found, st.LastMessage, note)}, nil
	}
	if read.Truncated {
		return Result{}, fmt.Errorf("%s logged more than max_entries (%d) entries since the last run: read the first ones, the rest on the next run%s",
			c.unit, c.maxEntries, note)
	}
	if st.Cursor == "" && read.Entries == 0 {
		// Not one entry of the unit since reading began: a wrong unit name
		// or a kubelet that does not log to the journal would otherwise be
		// a clean window forever.
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNoData,
			Message: fmt.Sprintf("no journal entries of %s since %s: is that kubelet's unit, and does it log to the journal?%s", c.unit, st.Since.Format(time.RFC3339), note)}, nil
	}
	last := "none since " + st.Since.Format(time.RFC3339)
	if !st.Last.IsZero() {
		last = "the last one at " + st.Last.Format(time.RFC3339)
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonKubeletHeartbeatOK,
		Message: fmt.Sprintf("%s logged no entry with %s in the last %s (%d %s read); %s%s", c.unit, c.what(), window, read.Entries, plural(read.Entries, "entry", "entries"), last, note)}, nil
}

// readJournal reads q from the journal files natively (readJournalNative)
// and, where that meets something it does not handle, with journalctl from
// where the native read stopped: the entries it already gave are not read
// again. Why it fell back is logged once per change, and once when it reads
// natively again; each run that falls back is counted by its reason
// (Env.JournalFallbacks).
func (c *kubeletHeartbeatCheck) readJournal(ctx context.Context, q journalQuery, fn func(journalEntry)) (journalRead, error) {
	root := c.env.Path("/")
	nr, err := readJournalNative(ctx, root, q, fn)
	if err == nil {
		if c.fallback != "" {
			c.env.Log.Info("reading the journal files natively again, without journalctl", "unit", c.unit)
			c.fallback = ""
		}
		return nr, nil
	}
	if ctx.Err() != nil {
		return nr, ctx.Err()
	}
	c.env.JournalFallbacks.add(fallbackReason(err))
	why := err.Error()
	if key := journalNumbers.ReplaceAllString(why, "N"); key != c.fallback {
		c.fallback = key
		level := slog.LevelWarn
		if errors.Is(err, errJournalUnsupported) {
			level = slog.LevelInfo
		}
		c.env.Log.Log(ctx, level, "reading the journal with journalctl: the native reader cannot", "unit", c.unit, "why", why, "entries_read_natively", nr.Entries)
	}
	jq := q
	if nr.Cursor != "" {
		jq.After = nr.Cursor
	}
	if q.Max > 0 {
		jq.Max = q.Max - nr.Entries
	}
	jr, err := readJournal(ctx, jq, fn)
	jr.Entries += nr.Entries
	if jr.Cursor == "" {
		jr.Cursor = nr.Cursor
	}
	return jr, err
}

// journalNumbers are the offsets, sizes and counts in a native reader's
// error, which may move from run to run while the reason stays.
var journalNumbers = regexp.MustCompile(`[0-9]+`)

// query is the next read: after the cursor, else from the last read or the
// last window (which then is where reading began, st.Since).
func (c *kubeletHeartbeatCheck) query(st *kubeletHeartbeatState, now time.Time) journalQuery {
	q := journalQuery{Journalctl: c.journalctl, Unit: c.unit, After: st.Cursor, Max: c.maxEntries}
	if root := c.env.Config.HostRoot; root != "" && root != "/" {
		q.Root = root // journalctl reads the journal directories under it
	}
	if q.After == "" {
		q.Since = now.Add(-c.window)
		if !st.ReadTo.IsZero() && st.ReadTo.Before(q.Since) {
			q.Since = st.ReadTo
		}
		if st.Since.IsZero() {
			st.Since = q.Since.Truncate(time.Second)
		}
	}
	return q
}

// what names the entries looked for.
func (c *kubeletHeartbeatCheck) what() string {
	q := make([]string, len(c.match))
	for i, m := range c.match {
		q[i] = fmt.Sprintf("%q", string(m))
	}
	return strings.Join(q, " and ")
}

// journalPresent: journalctl reads nothing, successfully, where there are no
// journal files; say so instead of reporting a clean window.
func (c *kubeletHeartbeatCheck) journalPresent() error {
	for _, d := range journalDirs {
		for _, pat := range []string{"*.journal", "*/*.journal"} {
			if m, _ := filepath.Glob(filepath.Join(c.env.Path(d), pat)); len(m) > 0 {
				return nil
			}
		}
	}
	// Glob passes over a directory it may not read: a journal that is
	// there but not the reader's (`autopilot-health check` without sudo:
	// journald's machine directory is root:systemd-journal, 2750) is no
	// missing journald.
	var denied []string
	for _, d := range journalDirs {
		dir := c.env.Path(d)
		if notPermitted(dir) {
			denied = append(denied, d)
			continue
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.IsDir() && notPermitted(filepath.Join(dir, e.Name())) {
				denied = append(denied, path.Join(d, e.Name()))
			}
		}
	}
	if len(denied) > 0 {
		if journalReaderUID() == 0 {
			// Root, and refused: the daemon under its unit holds no
			// capability (CapabilityBoundingSet= empty), so a directory
			// root does not own, or an ACL, refuses it; SELinux and
			// AppArmor refuse root with every capability too. "Run it as
			// root" would send the operator nowhere.
			return fmt.Errorf("cannot read the journal: %s: permission denied to root (the daemon's unit gives it no capability to pass over a directory's owner, mode or ACL; or SELinux or AppArmor refuses it)", strings.Join(denied, ", "))
		}
		return fmt.Errorf("cannot read the journal: %s: permission denied (run it as root, or as a member of the systemd-journal group)", strings.Join(denied, ", "))
	}
	return fmt.Errorf("no journal files in %s: is systemd-journald running?", strings.Join(journalDirs, " or "))
}

// journalReaderUID is the user the journal is read as (tests that read it
// as another user through setfsuid, with the process still root, say so).
var journalReaderUID = os.Geteuid

// notPermitted reports whether the directory dir may not be listed.
func notPermitted(dir string) bool {
	f, err := os.Open(dir)
	if err == nil {
		_, err = f.Readdirnames(1)
		f.Close()
	}
	return errors.Is(err, fs.ErrPermission)
}

// shorten cuts s to at most n bytes of printable text (report.Printable: a
// MESSAGE's control characters and the bytes that are not UTF-8 written
// \xNN, as every message has them), at a character's start and not inside
// a \xNN.
func shorten(s string, n int) string {
	s = report.Printable(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	for k := 1; k <= 3 && k <= n; k++ {
		if s[n-k] == '\\' && s[n-k+1] == 'x' {
			n -= k
			break
		}
	}
	return s[:n] + "..."
}
