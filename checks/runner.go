package checks

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/report"
)

// Watcher is a check that learns of changes between its runs (file
// notifications). The runner runs Watch beside the check's loop until the
// loop stops; a call of wake runs the check again soon: at once, but never
// sooner than minWakeGap after the start of its previous run.
type Watcher interface {
	Watch(ctx context.Context, wake func())
}

// Closer is a check that keeps something open between its runs (a probe's
// connection). The runner closes it once its loop stopped for good: the
// check removed or replaced by a reload (Apply), or the runner stopped
// (Run). A probe still running then (one that ignores its context) may
// open it again; Close must allow that.
type Closer interface {
	Close()
}

// closeCheck closes e's check if it is a Closer.
func closeCheck(e *entry) {
	if c, ok := e.check.(Closer); ok {
		c.Close()
	}
}

// minWakeGap bounds how often wake-ups run a check (a burst of file
// notifications is one run).
const minWakeGap = time.Second

type entry struct {
	cond string
	// wake gets a token when the check should run again soon (Watcher, Wake).
	wake     chan struct{}
	check    Check
	interval time.Duration
	timeout  time.Duration
	log      *slog.Logger
	running  atomic.Bool
	// part: the check evaluates one part of its condition, the catalog
	// row's part of this source (report.ConditionDesc.Parts); errors,
	// timeouts and panics are recorded for that part only. Empty: the
	// check evaluates the whole condition.
	part report.Source

	// settings is the check's table in the configuration
	// (config.Checks.Section): Apply restarts the check when it differs.
	settings any
	// stop ends the check's loop and its Watch; done is closed once both
	// returned. Set when the loop starts (Run, Apply).
	stop context.CancelFunc
	done chan struct{}

	// The last outcome logged: a check that keeps failing the same way
	// logs once per change, not every interval.
	logMu   sync.Mutex
	logged  string
	repeats int

	// failMu guards the failed runs in a row (holdTrue).
	failMu sync.Mutex
	// failedRuns: the check's failed runs in a row (holdTrue) since its
	// last run that decided; failedSince: the start of the first of them.
	failedRuns  int
	failedSince time.Time
	// holding: the last failed run, while the condition's True is held
	// through it (holdTrue); nil while none is.
	holding *HeldFailure
}

// maxHeldFailures is how many failed runs of a check in a row its
// condition's True is held through: the next one makes it Unknown.
const maxHeldFailures = 2

// HeldFailure is what a failed run of a check would have set its
// condition to (Unknown), while the condition's True is held through it.
type HeldFailure struct {
	// Runs: the failed runs in a row (1 to maxHeldFailures).
	Runs int `json:"runs"`
	// Since: when the first of them started.
	Since   time.Time     `json:"since"`
	Reason  report.Reason `json:"reason"`
	Message string        `json:"message"`
}

// stored is e's condition as the store holds it: its part of the
// condition where e evaluates one (DisksFailure's SMART part).
func (r *Runner) stored(e *entry) (report.Condition, bool) {
	if e.part != "" {
		return r.store.Part(e.part, e.cond)
	}
	return r.store.Get(e.cond)
}

// holdTrue counts the failed runs of e's check in a row and reports
// whether c, a run's result that started at start, is left unrecorded
// because the run failed (an error, a timeout, a previous run not
// returned, a panic, a reason outside the catalog: the runner's Unknown)
// and the condition (or e's part of it) is True, held
// while true (report.HoldWhileTrue): up to maxHeldFailures failed runs in
// a row keep the True, its reason, message and transition time; the next
// one records c. One failed run (a D-Bus call answered NoReply, a SMART
// read that timed out, a timeout on a loaded node) must not make the Node's
// condition True, Unknown, True again: two transitions, each restarting a
// MachineHealthCheck's timeout and every alert's `for:`. A run that
// decided resets the count, whatever its status (an Unknown of the probe's
// own, such as an NVMe drive that did not answer beside one that did, is
// the probe's word); a False or Unknown condition is not held; the
// tamper conditions (held forever) keep what the store does with them.
// The count is kept in the state file for the boot (keptFailures): a
// restart of the daemon carries it on, as a reload and a re-plan do.
func (r *Runner) holdTrue(e *entry, c report.Condition, failed bool, start time.Time) bool {
	// The condition as the store holds it, read before e.failMu is taken:
	// the store calls keptFailures (e.failMu) with its lock held.
	var prev report.Condition
	var had bool
	if failed {
		prev, had = r.stored(e)
	}
	e.failMu.Lock()
	kept := keptRuns(e.failedRuns)
	hold := e.countLocked(c, failed, start, had && prev.Status == report.StatusTrue)
	changed := keptRuns(e.failedRuns) != kept
	e.failMu.Unlock()
	if changed && r.memos != nil {
		// Saved soon, not with the next change that may wait: the count
		// lost to a crash is a restart's failed runs more.
		r.memos.Touch()
	}
	return hold
}

