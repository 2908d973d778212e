package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

func init() { Register("NodeTampered", newNodeTamperedCheck) }

// TamperMemoKey is the name under which NodeTampered keeps, in the state
// file, the digest of this boot's baseline: a baseline that is gone from,
// or replaced in, the tamper state file within the boot is a finding.
const TamperMemoKey = "tamper"

// TamperUnsettledMemoKey is the name under which NodeTampered keeps, in the
// state file, why this boot's baseline was taken before it settled (with
// the baseline's digest): a daemon restart within the boot still says so.
const TamperUnsettledMemoKey = "tamper/unsettled"

// unsettledNote is why the baseline of digest Digest was taken before it
// settled ("" Why: it settled).
type unsettledNote struct {
	Digest string `json:"digest"`
	Why    string `json:"why"`
}

// nodeTamperedCheck: a protected path (checks.NodeTampered.paths) added,
// removed or changed since this boot's baseline. The baseline is taken at
// the first run after boot once the node has joined and the protected files
// have settled, and kept in the tamper state file (Env.Tamper), so a daemon
// restart within the boot reuses it. Findings stay until an operator clears
// them; a revert does not. File notifications wake the check (Watch), the
// interval's full scan catches what they miss.
type nodeTamperedCheck struct {
	env  *Env
	spec tamper.Spec
	gate []string
	// tolerate are the globs of protected paths whose changes are
	// reported but set nothing on this node (tolerate, and tolerate_gpu on
	// a GPU node).
	tolerate []string
	settle   time.Duration
	maxWait  time.Duration
	keeper   *tamper.Keeper
	// scanSaid: the scan's malformed lines of the mount table said last
	// (scanned).
	scanSaid hostio.MalformedSaid

	restoreOnce sync.Once
	// memo is this boot's baseline digest, kept in the state file: read
	// from the keeper at every save (KeptDigest), so that the state file
	// never names a baseline tamper.json does not hold on disk.
	memo bootValue[string]
	// unsettled says why this boot's baseline was taken before it
	// settled, kept in the state file: a restart (or a reload) within the
	// boot does not drop it from the False message. Like memo, it is read
	// from the keeper (Keeper.Unsettled), shared by the instances a reload
	// builds: the state file keeps the note of whichever took the baseline.
	unsettled  bootValue[unsettledNote]
	loadLogged sync.Once
	// scopeLogged: the protected paths differ from the baseline's (logged
	// once per instance: a reload that changes them makes a new one).
	scopeLogged sync.Once

	mu sync.Mutex
	// candidate is the digest of the protected files while the baseline
	// settles, since when they have been unchanged.
	candidate string
	since     time.Time
	// candEntries are the entries of candidate; changed is the last path
	// seen changing while the baseline settles.
	candEntries []tamper.Entry
	changed     string
	// waitSince is this boot's first run without a baseline (the start of
	// maxWait).
	waitSince time.Time
	dirs      []string
	// watch gets the directories to watch and when to wake for the
	// baseline, after each run (latest wins).
	watch chan watchPlan
}

type watchPlan struct {
	dirs   []string
	wakeAt time.Time // zero: no wake planned
}

func newNodeTamperedCheck(env *Env) (Check, error) {
	c := env.Config.Checks.NodeTampered
	tolerate := slices.Clone(c.Tolerate)
	if env.GPU {
		tolerate = append(tolerate, c.TolerateGPU...)
	}
	k := tamperKeeper(env)
	nc := &nodeTamperedCheck{env: env, spec: tamper.Spec{Patterns: c.Paths, Exclude: c.Exclude},
		gate: c.BaselineAfter, tolerate: tolerate, settle: c.Settle.Duration, maxWait: c.BaselineMaxWait.Duration, keeper: k, watch: make(chan watchPlan, 1),
		memo: bootValue[string]{key: TamperMemoKey, read: k.KeptDigest}, unsettled: bootValue[unsettledNote]{key: TamperUnsettledMemoKey, read: func() unsettledNote {
			d, why := k.Unsettled()
			return unsettledNote{Digest: d, Why: why}
		}}}
	// The saved digest is read now, and from now on the keeper's is saved:
	// a clear before the first run (the daemon just started) saves the
	// state file without the baseline it drops, not the digest restored.
	nc.memo.restore(env.Memos)
	nc.unsettled.restore(env.Memos)
	if n := nc.unsettled.get(); n.Digest != "" {
		k.RestoreUnsettled(n.Digest, n.Why)
	}
	return nc, nil
}

