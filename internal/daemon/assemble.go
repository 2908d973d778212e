package daemon

import (
	"log/slog"
	"slices"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/internal/tick"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// Purpose says what the parts are assembled for. The commands build their
// parts with Assemble and differ only in what they start: run starts the
// loops, check runs every check once and scans the kernel ring, kmsg replay
// feeds captured lines to the kernel log monitor.
type Purpose int

const (
	// ForRun is the daemon: checks repair in place, restarts of the
	// critical units are counted and kept, changes are logged, the local
	// state is restored, and the liveness of the loops is tracked.
	ForRun Purpose = iota
	// ForCheck is one pass of every check: nothing is repaired, no state is
	// read or kept.
	ForCheck
	// ForReplay is the kernel log monitor alone, for captured lines: as a
	// GPU worker (so GPU rules show; this host is not detected), every line
	// counts (not only the kernel's), even with kmsg.enabled = false, and
	// no checks are built.
	ForReplay
)

// AssembleOptions say what to assemble.
type AssembleOptions struct {
	Purpose Purpose
	// Version is reported in autopilot_health_build_info.
	Version string
	// Env, if set, replaces the detected environment (tests).
	Env *checks.Env
	// BootID is used with Env.
	BootID string
	// Helper, if set, does what needs privileges (checks.Env.Helper).
	Helper checks.Helper
	// Only restricts the checks to these condition types (check --only).
	Only []string
}

// Parts are what every command builds from a configuration.
type Parts struct {
	Config  *config.Config
	Env     *checks.Env
	Store   *report.Store
	Metrics *report.Metrics
	Details *report.Details
	// Kmsg is the kernel log monitor, not started; nil when kmsg.enabled
	// is false.
	Kmsg *kmsg.Monitor
	// Runner runs the checks that apply to Env; nil for ForReplay.
	Runner *checks.Runner
	// Live tracks the progress of the daemon's loops (ForRun only; it
	// already expects each check's loop).
	Live *Liveness
	// Grid lines up the daemon's periodic wake-ups (tick), anchored when
	// the parts are assembled.
	Grid tick.Grid

	only []string
	// removedFindings are the tamper findings (True, held forever) the
	// state file restored and the start dropped, its check disabled: the
	// start logged each (report.TamperFindingRemovedLog), and the reporter
	// does not log the same finding again where it finds it on the Node.
	removedFindings map[string]report.Condition
}

// removedAtStart says whether the start dropped and logged this tamper
// finding (same condition, reason and message).
func (p *Parts) removedAtStart(condType, reason, message string) bool {
	c, ok := p.removedFindings[condType]
	return ok && string(c.Reason) == reason && c.Message == message
}

// Assemble builds the parts of a command from a configuration (already
// validated): the checks' environment (the node detected), the condition
// store, the metrics, the kernel log monitor and the runner of the checks.
// Any error is a reason not to start.
func Assemble(cfg *config.Config, log *slog.Logger, o AssembleOptions) (*Parts, error) {
	p := &Parts{Config: cfg, Env: o.Env, only: o.Only, Grid: tick.New(time.Now())}
	bootID := o.BootID
	switch {
	case o.Purpose == ForReplay:
		// What the lines say matters, not this host.
		p.Env = &checks.Env{Config: cfg, Role: report.RoleWorker, GPU: true, Log: log}
		bootID = "replay"
	case p.Env == nil:
		env, id, err := newEnv(cfg, log)
		if err != nil {
			return nil, err
		}
		p.Env, bootID = env, id.BootID
		log.Info("node detected", "node", id.NodeName, "node_source", id.NodeNameSource,
			"role", id.Role, "role_source", id.RoleSource, "gpu", id.GPU, "gpu_source", id.GPUSource)
	}
	env := p.Env
	if o.Helper != nil {
		env.Helper = o.Helper
	}
	if env.BootID == "" {
		env.BootID = bootID
	}
	if env.Stuck == nil {
		// One record of the calls that hang for the daemon's life: the Env
		// copies of a reload or a re-detect carry the pointer, so a check
		// built again does not call a hung drive or mount a second time.
		env.Stuck = &checks.StuckCalls{}
	}
	p.Details = report.NewDetails()
	p.Details.SetBootID(bootID)
	p.Store = report.NewStore(bootID)
	p.Metrics = report.NewMetrics(o.Version)
	if o.Purpose == ForRun {
		// The persister and saveStateNow tell the store each write's end
		// (countWrite): the kernel log reader counts a gap of lost records
		// once the move past it is on disk.
		p.Store.ReportWrites()
		// In-place repair (only the daemon repairs; the one-shot check does not).
		env.Repair = checks.NewRepairer(env.Systemd, log, time.Now, p.Metrics.Registry)
		// Restarts of the critical units, as every reader of their properties
		// observes them (syself_node_unit_restarts), kept in the state file
		// (read back on first use, after Load below).
		env.Units = checks.NewUnitWatch(p.Store, p.Metrics.Registry)
		// KubeletHeartbeatFailed's reads of the journal with journalctl
		// (autopilot_health_journal_fallbacks_total).
		env.JournalFallbacks = checks.NewJournalFallbacks(p.Metrics.Registry)
		// Lines of host input skipped as malformed, by reader
		// (autopilot_health_malformed_lines_total).
		env.Malformed = checks.NewMalformedLines(p.Metrics.Registry)
		// Other values the checks keep for this boot (read back on first
		// use, after Load below).
		env.Memos = p.Store
		env.Repair.SetUnitWatch(env.Units)
		// What the repairer knows of each unit (repairs in a row:
		// RepairNotHelping), kept in the state file too.
		env.Repair.KeepIn(p.Store)
		// Only the units the configuration names are listed and kept
		// (a reload sets them again).
		env.Repair.Watch(checks.WatchedUnits(cfg))
		env.Repair.Repaired(checks.RepairedUnits(cfg))
		// The tamper checks' baseline and findings (tamper.json, 0600).
		if env.Tamper == nil {
			env.Tamper = tamper.NewKeeper(cfg.StateDir, bootID, false)
		}
	}
	p.Store.Observe(p.Metrics)
	var (
		loaded  report.LoadResult
		loadErr error
	)
	if o.Purpose == ForRun {
		p.Store.Observe(newLogObserver(log))
		p.Store.SetBootStart(BootStart())
		p.Store.SetClock(time.Now)
		// Never fatal: a daemon that refused to start would leave the node
		// without health reporting (logged below). Read before the kernel
		// log monitor is built: the GPUs seen in this boot decide whether
		// its GPU rules apply.
		loaded, loadErr = p.Store.Load(cfg.StateDir)
		if env.GPUsSeen == nil {
			env.GPUsSeen = checks.NewGPUsSeen(p.Store)
		}
		// A node seen with a GPU in this boot stays a GPU node until the
		// next boot, its GPUs gone from PCI or not (a GPU that fell off
		// the bus may leave it): a restart within the boot does not drop
		// GpuFallenOffBus as not applicable. Only ever raised: a node
		// given as a GPU node stays one.
		if gpu, source, _ := detectGPU(cfg, env.GPUsSeen); gpu && !env.GPU {
			env.GPU = true
			log.Warn("a GPU seen on PCI in this boot: a GPU node until the next boot", "gpu", true, "gpu_source", source)
		}
	}
	if cfg.Kmsg.Enabled || o.Purpose == ForReplay {
		ko, err := KmsgOptions(cfg, env, p.Store, p.Metrics.Registry)
		if err != nil {
			return nil, err
		}
		if o.Purpose == ForReplay {
			// Captured lines, of another host or time: this host's
			// devices do not say which of theirs were NVMe over Fabrics,
			// nor its processes which of their hung tasks were a pod's.
			ko.KernelOnly, ko.Sysfs, ko.Proc = false, "", ""
		}
		ko.Log = log.With("component", "kmsg")
		p.Kmsg = kmsg.NewMonitor(ko)
	}
	p.initMetrics(env, nil)
	if o.Purpose == ForReplay {
		return p, nil
	}

	if o.Purpose == ForRun {
		res, err := loaded, loadErr
		if res.TempsRemoved > 0 {
			log.Info("removed temp files of the state file left by a crash", "dir", cfg.StateDir, "files", res.TempsRemoved)
		}
		if res.TempsErr != nil {
			log.Debug("temp files of the state file not removed", "dir", cfg.StateDir, "err", res.TempsErr)
		}
		switch {
		case err != nil:
			log.Error("state not restored; starting with empty state", "dir", cfg.StateDir, "err", err)
		case res.Corrupt != nil && res.CorruptPath == "":
			log.Error("state file unreadable and could not be moved aside; starting with empty state", "dir", cfg.StateDir, "err", res.Corrupt, "move_err", res.MoveErr)
		case res.Corrupt != nil:
			log.Error("state file unreadable; moved aside, starting with empty state", "err", res.Corrupt, "moved_to", res.CorruptPath)
			if len(res.AsideRemoved) > 0 {
				log.Info("removed older state files moved aside", "files", len(res.AsideRemoved), "oldest", res.AsideRemoved[0], "kept", report.KeepAside)
			}
			if res.AsideRemoveErr != nil {
				log.Warn("an older state file moved aside could not be removed", "err", res.AsideRemoveErr)
			}
		default:
			log.Info("state restored", "dir", cfg.StateDir, "conditions", res.Restored, "dropped", res.Dropped, "unknown_reason", res.Aside)
		}
		// A condition not evaluated on this node (its check disabled while
		// the daemon was down, the kernel log monitor off, a condition of
		// another role or of a GPU node on a node without one) is not
		// restored: the reporter neither takes it over from the Node nor
		// keeps it there (README, "Reporting to Kubernetes"), and the store,
		// the state file, the metrics and `status` say the same. (While the
		// daemon runs, a role or GPU change leaves the placeholder Unknown /
		// NotApplicable, or a held True, until the next start.)
		applicable := p.applicable(env)
		for _, c := range p.Store.All() {
			if slices.Contains(applicable, c.Type) {
				continue
			}
			p.Store.Remove(c.Type)
			if d, _ := report.Lookup(c.Type); d.Hold == report.HoldForever && c.Status == report.StatusTrue {
				// A finding only an operator's clear lowers: its check
				// disabled takes it off all the same, on the record, here
				// and not only where the reporter finds it on the Node
				// (no Kubernetes, or none reached, logs it all the same).
				log.Warn(report.TamperFindingRemovedLog,
					"condition", c.Type, "reason", c.Reason, "message", c.Message, "since", c.LastTransitionTime)
				if p.removedFindings == nil {
					p.removedFindings = map[string]report.Condition{}
				}
				p.removedFindings[c.Type] = c
				continue
			}
			log.Info("condition not evaluated on this node; dropped from the restored state", "condition", c.Type)
		}
		// Nor is one read back with a reason this build does not know:
		// its time is kept for a first evaluation that never comes.
		for _, t := range p.Store.Aside() {
			if !slices.Contains(applicable, t) {
				p.Store.Remove(t)
			}
		}
		// A restored part whose source does not run here (DisksFailure's
		// SMART check disabled, or the kernel log monitor off, while the
		// daemon was down) is dropped: the part that runs decides alone.
		for _, pl := range checks.Plan(env, nil, p.External()) {
			for _, part := range pl.Desc.Parts {
				runs := pl.State == checks.Scheduled
				if part.Source == report.SourceKmsg {
					runs = slices.Contains(p.External(), pl.Desc.Type)
				}
				if !runs {
					p.Store.ForgetPart(part.Source, pl.Desc.Type)
				}
			}
		}
		if err := env.Tamper.Load(time.Now()); err != nil {
			log.Error("tamper state unreadable; moved aside, and a finding of NodeTampered", "err", err)
		}
		// The clear in the tamper state file is not trusted (anyone who can
		// write it could forge one): a clear counts for Adopt only when this
		// process performed it (Store.Release) or published it to the Node
		// (the tamper report's cleared.at, read back by the reporter).
		p.Live = NewLiveness(time.Now)
		p.Live.OnBeat = p.Metrics.LoopProgress
		// A loop's series from its start, at the time its silence is
		// counted from (TestEveryLoopHasItsProgressSeriesFromTheStart).
		p.Live.OnExpect = p.Metrics.LoopProgress
	}
	var err error
	if p.Runner, err = p.newRunner(env); err != nil {
		return nil, err
	}
	return p, nil
}

// newEnv detects the node and builds the checks' environment.
func newEnv(cfg *config.Config, log *slog.Logger) (*checks.Env, Identity, error) {
	id, err := Detect(cfg)
	if err != nil {
		return nil, id, err
	}
	env := &checks.Env{
		Config: cfg, NodeName: id.NodeName, Role: id.Role, GPU: id.GPU,
		Log: log, Sys: checks.RealSys(), Now: time.Now,
		Systemd: systemd.NewDBus(),
	}
	return env, id, nil
}

// External lists the conditions the kernel log monitor evaluates (none
// without one): the runner leaves them to it.
func (p *Parts) External() []string { return KmsgExternal(p.Kmsg) }

// applicable lists the conditions evaluated on a node like env (by the
// runner or the kernel log monitor).
func (p *Parts) applicable(env *checks.Env) []string {
	var out []string
	for _, pl := range checks.Plan(env, nil, p.External()) {
		if pl.State == checks.Scheduled || pl.State == checks.Elsewhere {
			out = append(out, pl.Desc.Type)
		}
	}
	return out
}

// initMetrics creates the series (at 0) of the conditions and events that
// apply to a node like env and did not apply to one like prev (nil: none).
func (p *Parts) initMetrics(env, prev *checks.Env) {
	var had []string
	if prev != nil {
		had = p.applicable(prev)
	}
	var conds []string
	for _, t := range p.applicable(env) {
		if !slices.Contains(had, t) {
			conds = append(conds, t)
		}
	}
	p.Metrics.InitConditions(conds)
	var events []string
	for _, e := range report.Events {
		if e.Scope.Applies(env.Role, env.GPU) && (prev == nil || !e.Scope.Applies(prev.Role, prev.GPU)) {
			events = append(events, e.Reason)
		}
	}
	p.Metrics.InitEvents(events)
}

// newRunner builds the runner of the checks that apply to a node like env
// (the daemon builds a new one when the node's role or GPU changes), and
// tells the liveness, if any, which loops to expect.
func (p *Parts) newRunner(env *checks.Env) (*checks.Runner, error) {
	o := checks.Options{Store: p.Store, Metrics: p.Metrics, Details: p.Details, Only: p.only, External: p.External(), Grid: p.Grid}
	if p.Live != nil {
		o.Progress = p.Live.Beat
	}
	r, err := checks.NewRunner(env, o)
	if err != nil {
		return nil, err
	}
	if p.Live != nil {
		spread := p.Config.Runner.FirstRunSpread.Duration
		for _, c := range r.Checks() {
			com, _ := p.Config.Checks.Common(c)
			p.Live.Expect("check/"+c, spread+com.Interval.Duration+com.Timeout.Duration)
		}
	}
	return r, nil
}