// countLocked is holdTrue's count and decision, given whether the
// condition (or e's part of it) is True; e.failMu is held.
func (e *entry) countLocked(c report.Condition, failed bool, start time.Time, isTrue bool) bool {
	e.holding = nil
	if !failed {
		e.failedRuns = 0
		return false
	}
	if e.failedRuns++; e.failedRuns == 1 {
		e.failedSince = start
	}
	if e.failedRuns > maxHeldFailures {
		return false
	}
	if d, _ := report.Lookup(e.cond); d.Hold != report.HoldWhileTrue {
		return false
	}
	if !isTrue {
		return false
	}
	e.holding = &HeldFailure{Runs: e.failedRuns, Since: e.failedSince, Reason: c.Reason, Message: report.CapMessage(c.Message)}
	return true
}

// HeldFailuresKey is the name under which the runner keeps its checks'
// failed runs in a row (holdTrue) in the state file.
const HeldFailuresKey = "heldfailures"

// keptFailure is a check's failed runs in a row as the state file keeps
// them, by condition type: a daemon restarted in the middle of a run of
// failures (systemctl restart, a crash, an OOM kill, each restarted by
// Restart=always) carries the count on. Counted from 0 at every start, a
// check failing at every run on a daemon restarted every 2 runs kept a
// stale True on the Node for ever.
type keptFailure struct {
	// Runs: the failed runs in a row, at most maxHeldFailures+1 (more
	// change nothing, and are not a save each).
	Runs  int       `json:"runs"`
	Since time.Time `json:"since"`
	// Held: the failed run the True is held through (Holding), if any.
	Held *HeldFailure `json:"held,omitempty"`
}

// keptRuns is the count of failed runs in a row the state file keeps.
func keptRuns(n int) int { return min(n, maxHeldFailures+1) }

// keptFailures is the value kept under HeldFailuresKey. The store calls it
// with its lock held: it takes r.mu and each entry's failMu, never held
// while the store is called.
func (r *Runner) keptFailures() any {
	out := map[string]keptFailure{}
	for _, e := range r.current() {
		e.failMu.Lock()
		if e.failedRuns > 0 {
			k := keptFailure{Runs: keptRuns(e.failedRuns), Since: e.failedSince}
			if e.holding != nil {
				h := *e.holding
				k.Held = &h
			}
			out[e.cond] = k
		}
		e.failMu.Unlock()
	}
	return out
}

// restoreFailures sets the entries' failed runs in a row from what is kept
// under HeldFailuresKey in this boot: the state file's at a start, or the
// runner's that registered the key last (the runner of the old plan, at a
// re-plan). A value out of bounds (a hand-edited file) is taken as none.
// It must run without r.mu held: Memo calls the registered keptFailures.
func (r *Runner) restoreFailures() {
	if r.memos == nil {
		return
	}
	var saved map[string]keptFailure
	if !r.memos.Memo(HeldFailuresKey, &saved) {
		return
	}
	for _, e := range r.current() {
		k := saved[e.cond]
		if k.Runs < 0 || k.Runs > maxHeldFailures+1 {
			k = keptFailure{}
		}
		if h := k.Held; h != nil && (h.Runs != k.Runs || k.Runs > maxHeldFailures) {
			k.Held = nil
		}
		e.failMu.Lock()
		e.failedRuns, e.failedSince, e.holding = k.Runs, k.Since, k.Held
		e.failMu.Unlock()
	}
}

// inheritFailures carries prev's failed runs in a row over to e, the
// check built again by a reload (Apply): a reload does not give a failing
// check more failed runs before its True turns Unknown.
func (e *entry) inheritFailures(prev *entry) {
	prev.failMu.Lock()
	n, since, h := prev.failedRuns, prev.failedSince, prev.holding
	prev.failMu.Unlock()
	e.failMu.Lock()
	e.failedRuns, e.failedSince, e.holding = n, since, h
	e.failMu.Unlock()
}