// tamperKeeper returns the daemon's keeper, or one that reads the daemon's
// tamper state without writing it (the one-shot check).
func tamperKeeper(env *Env) *tamper.Keeper {
	if env.Tamper != nil {
		return env.Tamper
	}
	return tamper.NewKeeper(env.Config.StateDir, env.BootID, true)
}

// load reads the tamper state once, and checks this boot's baseline against
// the digest kept in the state file: gone or replaced within the boot is a
// finding (BaselineCorrupt), never a silent new baseline.
func (c *nodeTamperedCheck) load(now time.Time) {
	if err := c.keeper.Load(now); err != nil {
		c.loadLogged.Do(func() {
			if c.keeper.ReadOnly() {
				c.env.Log.Warn("cannot read the daemon's tamper state; its baseline is not compared", "file", c.keeper.Path(), "err", err)
				return
			}
			c.env.Log.Error("tamper state unreadable; it is itself a finding", "file", c.keeper.Path(), "err", err)
		})
	}
	c.restoreOnce.Do(func() {
		c.memo.restore(c.env.Memos)
		saved := c.memo.get()
		if c.env.Memos == nil || saved == "" {
			return
		}
		st := c.keeper.State()
		if st.Baseline != nil && st.Baseline.BootID == c.keeper.BootID() && st.Baseline.Digest == saved {
			return
		}
		detail := fmt.Sprintf("this boot's baseline %s is gone from the tamper state", saved)
		if st.Baseline != nil && st.Baseline.BootID == c.keeper.BootID() {
			detail = fmt.Sprintf("this boot's baseline %s was replaced by %s", saved, st.Baseline.Digest)
		}
		c.env.Log.Error("baseline of this boot gone or replaced; it is a finding", "file", c.keeper.Path(), "detail", detail)
		// No exception for a clear recorded in the tamper state file: a
		// forged clear would drop the baseline unseen. A genuine clear
		// empties the digest kept before it drops the baseline (the
		// daemon saves the state file first: Keeper.PrepareClear), and
		// keeps the new one once it is written (KeptDigest).
		c.keeper.Update(func(s *tamper.State) bool {
			return s.AddFinding(tamper.Finding{Condition: tamper.CondNode, Path: c.keeper.Path(), Kind: tamper.Corrupt,
				At: now.UTC(), BootID: c.keeper.BootID(), Detail: detail})
		})
	})
}

// keepDigest tells the state file this boot's baseline digest when it
// changed: the keeper's KeptDigest, "" while tamper.json does not hold a
// baseline of this boot on disk (a clear prepared, a baseline whose write
// has not returned).
func (c *nodeTamperedCheck) keepDigest() {
	c.memo.set(c.env.Memos, c.keeper.KeptDigest())
}

func (c *nodeTamperedCheck) Probe(ctx context.Context) (Result, error) {
	now := c.env.Now()
	c.load(now)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	cur, notes, err := c.env.scan(c.spec)
	c.scanned(notes)
	var over *tamper.LimitError
	st := c.keeper.State()
	haveBase := st.Baseline != nil && st.Baseline.BootID == c.keeper.BootID()
	if err != nil && !errors.As(err, &over) {
		return Result{}, err
	}
	// A baseline larger than the tamper state file may hold is cut as the
	// scan is at its cap: the paths that fit, and an over-limit finding.
	cur, over = tamper.FitBaseline(c.keeper.BootID(), c.spec, cur, over)
	pending := ""
	if !haveBase {
		// Past the cap, the baseline is of the paths within it, and the
		// over-limit is a finding at once (failing every run instead would
		// never take a baseline, and leave every later change unseen).
		pending = c.takeBaseline(now, cur)
		if st = c.keeper.State(); pending == "" && over != nil && st.Baseline != nil {
			c.record(now, st.Baseline, cur, over)
		}
	} else {
		c.record(now, st.Baseline, cur, over)
	}
	c.keeper.SetPending(pending)
	c.plan(cur, pending, now)
	st = c.keeper.State()
	c.keepDigest()
	var unreadable []tamper.Entry
	for _, e := range cur {
		if e.Kind == tamper.KindUnreadable {
			unreadable = append(unreadable, e)
		}
	}
	res := c.result(st, pending, unreadable)
	if d, why := c.keeper.Unsettled(); res.Reason == report.ReasonNodeIntact && why != "" && st.Baseline != nil && d == st.Baseline.Digest {
		res.Message += " (baseline " + why + ")"
	}
	res.Details = []report.Detail{{Domain: "tamper", Field: "tamper", Value: c.keeper.Report()}}
	return res, nil
}