// Holding returns the failed run that the True of a condition the runner
// checks is held through (holdTrue), if it is held.
func (r *Runner) Holding(cond string) (HeldFailure, bool) {
	for _, e := range r.current() {
		if e.cond != cond {
			continue
		}
		e.failMu.Lock()
		h := e.holding
		e.failMu.Unlock()
		if h != nil {
			return *h, true
		}
	}
	return HeldFailure{}, false
}

// logOutcome logs a failing outcome (key: what went wrong, the same key for
// the same failure) only when it differs from the last one, and one line
// when the check works again (key ""), with how many runs had failed.
func (e *entry) logOutcome(key string, log func()) {
	e.logMu.Lock()
	defer e.logMu.Unlock()
	if key == e.logged {
		e.repeats++
		return
	}
	if key == "" {
		e.log.Info("check works again", "failed_runs", e.repeats, "last_failure", e.logged)
	} else {
		log()
	}
	e.logged, e.repeats = key, 1
}

// Runner schedules the checks and records their results in the store. Its
// plan can change while it runs (Apply): a check whose settings did not
// change keeps its loop and timer.
type Runner struct {
	store   *report.Store
	details *report.Details
	metrics *report.Metrics
	log     *slog.Logger
	// progress is called after every run of a check (loop name "check/<type>").
	progress  func(loop string, maxSilence time.Duration)
	factories map[string]Factory
	only      []string
	external  []string

	// applyMu serializes Apply.
	applyMu sync.Mutex
	mu      sync.Mutex
	spread  time.Duration
	entries []*entry
	// ctx is Run's context (nil before Run); stopped is set once it is done
	// and Run waits for the loops (wg): no loop starts after that.
	ctx context.Context
	// grid: every check runs on its interval's points of it (nextRun);
	// Options.Grid, else anchored when Run starts.
	grid      tick.Grid
	stopped   bool
	wg        sync.WaitGroup
	firstPass func()
	// pending are the checks whose first run the first pass waits for;
	// nil before Run and once the first pass is done.
	pending map[*entry]bool
	// sd is the Env's systemd (nil: none), asked whether the system is
	// shutting down when a run would change a condition (held).
	sd systemd.Manager
	// shutdownLogged: the hold at shutdown was logged.
	shutdownLogged atomic.Bool
	// memos keeps the checks' failed runs in a row in the state file
	// (keptFailures; Env.Memos); nil: not kept (the one-shot check).
	memos Memos
}

// Options configure a Runner.
type Options struct {
	Store   *report.Store
	Metrics *report.Metrics // may be nil
	// Only restricts the runner to these condition types.
	Only []string
	// Details, if set, receives the report fields the checks collect.
	Details *report.Details
	// External lists the conditions the kernel log monitor evaluates.
	External []string
	// Factories, if set, replace the registered checks (tests).
	Factories map[string]Factory
	// Grid lines the checks' runs up with the daemon's other periodic
	// wake-ups; zero: a grid anchored when Run starts.
	Grid tick.Grid
	// Progress, if set, is called whenever a check's loop completes a run,
	// with the longest silence expected before the next call.
	Progress func(loop string, maxSilence time.Duration)
}

// NewRunner builds every scheduled check of the plan. A scheduled check
// whose interval or timeout is not positive is an error (config validation
// refuses such a file; this guards configurations built in code).
func NewRunner(env *Env, opts Options) (*Runner, error) {
	r := &Runner{store: opts.Store, details: opts.Details, metrics: opts.Metrics, log: env.Log, spread: env.Config.Runner.FirstRunSpread.Duration, progress: opts.Progress, grid: opts.Grid,
		factories: registry, only: opts.Only, external: opts.External, sd: env.Systemd, memos: env.Memos}
	if opts.Factories != nil {
		r.factories = opts.Factories
	}
	ps, err := r.scheduled(env)
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		e, err := r.newEntry(env, p)
		if err != nil {
			return nil, err
		}
		r.entries = append(r.entries, e)
	}
	r.restoreFailures()
	return r, nil
}

// alsoReads gives, by condition type, the settings outside its own table
// that a check reads: they are part of its settings, so that a reload that
// changes them builds it again (Apply), as a change of its own table does.
var alsoReads = map[string]func(*config.Config) any{
	// The disks check marks the drives the other disk conditions name.
	"DisksFailure": func(c *config.Config) any { return nvmeThresholdsOf(c) },
}

// scheduledCheck is a check the plan runs, with its settings.
type scheduledCheck struct {
	desc     report.ConditionDesc
	interval time.Duration
	timeout  time.Duration
	settings any
}