// takeBaseline takes this boot's baseline when the node is ready for it and
// returns "", or says why it is not taken yet.
func (c *nodeTamperedCheck) takeBaseline(now time.Time, cur []tamper.Entry) string {
	if c.keeper.ReadOnly() {
		if err := c.keeper.Load(now); err != nil {
			return fmt.Sprintf("cannot read the daemon's baseline: %v", err)
		}
		return fmt.Sprintf("%s holds no baseline of this boot (the daemon takes it)", c.keeper.Path())
	}
	c.mu.Lock()
	if c.waitSince.IsZero() {
		c.waitSince = now
	}
	overdue := c.maxWait > 0 && now.Sub(c.waitSince) >= c.maxWait
	c.mu.Unlock()
	unsettled := ""
	// After an operator's clear in this boot the node is accepted as it is
	// now: neither the gate nor settling is waited for.
	st := c.keeper.State()
	retake := st.RetakeNow(c.keeper.BootID())
	for _, g := range c.gate {
		if retake {
			break
		}
		if m, _ := filepath.Glob(c.env.Path(g)); len(m) == 0 {
			if !overdue {
				// The glob cut as a path is (no key bounds its length):
				// the message keeps its end where it is cut.
				return fmt.Sprintf("waiting for %s before taking this boot's baseline (at most %s)", clipPath(g), config.ShortDuration(c.maxWait))
			}
			unsettled = fmt.Sprintf("taken unsettled after %s: nothing matched %s", config.ShortDuration(c.maxWait), clipPath(g))
			break
		}
	}
	b := tamper.NewBaseline(c.keeper.BootID(), now, c.spec, cur)
	sum := tamper.EntriesDigest(cur)
	c.mu.Lock()
	if c.settle > 0 && !retake && unsettled == "" && (c.candidate != sum || now.Sub(c.since) < c.settle) {
		if c.candidate != sum {
			if c.candEntries != nil || c.candidate != "" {
				if d := tamper.Diff(c.candEntries, cur); len(d) > 0 {
					c.changed = d[0].Path
				}
			}
			c.candidate, c.since, c.candEntries = sum, now, cur
		}
		if !overdue {
			c.mu.Unlock()
			return fmt.Sprintf("taking this boot's baseline once the protected files are unchanged for %s (at most %s)", config.ShortDuration(c.settle), config.ShortDuration(c.maxWait))
		}
		unsettled = fmt.Sprintf("taken unsettled after %s: %s still changing", config.ShortDuration(c.maxWait), c.changed)
	}
	c.mu.Unlock()
	if unsettled != "" {
		c.env.Log.Warn("baseline taken before it settled", "why", unsettled)
	}
	if c.keeper.SetUnsettled(b.Digest, unsettled) && c.env.Memos != nil {
		c.env.Memos.Touch()
	}
	if err := c.keeper.Update(func(s *tamper.State) bool { s.Baseline, s.Retake, s.RetakeBoot = b, false, ""; return true }); err != nil {
		c.env.Log.Error("saving the baseline failed", "file", c.keeper.Path(), "err", err)
	}
	c.env.Log.Info("baseline taken", "files", len(cur), "digest", b.Digest)
	return ""
}

// record adds a finding for every difference from the baseline not recorded
// yet.
// A scan cut at the cap (over) is itself a finding, and the paths it
// reached are still compared.
func (c *nodeTamperedCheck) record(now time.Time, base *tamper.Baseline, cur []tamper.Entry, over *tamper.LimitError) {
	// The protected paths changed within the boot (a reload, a restart):
	// compared where the baseline's scope and today's both reach.
	baseEntries, inScope, same := tamper.InScope(base, c.spec, cur)
	if !same {
		c.scopeLogged.Do(func() {
			c.env.Log.Warn("the protected paths differ from those of this boot's baseline: compared where both reach; paths newly protected are compared from the next boot's baseline or an operator's clear",
				"baseline", base.Digest)
		})
	}
	var diffs []tamper.Difference
	if over != nil {
		diffs = append(diffs, tamper.Difference{Path: over.At, Kind: tamper.OverLimit})
		diffs = append(diffs, tamper.DiffWithin(c.spec, over.At, baseEntries, inScope)...)
	} else {
		diffs = tamper.Diff(baseEntries, inScope)
	}
	if len(diffs) == 0 {
		return
	}
	byPath := map[string]tamper.Entry{}
	for _, e := range cur {
		byPath[e.Path] = e
	}
	var added, tolerated []tamper.Finding
	err := c.keeper.Update(func(s *tamper.State) bool {
		if s.Baseline == nil || s.Baseline.Digest != base.Digest {
			return false // cleared (or replaced) since this run read it
		}
		for _, d := range diffs {
			f := tamper.Finding{Condition: tamper.CondNode, Path: d.Path, Kind: d.Kind, At: now.UTC(), BootID: c.keeper.BootID()}
			if e, ok := byPath[d.Path]; ok {
				f.Detail = e.Describe()
			}
			if d.Kind == tamper.OverLimit {
				f.Detail = over.Error() + "; paths past the cap are not compared"
			}
			// A path the scan could not read is not a known writer's
			// change that was read: a directory that cannot be listed
			// hides what is in it (its files are not reported removed,
			// Diff), which its tolerance does not cover. Nor is a
			// symlink, whose target the scan never reads: a tolerated
			// directory swapped for a link to another hides every file
			// in it, which its readers (containerd's imports) follow.
			if k := byPath[d.Path].Kind; d.Kind != tamper.OverLimit && c.tolerated(d.Path) && k != tamper.KindUnreadable && k != tamper.KindSymlink {
				f.Condition = ""
				if s.AddTolerated(f) {
					tolerated = append(tolerated, f)
				}
				continue
			}
			if s.AddFinding(f) {
				added = append(added, f)
			}
		}
		return len(added)+len(tolerated) > 0
	})
	for _, f := range added {
		c.env.Log.Warn("protected file changed since the baseline", "path", f.Path, "change", f.Kind, "now", f.Detail)
	}
	for _, f := range tolerated {
		c.env.Log.Info("tolerated path changed since the baseline (checks.NodeTampered.tolerate, tolerate_gpu): reported, sets nothing",
			"path", f.Path, "change", f.Kind, "now", f.Detail, "gpu", c.env.GPU)
	}
	if err != nil {
		c.env.Log.Error("saving the tamper state failed", "file", c.keeper.Path(), "err", err)
	}
}

// tolerated reports whether a change of host path p sets nothing on this
// node (a known writer's path, or its temporary file: atomicTemp).
func (c *nodeTamperedCheck) tolerated(p string) bool {
	cands := []string{p}
	if f, ok := atomicTemp(p); ok {
		cands = append(cands, f)
	}
	for _, g := range c.tolerate {
		for _, q := range cands {
			if ok, _ := path.Match(g, q); ok {
				return true
			}
		}
	}
	return false
}

// atomicTemp: p is the temporary file an atomic replace of file leaves in
// the same directory for a moment, "." + its name + random digits (what
// github.com/google/renameio writes, and with it Cilium's CNI configuration;
// os.CreateTemp's names for the pattern "."+name). A run woken by its
// creation may see it. Such a name ends in digits, so neither CNI (by
// extension: .conf, .conflist, .json) nor containerd's imports (*.toml)
// read it.
func atomicTemp(p string) (file string, ok bool) {
	dir, name := path.Split(p)
	trimmed := strings.TrimRight(name, "0123456789")
	if !strings.HasPrefix(name, ".") || len(trimmed) == len(name) || len(trimmed) < 2 {
		return "", false
	}
	return dir + trimmed[1:], true
}