// scheduled lists the checks the plan for env runs, in catalog order.
func (r *Runner) scheduled(env *Env) ([]scheduledCheck, error) {
	var out []scheduledCheck
	for _, p := range plan(env, r.only, r.external, r.factories) {
		if p.State != Scheduled {
			continue
		}
		com, hasCfg := env.Config.Checks.Common(p.Desc.Type)
		if com.Interval.Duration <= 0 || com.Timeout.Duration <= 0 {
			// The loop would probe without pause, each probe timed out at once.
			if !hasCfg {
				return nil, fmt.Errorf("check %s: no [checks.%s] table in the configuration, so no interval and timeout", p.Desc.Type, p.Desc.Type)
			}
			return nil, fmt.Errorf("check %s: interval (%s) and timeout (%s) must be positive", p.Desc.Type, com.Interval, com.Timeout)
		}
		settings, _ := env.Config.Checks.Section(p.Desc.Type)
		if also := alsoReads[p.Desc.Type]; also != nil {
			settings = [2]any{settings, also(env.Config)}
		}
		out = append(out, scheduledCheck{desc: p.Desc, interval: com.Interval.Duration, timeout: com.Timeout.Duration, settings: settings})
	}
	return out, nil
}

// newEntry builds the check of a scheduled condition.
func (r *Runner) newEntry(env *Env, p scheduledCheck) (*entry, error) {
	c, err := r.factories[p.desc.Type](env)
	if err != nil {
		return nil, fmt.Errorf("check %s: %w", p.desc.Type, err)
	}
	var part report.Source
	if _, ok := p.desc.Part(p.desc.Source); ok {
		part = p.desc.Source
	}
	return &entry{
		cond: p.desc.Type, check: c, part: part, wake: make(chan struct{}, 1),
		interval: p.interval, timeout: p.timeout, settings: p.settings,
		log: env.Log.With("check", p.desc.Type),
	}, nil
}

// Checks lists the condition types the runner runs.
func (r *Runner) Checks() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.entries))
	for i, e := range r.entries {
		out[i] = e.cond
	}
	return out
}

// FirstPassBound is the longest a first pass of the runner (Run's
// firstPass) can take from Run's start: the last first run starts within
// runner.first_run_spread, and a run that has not returned within its
// check's timeout is recorded as timed out, which counts as run (the hold
// at shutdown may add up to stoppingTimeout to it).
func (r *Runner) FirstPassBound() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var longest time.Duration
	for _, e := range r.entries {
		longest = max(longest, e.timeout)
	}
	return r.spread + longest + stoppingTimeout
}

func (r *Runner) current() []*entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.entries)
}

// RunOnce runs every check once, concurrently, and returns their conditions.
func (r *Runner) RunOnce(ctx context.Context) []report.Condition {
	es := r.current()
	var wg sync.WaitGroup
	for _, e := range es {
		wg.Go(func() { r.runOne(ctx, e, nil) })
	}
	wg.Wait()
	var out []report.Condition
	for _, e := range es {
		if c, ok := r.store.Get(e.cond); ok {
			out = append(out, c)
		}
	}
	return out
}

// Run runs every check on its interval until ctx is done. The first runs are
// spread evenly over the configured window; firstPass is called once every
// check has run once (the checks of the plan as Apply changed it). Run
// returns when every loop has stopped (a probe that ignores its context is
// abandoned, not waited for).
func (r *Runner) Run(ctx context.Context, firstPass func()) {
	// The failed runs in a row as the runner of the old plan left them
	// (a re-plan builds this runner while the old one still runs), then
	// this runner's kept in the state file.
	r.restoreFailures()
	if r.memos != nil {
		r.memos.Keep(HeldFailuresKey, r.keptFailures)
	}
	r.mu.Lock()
	r.ctx, r.stopped, r.firstPass = ctx, false, firstPass
	if r.grid.Anchor().IsZero() {
		r.grid = tick.New(time.Now())
	}
	r.pending = map[*entry]bool{}
	for _, e := range r.entries {
		r.pending[e] = true
	}
	r.dropUnrunLocked()
	r.startLocked(r.entries)
	fire := r.firstPassDoneLocked()
	r.mu.Unlock()
	if fire && firstPass != nil {
		firstPass()
	}
	<-ctx.Done()
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.wg.Wait()
	for _, e := range r.current() {
		closeCheck(e)
	}
}