// plan hands the watcher the directories to watch and, while the baseline
// settles, when to run again.
func (c *nodeTamperedCheck) plan(cur []tamper.Entry, pending string, now time.Time) {
	// A directory a pattern's wildcard passes through is watched before
	// it holds a protected file: one written into it wakes the check.
	p := watchPlan{dirs: append(tamper.Dirs(c.spec, cur), tamper.WildcardDirs(c.env.Config.HostRoot, c.spec)...)}
	c.mu.Lock()
	if pending != "" && c.candidate != "" {
		p.wakeAt = c.since.Add(c.settle)
	}
	if pending != "" && c.maxWait > 0 && !c.waitSince.IsZero() {
		if at := c.waitSince.Add(c.maxWait); p.wakeAt.IsZero() || at.Before(p.wakeAt) {
			p.wakeAt = at
		}
	}
	c.mu.Unlock()
	select {
	case <-c.watch:
	default:
	}
	c.watch <- p
}

// unreadable are the protected paths this run could not read: with no
// finding, the condition is Unknown (CheckFailed) while there are any, never
// a False that vouches for paths nobody read.
func (c *nodeTamperedCheck) result(st tamper.State, pending string, unreadable []tamper.Entry) Result {
	fs := st.FindingsFor(tamper.CondNode)
	if len(fs) > 0 {
		reason := report.ReasonProtectedFileChanged
		if slices.ContainsFunc(fs, func(f tamper.Finding) bool { return f.Kind == tamper.Corrupt }) {
			reason = report.ReasonBaselineCorrupt
		}
		return Result{Status: report.StatusTrue, Reason: reason, Message: findingsMessage(fs, st)}
	}
	if pending != "" {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonBaselinePending, Message: pending}
	}
	b := st.Baseline
	if b == nil || b.BootID != c.keeper.BootID() {
		// Cleared (or replaced) between this run's reads: the next run
		// takes the baseline again.
		return Result{Status: report.StatusUnknown, Reason: report.ReasonBaselinePending, Message: "this boot's baseline is being taken again after a clear"}
	}
	if len(unreadable) > 0 {
		var parts []string
		for _, e := range unreadable[:min(len(unreadable), 3)] {
			parts = append(parts, clipPath(e.Path)+" ("+e.Error+")")
		}
		more := ""
		if n := len(unreadable) - len(parts); n > 0 {
			more = fmt.Sprintf(" and %d more", n)
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonCheckFailed,
			Message: fmt.Sprintf("cannot read %d protected path(s), no other change since this boot's baseline (%s, %s): %s%s",
				len(unreadable), b.TakenAt.UTC().Format(time.RFC3339), b.Digest, strings.Join(parts, ", "), more)}
	}
	msg := fmt.Sprintf("%d protected paths unchanged since this boot's baseline (%s, %s)", len(b.Entries), b.TakenAt.UTC().Format(time.RFC3339), b.Digest)
	if n := len(st.Tolerated) + st.ToleratedDropped; n > 0 {
		// The last one named where the state lists one (a file that only
		// counts them is read as it is: the count is not under the
		// baseline's digest).
		last := ""
		if len(st.Tolerated) > 0 {
			l := st.Tolerated[len(st.Tolerated)-1]
			last = fmt.Sprintf(", the last %s %s at %s", l.Path, l.Kind, l.At.UTC().Format(time.RFC3339))
		}
		msg = fmt.Sprintf("no protected path changed since this boot's baseline (%s, %s) but tolerated ones: %d change(s)%s (tolerate, tolerate_gpu; listed in the tamper report)",
			b.TakenAt.UTC().Format(time.RFC3339), b.Digest, n, last)
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonNodeIntact, Message: msg}
}

// clipPath cuts a path for a message to at most 128 bytes (on a rune
// boundary, ending in "…"): a path can be as long as PATH_MAX, the message
// is capped.
func clipPath(p string) string { return report.Cut(p, 128, "…") }

// findingsMessage lists the most recent findings (the report has them all,
// up to its cap).
func findingsMessage(fs []tamper.Finding, st tamper.State) string {
	const show = 5
	var parts []string
	for i := len(fs) - 1; i >= 0 && len(parts) < show; i-- {
		f := fs[i]
		part := fmt.Sprintf("%s %s at %s", f.Path, f.Kind, f.At.UTC().Format(time.RFC3339))
		if f.Kind == tamper.Corrupt {
			part += " (" + f.Detail + ")"
		}
		parts = append(parts, part)
	}
	more := ""
	if n := len(fs) - len(parts); n > 0 {
		more = fmt.Sprintf(" and %d earlier", n)
	}
	since := ""
	if st.Cleared != nil {
		since = " since the clear of " + st.Cleared.At.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%d finding(s)%s: %s%s; stays set until an operator clears it (autopilot-health tamper clear)",
		len(fs), since, strings.Join(parts, "; "), more)
}

// minWatchRetry and maxWatchRetry bound how long Watch waits before it
// opens file notifications again after they were unavailable (a node out
// of inotify instances, fs.inotify.max_user_instances) or stopped: the
// first wait, doubled at each failure up to the second. Variables: tests
// shorten them.
var minWatchRetry, maxWatchRetry = time.Minute, 10 * time.Minute

// newFileWatcher opens the file notifications Watch follows (a test makes
// it fail, as inotify_init1 does on a node out of inotify instances).
var newFileWatcher = tamper.NewWatcher

// scanned counts what a scan skipped of its host input (the hidden
// mounts' lines of the mount table that do not split:
// autopilot_health_malformed_lines_total{reader="mountinfo-scan"}) and
// logs it once per change (hostio.MalformedSaid).
func (c *nodeTamperedCheck) scanned(notes tamper.ScanNotes) {
	c.env.Malformed.Add(MalformedMountScan, notes.MalformedMountinfo)
	key, text := "", ""
	if first := notes.FirstMalformed; first != nil {
		key, text = first.Text, first.Error()
	}
	c.scanSaid.Reading(c.env.Log, notes.MalformedMountinfo, key, "scan: skipped malformed lines of the mount table read for the sandbox's hidden mounts", "path", "/proc/self/mountinfo", "first", text)
}

// mountReadings returns what the mount watcher calls after each reading
// of the mount table: a line the kernel does not write is skipped at each
// reading, counted (autopilot_health_malformed_lines_total{reader=
// "mountinfo-watch"}) and logged once per change (hostio.MalformedSaid).
func (c *nodeTamperedCheck) mountReadings() func(int, *hostio.MalformedMountinfoError) {
	var said hostio.MalformedSaid
	return func(n int, first *hostio.MalformedMountinfoError) {
		c.env.Malformed.Add(MalformedMountWatch, n)
		key, text := "", ""
		if first != nil {
			key, text = first.Text, first.Error()
		}
		said.Reading(c.env.Log, n, key, "mount watcher: skipped malformed lines of the mount table", "path", tamper.MountsFile, "first", text)
	}
}