// dropUnrunLocked removes from the report the fields of every condition
// the runner does not run: the daemon replaces its runner when the node's
// role or GPU changes, and what the old one's checks collected is not
// reported once nothing runs them (the old runner's loops have returned:
// nothing sets them again). r.mu is held.
func (r *Runner) dropUnrunLocked() {
	if r.details == nil {
		return
	}
	for _, d := range report.Conditions {
		if !slices.ContainsFunc(r.entries, func(e *entry) bool { return e.cond == d.Type }) {
			r.details.Drop(d.Type)
		}
	}
}

// startLocked starts the loops of es (those not started yet), their first
// runs spread evenly over the configured window. r.mu is held.
func (r *Runner) startLocked(es []*entry) {
	es = slices.DeleteFunc(slices.Clone(es), func(e *entry) bool { return e.stop != nil })
	for i, e := range es {
		offset := time.Duration(0)
		if n := len(es); n > 1 {
			offset = r.spread * time.Duration(i) / time.Duration(n)
		}
		if r.metrics != nil {
			// Its runs' series of every result at 0 before its first.
			r.metrics.InitCheck(e.cond)
		}
		ctx, cancel := context.WithCancel(r.ctx)
		e.stop, e.done = cancel, make(chan struct{})
		r.wg.Go(func() {
			defer close(e.done)
			var wg sync.WaitGroup
			wg.Go(func() { r.loop(ctx, e, r.grid, offset, func() { r.ranOnce(e) }) })
			if w, ok := e.check.(Watcher); ok {
				wg.Go(func() { w.Watch(ctx, e.poke) })
			}
			wg.Wait()
		})
	}
}

// firstPassDoneLocked reports whether the first pass just completed (every
// pending check ran or was removed); it then ends the waiting. r.mu is held.
func (r *Runner) firstPassDoneLocked() bool {
	if r.pending == nil || len(r.pending) > 0 {
		return false
	}
	r.pending = nil
	return true
}

// ranOnce records the first run of a check.
func (r *Runner) ranOnce(e *entry) {
	r.mu.Lock()
	fire := false
	if r.pending[e] {
		delete(r.pending, e)
		fire = r.firstPassDoneLocked()
	}
	fp := r.firstPass
	r.mu.Unlock()
	if fire && fp != nil {
		fp()
	}
}

// Applied says what Apply changed, by condition type in catalog order.
type Applied struct {
	// Changed: checks whose settings changed, stopped and started again
	// with the new ones.
	Changed []string
	// Started: checks the new plan runs and the old one did not.
	Started []string
	// Stopped: checks the new plan no longer runs.
	Stopped []string
}

// Empty reports whether nothing changed.
func (a Applied) Empty() bool { return len(a.Changed)+len(a.Started)+len(a.Stopped) == 0 }

// Apply re-plans the checks for env (its configuration changed; its role
// and GPU are those of the current plan). A check whose settings (its
// table in the configuration, config.Checks.Section) did not change keeps
// its loop: its timer and its state are untouched, it is not run sooner.
// A check whose settings changed is stopped and started again with the new
// ones (a new instance: what it keeps in the state file carries on); a
// check no longer scheduled is stopped (its condition is left in the store
// for the caller; its report fields are removed); a newly scheduled one
// starts. The started checks' first runs are spread over
// runner.first_run_spread, as at the start. A check that cannot be built
// is an error and nothing changes.
func (r *Runner) Apply(env *Env) (Applied, error) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	ps, err := r.scheduled(env)
	if err != nil {
		return Applied{}, err
	}
	old := r.current()
	byCond := map[string]*entry{}
	for _, e := range old {
		byCond[e.cond] = e
	}
	var a Applied
	var next, fresh []*entry
	for _, p := range ps {
		prev := byCond[p.desc.Type]
		if prev != nil && reflect.DeepEqual(prev.settings, p.settings) {
			next = append(next, prev)
			continue
		}
		e, err := r.newEntry(env, p)
		if err != nil {
			return Applied{}, err
		}
		if prev != nil {
			a.Changed = append(a.Changed, e.cond)
		} else {
			a.Started = append(a.Started, e.cond)
		}
		next, fresh = append(next, e), append(fresh, e)
	}
	var gone []*entry
	for _, e := range old {
		if slices.Contains(next, e) {
			continue
		}
		gone = append(gone, e)
		if !slices.ContainsFunc(next, func(n *entry) bool { return n.cond == e.cond }) {
			a.Stopped = append(a.Stopped, e.cond)
		}
	}
	r.mu.Lock()
	r.entries = next
	r.spread = env.Config.Runner.FirstRunSpread.Duration
	r.sd = env.Systemd
	for _, e := range gone {
		if e.stop != nil {
			e.stop()
		}
		delete(r.pending, e)
	}
	r.mu.Unlock()
	// The old loop of a changed check records nothing once it returned:
	// the new one is alone to set the condition, and carries on its
	// count of failed runs in a row.
	for _, e := range gone {
		if e.done != nil {
			<-e.done
		}
		closeCheck(e)
		for _, n := range fresh {
			if n.cond == e.cond {
				n.inheritFailures(e)
			}
		}
	}
	// What a stopped check collected is not reported any more (its
	// condition is the caller's); a changed check's fields stay until its
	// new instance's first run replaces them.
	if r.details != nil {
		for _, c := range a.Stopped {
			r.details.Drop(c)
		}
	}
	r.mu.Lock()
	if r.ctx != nil && !r.stopped {
		for _, e := range fresh {
			if r.pending != nil {
				r.pending[e] = true
			}
		}
		r.startLocked(fresh)
	}
	fire := r.firstPassDoneLocked()
	fp := r.firstPass
	r.mu.Unlock()
	if fire && fp != nil {
		fp()
	}
	return a, nil
}

// poke asks for a run soon; it never blocks.
func (e *entry) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Wake runs the check of a condition again soon (after its first run, and
// at most once every minWakeGap); it reports whether the runner runs it.
func (r *Runner) Wake(cond string) bool {
	for _, e := range r.current() {
		if e.cond == cond {
			e.poke()
			return true
		}
	}
	return false
}

func (r *Runner) loop(ctx context.Context, e *entry, grid tick.Grid, offset time.Duration, first func()) {
	t := time.NewTimer(offset)
	defer t.Stop()
	runs := make(chan probeRun)
	go e.worker(ctx, runs)
	var start time.Time
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
			if n > 0 {
				// Sooner than the interval, not sooner than the gap.
				t.Reset(max(0, minWakeGap-time.Since(start)))
			}
			n--
			continue
		case <-t.C:
		}
		start = time.Now()
		r.runOne(ctx, e, runs)
		if ctx.Err() != nil {
			return
		}
		// The run's progress is recorded before the first pass is
		// reported: what readiness announces (the metrics included) shows
		// every loop's first run.
		if r.progress != nil {
			r.progress("check/"+e.cond, e.interval+e.timeout)
		}
		if n == 0 {
			first()
		}
		t.Reset(max(0, time.Until(nextRun(grid, start, e.interval))))
	}
}

// nextRun is when a check whose run started at start runs next: the first
// point after start of its interval's grid (tick.Grid), shared by all the
// checks and the daemon's other periodic loops, so those whose runs fall
// due together run in one wake-up of the daemon: on a healthy node the
// 10 s, 30 s and 1 min checks wake it six times a minute, not each at a time
// of its own. The first run, somewhere in the first-run spread, and a run a
// notification asked for (Watcher) are off the grid; the check then rejoins
// it, never more than an interval later, and not sooner than minWakeGap
// after such a run (then at the point after).
func nextRun(grid tick.Grid, start time.Time, interval time.Duration) time.Time {
	next := grid.Next(start, interval)
	if interval > minWakeGap && next.Sub(start) < minWakeGap {
		next = next.Add(interval)
	}
	return next
}

type outcome struct {
	res   Result
	err   error
	panic any
	stack []byte
}

// probeRun asks a check's worker for one probe.
type probeRun struct {
	ctx  context.Context
	done chan<- outcome // buffered: the worker never waits on it
}

// worker probes the check for its loop, one run after another, until ctx
// is done: one goroutine for the loop's life, whose stack grows once, where
// a goroutine per run grew a stack of its own each time. A probe that
// ignores its context keeps the worker until it returns; the runs meanwhile
// find the check still running (runOne).
func (e *entry) worker(ctx context.Context, runs <-chan probeRun) {
	for {
		select {
		case <-ctx.Done():
			return
		case pr := <-runs:
			e.handOver(pr, func() { go e.worker(ctx, runs) })
		}
	}
}

// handOver runs one probe and hands its outcome over. A probe that ends
// its goroutine (runtime.Goexit, as a test's FailNow does) ends the
// goroutine that called handOver too: the run gets that as its outcome (not
// a timeout), and then goexit is called: the worker starts another worker,
// or the loop would wait on runs forever.
func (e *entry) handOver(pr probeRun, goexit func()) {
	handed := false
	defer func() {
		if !handed {
			pr.done <- outcome{panic: "the probe ended its goroutine (runtime.Goexit)"}
			if goexit != nil {
				goexit()
			}
		}
	}()
	pr.done <- e.probe(pr.ctx)
	handed = true
}