// Watch follows file notifications on the protected directories and wakes
// the check on a relevant one, and when the settling baseline is due. The
// mount table is followed whether file notifications work or not: a node out
// of inotify instances (fs.inotify.max_user_instances) still has its mounts
// over protected paths wake the check.
func (c *nodeTamperedCheck) Watch(ctx context.Context, wake func()) {
	// A mount over a protected file or directory, or one on the way to
	// them, sends inotify nothing: the mount table's changes wake the
	// check instead (tamper.MountWatcher).
	// Read before the first watch is set (whose wake-up runs the check
	// again): a mount before the reading is read by that run, one after
	// it is reported.
	mctx, mcancel := context.WithCancel(ctx)
	mountsDone := make(chan struct{})
	if m, err := tamper.NewMountWatcher(c.env.Config.HostRoot, c.spec); err != nil {
		c.env.Log.Warn("mount notifications unavailable; a mount over a protected path is found by the interval's scan", "err", err)
		close(mountsDone)
	} else {
		m.OnReading = c.mountReadings()
		m.OnReading(m.Malformed())
		go func() {
			defer close(mountsDone)
			if err := m.Run(mctx, func(string) { wake() }); err != nil {
				c.env.Log.Warn("mount notifications stopped; a mount over a protected path is found by the interval's scan", "err", err)
			}
		}()
	}
	defer func() { mcancel(); <-mountsDone }()
	// done is closed when file notifications stop (nil while they run:
	// a nil channel's receive waits); w is nil without them. Without them
	// the retry timer opens them again (minWatchRetry, doubling up to
	// maxWatchRetry), so a node that ran out of inotify instances for a
	// while (pods starting, each holding some) gets them back.
	var done chan struct{}
	var w *tamper.Watcher
	var dirs []string
	var failedBefore []tamper.WatchFailure
	retryIn := minWatchRetry
	// openedAt: when the running notifications were opened. A stop after
	// they ran maxWatchRetry or longer is a new outage: its first retry
	// waits minWatchRetry again, not the wait the last one reached; one
	// that comes sooner (a watcher that stops as it opens) goes on
	// doubling, so a flapping one costs a scan and two log lines per
	// maxWatchRetry at most.
	var openedAt time.Time
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	// down: why file notifications are not running (the last failed
	// open's error, or the stop's), logged once per change and cleared,
	// with their return logged, when an open works again.
	down := ""
	// stopErr: why the running notifications stopped (set before done is
	// closed).
	var stopErr error
	// watchDirs watches dirs (the last run's hand-over) and wakes the
	// check when directories were added: the run that handed them over
	// scanned them before their watch, and what was written there since
	// sent no notification. One more run reads it (it hands over the same
	// directories: nothing is added, no loop).
	watchDirs := func() {
		var added []string
		var failed []tamper.WatchFailure
		if w != nil {
			added, failed = w.Set(dirs)
		}
		if !slices.Equal(failed, failedBefore) {
			logWatchFailures(c.env.Log, failed)
			failedBefore = failed
		}
		if len(added) > 0 {
			wake()
		}
	}
	// retryLater opens them again after retryIn, and doubles the wait
	// after that.
	retryLater := func() {
		retry.Reset(retryIn)
		retryIn = min(2*retryIn, maxWatchRetry)
	}
	open := func() {
		nw, err := newFileWatcher(c.env.Config.HostRoot)
		if err != nil {
			if text := "unavailable: " + err.Error(); text != down {
				c.env.Log.Warn("file notifications unavailable; changes are found by the interval's scan until they can be opened again", "err", err, "retry_in", retryIn)
				down = text
			}
			retryLater()
			return
		}
		if down != "" {
			c.env.Log.Info("file notifications available again")
			down = ""
		}
		w, done, openedAt = nw, make(chan struct{}), time.Now()
		go func(w *tamper.Watcher, done chan struct{}) {
			defer close(done)
			stopErr = w.Run(ctx, func(ev tamper.Event) {
				// Link: a symlink on the way to a watched directory changed
				// (retargeted); its run watches where it leads now.
				if ev.Overflow || ev.Gone || ev.Link || c.spec.Relevant(ev.Path) {
					wake()
				}
			})
		}(w, done)
		if dirs != nil {
			watchDirs()
		}
	}
	open()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if done != nil {
				<-done
			}
			return
		case <-done:
			// File notifications stopped: the mount table and the
			// settling baseline's timer still wake the check, and the
			// retry opens them again.
			w, done, failedBefore = nil, nil, nil
			if ctx.Err() == nil {
				if time.Since(openedAt) >= maxWatchRetry {
					retryIn = minWatchRetry
				}
				if stopErr != nil {
					c.env.Log.Warn("file notifications stopped; changes are found by the interval's scan until they can be opened again", "err", stopErr, "retry_in", retryIn)
					down = "stopped: " + stopErr.Error()
				}
				retryLater()
			}
		case <-retry.C:
			open()
		case p := <-c.watch:
			dirs = p.dirs
			watchDirs()
			if !p.wakeAt.IsZero() {
				timer.Reset(max(0, time.Until(p.wakeAt)))
			}
		case <-timer.C:
			wake()
		}
	}
}

// logWatchFailures logs the directories file notifications cannot watch,
// one line for each reason (inotify_add_watch's error), so that an
// operator can tell a directory root may not read (EACCES, under the
// packaged units) from a node out of inotify watches (ENOSPC: the user's
// fs.inotify.max_user_watches, which every inotify user on the node
// shares, is spent; raising it lets the next run watch them).
func logWatchFailures(log *slog.Logger, failed []tamper.WatchFailure) {
	var reasons []error
	dirs := map[error][]string{}
	for _, f := range failed {
		if _, ok := dirs[f.Err]; !ok {
			reasons = append(reasons, f.Err)
		}
		dirs[f.Err] = append(dirs[f.Err], f.Dir)
	}
	for _, err := range reasons {
		why := err.Error()
		if errors.Is(err, syscall.ENOSPC) {
			why += ": the inotify watches of the daemon's user are spent (sysctl fs.inotify.max_user_watches)"
		}
		log.Warn("cannot watch these directories; their changes are found by the interval's scan", "dirs", dirs[err], "err", why)
	}
}