// probe runs the check's probe, a panic recovered as the outcome. The check
// is no longer running when probe returns, before the outcome is handed
// over: a run right after this one (RunOnce again, a wake) must not find it
// still running.
func (e *entry) probe(ctx context.Context) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = outcome{panic: p, stack: debug.Stack()}
		}
		e.running.Store(false)
	}()
	o.res, o.err = e.check.Probe(ctx)
	return o
}

// runOne runs one probe with its timeout and records the result: on the
// loop's worker (runs), or with runs nil on a goroutine of its own.
func (r *Runner) runOne(ctx context.Context, e *entry, runs chan<- probeRun) {
	start := time.Now()
	var c report.Condition
	var result string
	var details func()
	// failed: the run did not decide (holdTrue).
	failed := true
	if !e.running.CompareAndSwap(false, true) {
		// The previous probe has not returned even after its timeout.
		c = unknown(e.cond, report.ReasonCheckTimeout, fmt.Sprintf("the previous run (timeout %s) has still not returned", e.timeout))
		result = report.ResultTimeout
		details = func() { r.recordFailed(e, nil, c.Message) }
		// The same failure as the timeout before it (only that run's probe
		// can still be running): a probe that overruns the interval makes
		// runs alternate between the two, and that is not a change.
		e.logOutcome("timed out", func() {
			e.log.Warn("check still running from an earlier run; not starting another (logged again only when the outcome changes)", "timeout", e.timeout)
		})
	} else {
		cctx, cancel := context.WithTimeout(ctx, e.timeout)
		defer cancel()
		done := make(chan outcome, 1)
		if runs == nil {
			go e.handOver(probeRun{cctx, done}, nil)
		} else {
			// Not running: the worker is idle, or about to be.
			select {
			case runs <- probeRun{cctx, done}:
			case <-ctx.Done():
				e.running.Store(false)
				return // shutting down: record nothing
			}
		}
		select {
		case o := <-done:
			c, result, failed = r.interpret(e, o)
			details = func() { r.recordDetails(e, o, c, failed) }
		case <-cctx.Done():
			if ctx.Err() != nil {
				return // shutting down: record nothing
			}
			c = unknown(e.cond, report.ReasonCheckTimeout, fmt.Sprintf("check did not finish within its timeout of %s", e.timeout))
			result = report.ResultTimeout
			details = func() { r.recordFailed(e, nil, c.Message) }
			e.logOutcome("timed out", func() {
				e.log.Warn("check timed out (logged again only when the outcome changes)", "timeout", e.timeout)
			})
		}
	}
	if r.metrics != nil {
		r.metrics.CheckRun(e.cond, result, time.Since(start))
	}
	if r.holdTrue(e, c, failed, start) {
		// The report's fields as a failed run leaves them
		// (recordDetails): a True held is not blanked either.
		if details != nil {
			details()
		}
		return
	}
	if r.held(ctx, e, c) {
		return
	}
	if details != nil {
		details()
	}
	if e.part != "" {
		r.store.SetPart(e.part, c, time.Now())
		return
	}
	// The run's start: a run in flight during an operator's clear does not
	// spend the clear's release (report.Store.SetRun).
	r.store.SetRun(c, start, time.Now())
}

// stoppingTimeout bounds the read of whether the system is shutting down.
const stoppingTimeout = 2 * time.Second

// held reports whether c, what a run of e's check found, is left
// unrecorded, condition and report fields, because systemd is shutting the
// system down. The units stop in reverse order, and this daemon (ordered
// Before=kubelet.service) after kubelet; containerd and the operability
// units, not ordered against it, stop before it or beside it: until its
// SIGTERM, its checks find them stopping or stopped, and
// the Node would keep KubeletUnhealthy=True, NodeServiceDown=True and the
// like (the daemon's last write on SIGTERM) for as long as the node is
// off, for a failure that did not happen. Every condition keeps its last
// state until the daemon stops, but for those held forever (the tamper
// findings). systemd is asked only when the run would
// change the condition (its status, reason or message): a healthy node's
// runs, and a failure that stays the same, make no call.
func (r *Runner) held(ctx context.Context, e *entry, c report.Condition) bool {
	r.mu.Lock()
	sd := r.sd
	r.mu.Unlock()
	if sd == nil {
		return false
	}
	if d, _ := report.Lookup(e.cond); d.Hold != report.HoldWhileTrue {
		// A security finding (NodeTampered, SealedOSTampered: held
		// forever) is never what a shutdown causes, and is never hidden.
		return false
	}
	prev, had := r.stored(e)
	// The store keeps a condition's message cut at report.MaxMessageLen (a
	// part's as the probe said it, until a restart restores it cut): the
	// same long message is no change.
	if !had || prev.Status == c.Status && prev.Reason == c.Reason && report.CapMessage(prev.Message) == report.CapMessage(c.Message) {
		return false
	}
	sctx, cancel := context.WithTimeout(ctx, stoppingTimeout)
	defer cancel()
	stopping, err := systemd.Stopping(sctx, sd)
	if ctx.Err() != nil {
		return true // the daemon is stopping: record nothing, as runOne does
	}
	if err != nil || !stopping {
		return false
	}
	if !r.shutdownLogged.Swap(true) {
		r.log.Info("systemd is shutting the system down: the conditions keep their last state until the daemon stops",
			"check", e.cond, "held_status", c.Status, "held_reason", c.Reason)
	}
	return true
}

// recordDetails records the report fields a run of e's check collected;
// c is the condition the run sets, failed whether it did not decide
// (interpret). A run that decided (no error, a status and reason of the
// catalog) replaces what its check's previous run carried: a field it no
// longer carries (LVM gave no report) leaves the report. A run that failed
// adds what it collected with an error (recordFailed) and leaves the rest
// as last collected: its condition says the check failed, and a transient
// error does not blank the report (the tamper document's record of an
// operator's clear, which a restart trusts, included); its documents say
// those fields are stale. A panic or a reason outside the catalog adds
// nothing.
func (r *Runner) recordDetails(e *entry, o outcome, c report.Condition, failed bool) {
	switch {
	case !failed:
		if r.details != nil {
			r.details.Replace(e.cond, o.res.Details)
		}
	case o.panic == nil && o.err != nil:
		r.recordFailed(e, o.res.Details, c.Message)
	default:
		r.recordFailed(e, nil, c.Message)
	}
}

// recordFailed records a run of e's check that failed (Details.Failed):
// ds, what it collected, is set; the check's other fields stay, named
// stale in their documents with why, the condition's message.
func (r *Runner) recordFailed(e *entry, ds []report.Detail, why string) {
	if r.details != nil {
		r.details.Failed(e.cond, ds, why)
	}
}

// interpret is the condition a run's outcome sets, its result for the
// metrics, and whether the run failed (did not decide: a panic, an error,
// a status and reason outside the catalog).
func (r *Runner) interpret(e *entry, o outcome) (report.Condition, string, bool) {
	if o.panic != nil {
		// The same panic at every run (a bug the host's state triggers) is
		// one stack trace in the journal, not one per interval.
		p := fmt.Sprint(o.panic)
		e.logOutcome("panicked: "+p, func() {
			e.log.Error("check panicked (logged again only when the panic changes)", "panic", p, "stack", string(o.stack))
		})
		return unknown(e.cond, report.ReasonCheckPanicked, "check panicked: "+p), report.ResultPanic, true
	}
	d, _ := report.Lookup(e.cond)
	valid := o.err != nil || d.ValidReason(o.res.Status, o.res.Reason)
	// What the probe collected is reported (runOne: recordDetails) even
	// when it could not decide (a certificate that is not present, an
	// unreadable drive).
	switch {
	case o.err != nil:
		e.logOutcome("failed: "+o.err.Error(), func() {
			e.log.Warn("check failed (logged again only when the error changes)", "err", o.err)
		})
		return unknown(e.cond, report.ReasonCheckFailed, o.err.Error()), report.ResultError, true
	case !valid:
		e.logOutcome(fmt.Sprintf("not in the catalog: %s %s", o.res.Status, o.res.Reason), func() {
			e.log.Error("check returned a status/reason that is not in the catalog (a bug; logged again only when it changes)", "status", o.res.Status, "reason", o.res.Reason)
		})
		return unknown(e.cond, report.ReasonCheckFailed, fmt.Sprintf("internal error: check returned status %q with reason %q, not in the catalog", o.res.Status, o.res.Reason)), report.ResultError, true
	}
	e.logOutcome("", nil)
	result := report.ResultOK
	switch {
	case o.res.Status == report.StatusTrue:
		result = report.ResultProblem
	case o.res.Status == report.StatusUnknown && o.res.Reason != report.ReasonNothingToCheck:
		result = report.ResultError
	}
	return report.Condition{Type: e.cond, Status: o.res.Status, Reason: o.res.Reason, Message: o.res.Message}, result, false
}
