package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// Repair outcomes, the values of the result label.
const (
	RepairRestarted  = "restarted"
	RepairCooldown   = "cooldown"
	RepairSystemd    = "systemd-restarting"
	RepairStopped    = "unit-stopped"
	RepairStarting   = "unit-starting"
	RepairNotLoaded  = "not-loaded"
	RepairFailed     = "failed"
	RepairInProgress = "in-progress"
	RepairNoSystemd  = "no-systemd"
	// RepairUnitStopping: a stop job is queued or running for the unit (a
	// shutdown, or someone's stop).
	RepairUnitStopping = "unit-stopping"
	// RepairShutdown: systemd is shutting the system down.
	RepairShutdown = "shutting-down"
)

// RepairStatus is what the repairer knows about one unit.
type RepairStatus struct {
	Repairs     int       `json:"repairs"`
	LastRepair  time.Time `json:"lastRepair,omitzero"`
	LastReason  string    `json:"lastRepairReason,omitempty"`
	LastResult  string    `json:"lastRepairResult,omitempty"`
	Consecutive int       `json:"consecutiveRepairs"`
	// LastAttempt and LastAttemptError: the last repair that could not
	// even start (systemd not reachable, the unit not readable), and why.
	LastAttempt      time.Time `json:"lastFailedAttempt,omitzero"`
	LastAttemptError string    `json:"lastFailedAttemptError,omitempty"`
	// restartFailed: the daemon's last restart of the unit failed, and
	// the unit was then at invocation failedAt. The reset-failed before a
	// restart ends a failed unit's failed state, and a start job that
	// fails without starting it (result "dependency": a unit it requires
	// did not start) leaves it inactive: the daemon's doing, not a stop.
	restartFailed bool
	failedAt      string
	// stopSeenAt: the invocation a read found a stop job on (someone's
	// stop, or a shutdown). A stop that does not end cleanly (the unit
	// does not stop within its TimeoutStopSec and is killed: result
	// "timeout") leaves the unit failed, not inactive, and systemd does
	// not restart a unit that was stopped: it is as stopped as an
	// inactive one, and not the repairer's to start.
	stopSeenAt string
	// resetAt, resetResult: the invocation at which a restart found the
	// unit failed, and its result then. The reset-failed before the
	// restart ends the failed state; where the restart then does not
	// start the unit (systemd refuses the request: RefuseManualStart=, a
	// unit it requires masked; or its start job fails, result
	// "dependency"), the unit is left inactive at that invocation, and is
	// still failed as far as anyone is concerned (HidFailed).
	resetAt, resetResult string
	// attemptSaved: when a failed attempt last asked the state file to
	// save (Repair): a failed attempt with the same error asks again once
	// per cooldown.
	attemptSaved time.Time
}

// Repairer restarts critical units in place, over D-Bus, without fighting
// systemd: at most once per cooldown, measured from when the unit last
// started (by us or by systemd's own Restart=); never while systemd is
// already (re)starting it; never a unit someone stopped on purpose or
// systemd is stopping; never while systemd shuts the system down; and
// always after a reset-failed, so our restarts never push it into
// start-limit-hit.
type Repairer struct {
	mgr systemd.Manager
	// jobTimeout bounds one restart job (a hung unit may take its whole
	// TimeoutStopSec to stop).
	jobTimeout time.Duration
	inflight   map[string]bool
	wg         sync.WaitGroup
	log        *slog.Logger
	now        func() time.Time
	// sinceBoot reads CLOCK_MONOTONIC, the clock of a unit's
	// MainStartMono.
	sinceBoot func() time.Duration
	mu        sync.Mutex
	units     map[string]*RepairStatus
	repairs   *prometheus.CounterVec
	watch     *UnitWatch
	// memos keeps units in the state file (KeepIn); load reads it back
	// once.
	memos Memos
	load  sync.Once
	// bindsErr is the last failed read of a stopped unit's BindsTo=
	// (stoppedWithBound), logged once per change, not at every probe.
	bindsErr string
	// upSeen: for each unit, the other units as the unit watch last read
	// them (NRestarts, when) at the unit's last healthy probe (Healthy),
	// so that a stop of the unit by systemd, because a unit it BindsTo=
	// went down, is told after that unit went down twice since
	// (systemd.StoppedWithBoundCrashes). In memory only: a daemon
	// restarted since leaves such a unit stopped, as before.
	upSeen map[string]map[string]systemd.BoundSeen
	// watched: the units the configuration names (Watch); nil: every unit
	// asked about is kept. The status of any other is dropped, and never
	// listed nor saved.
	watched map[string]bool
	// repaired: the units whose repairs_total series exist from 0
	// (Repaired).
	repaired map[string]bool
	// dropped: the units a reload stopped repairing (Repaired removed
	// their series), until one names them again: a repair of theirs
	// still in flight is not counted (countRepair).
	dropped map[string]bool
}

// RepairKey is the name under which the repairer keeps its status of each
// unit in the state file.
const RepairKey = "repairs"

// NewRepairer returns a repairer; mgr may be nil (no systemd reachable).
func NewRepairer(mgr systemd.Manager, log *slog.Logger, now func() time.Time, reg prometheus.Registerer) *Repairer {
	r := &Repairer{mgr: mgr, log: log, now: now, sinceBoot: sinceBoot, units: map[string]*RepairStatus{}, inflight: map[string]bool{}, jobTimeout: 5 * time.Minute,
		upSeen: map[string]map[string]systemd.BoundSeen{},
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "repairs_total",
			Help: "In-place repair attempts by unit and result (restarted, cooldown, systemd-restarting, unit-stopped, unit-starting, unit-stopping, shutting-down, not-loaded, in-progress, failed, no-systemd).",
		}, []string{"unit", "result"})}
	if reg != nil {
		reg.MustRegister(r.repairs)
	}
	return r
}

// SetUnitWatch makes the repairer feed w every read of a unit, and the read
// right after each of its restarts (so w counts that restart once). Call it
// before the first Repair.
func (r *Repairer) SetUnitWatch(w *UnitWatch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watch = w
}

// KeepIn makes the repairer keep what it knows about each unit (repairs,
// the last one, repairs in a row) in the state file, for this boot: a
// daemon restart within the boot neither ends a run of repairs that did
// not help (RepairNotHelping is cleared only by a probe that passes) nor
// starts the count over. The state saved is read back on first use, so the
// store must be loaded before then. Call it before the first Repair.
func (r *Repairer) KeepIn(m Memos) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.memos = m
}

// Watch sets the units the configuration names for repair and for
// ServiceNotRecovering (WatchedUnits): the status of every other unit is
// dropped now, and from what is read back from the state file, and a unit
// a check of the configuration before asks about while a reload replaces
// it is neither listed (All) nor saved. Without it, a unit the
// configuration no longer names (renamed, a typo fixed, its check
// disabled) stayed in status's "Repairs:" and the state file for the rest
// of the boot, and each reload that named another unit added one. Call it
// at the start and after each reload.
func (r *Repairer) Watch(units []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watched = make(map[string]bool, len(units))
	for _, u := range units {
		r.watched[u] = true
	}
	r.prune()
}

// prune drops the status of the units not watched (r.mu held).
func (r *Repairer) prune() {
	if r.watched == nil {
		return
	}
	for name := range r.units {
		if !r.watched[name] {
			delete(r.units, name)
			delete(r.upSeen, name)
		}
	}
}

// Repaired sets the units the daemon repairs (RepairedUnits): each has its
// autopilot_health_repairs_total series of a restart and of a failure at 0
// from now, so that increase() and rate() see a unit's first repair (a
// series born at 1 shows none: the dashboard's "Repairs" panel and an
// alert on failed repairs missed the first of each); the series of a unit
// no longer repaired (a reload renamed it, or disabled its check) are
// removed, not left at their last value. Call it at the start and after
// each reload.
func (r *Repairer) Repaired(units []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := make(map[string]bool, len(units))
	for _, u := range units {
		now[u] = true
		r.repairs.WithLabelValues(u, RepairRestarted)
		r.repairs.WithLabelValues(u, RepairFailed)
	}
	for u := range r.repaired {
		if !now[u] {
			r.repairs.DeletePartialMatch(prometheus.Labels{"unit": u})
			if r.dropped == nil {
				r.dropped = map[string]bool{}
			}
			r.dropped[u] = true
		}
	}
	for u := range now {
		delete(r.dropped, u)
	}
	r.repaired = now
}

// countRepair counts a repair decision of unit in repairs_total, unless a
// reload stopped repairing unit since: a restart's job ends, or a probe
// returns, after the reload that renamed its unit or disabled its check
// (Repaired) removed the unit's series, which counting would make again,
// at 1, left on the page until the next reload
// (TestRepairInFlightAcrossAReloadLeavesNoSeriesOfTheOldUnit). A unit no
// reload dropped counts: the reload's new unit, whose check Apply starts
// before Repaired names it, included.
func (r *Repairer) countRepair(unit, result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dropped[unit] {
		return
	}
	r.repairs.WithLabelValues(unit, result).Inc()
}

// RepairedUnits are the units cfg has repaired: KubeletUnhealthy's and
// ContainerRuntimeUnhealthy's, of the checks enabled.
func RepairedUnits(cfg *config.Config) []string {
	k := &cfg.Checks
	var units []string
	if k.KubeletUnhealthy.Enabled {
		units = append(units, k.KubeletUnhealthy.Unit)
	}
	if k.ContainerRuntimeUnhealthy.Enabled {
		units = append(units, k.ContainerRuntimeUnhealthy.Unit)
	}
	return units
}

// kept reports whether unit's status is listed and saved (r.mu held).
func (r *Repairer) kept(unit string) bool { return r.watched == nil || r.watched[unit] }

// WatchedUnits are the units cfg names whose repair status is kept:
// KubeletUnhealthy's and ContainerRuntimeUnhealthy's unit, and
// ServiceNotRecovering's units (of both roles: a redetected role keeps
// them), of the checks enabled.
func WatchedUnits(cfg *config.Config) []string {
	k := &cfg.Checks
	units := RepairedUnits(cfg)
	if k.ServiceNotRecovering.Enabled {
		units = append(units, k.ServiceNotRecovering.ControlPlaneUnits...)
		units = append(units, k.ServiceNotRecovering.WorkerUnits...)
	}
	return units
}

// restore reads the status saved in this boot, once, and from then on
// keeps it in the state file. It runs without r.mu held: Memo takes the
// store's lock, and the store calls snapshot (r.mu) with its lock held.
func (r *Repairer) restore() {
	r.load.Do(func() {
		r.mu.Lock()
		m := r.memos
		r.mu.Unlock()
		if m == nil {
			return
		}
		var saved map[string]savedRepair
		m.Memo(RepairKey, &saved)
		r.mu.Lock()
		for name, s := range saved {
			if _, ok := r.units[name]; !ok {
				st := s.RepairStatus
				st.restartFailed, st.failedAt, st.stopSeenAt = s.RestartFailed, s.FailedAt, s.StopSeenAt
				st.resetAt, st.resetResult = s.ResetAt, s.ResetResult
				r.units[name] = &st
			}
		}
		r.prune()
		r.mu.Unlock()
		m.Keep(RepairKey, r.snapshot)
	})
}

// savedRepair is a unit's status in the state file: with whether the
// daemon's last restart left the unit inactive, so that a daemon restarted
// since still restarts it at the cooldown, and does not take it for a unit
// someone stopped.
type savedRepair struct {
	RepairStatus
	RestartFailed bool   `json:"restartFailed,omitempty"`
	FailedAt      string `json:"restartFailedAt,omitempty"`
	// StopSeenAt: the invocation a stop job was seen on, so that a daemon
	// restarted since does not start a unit someone stopped that ended
	// failed.
	StopSeenAt string `json:"stopSeenAt,omitempty"`
	// ResetAt, ResetResult: the invocation a restart found the unit
	// failed at, and its result, so that a daemon restarted since still
	// sees a unit the reset-failed left inactive as failed (HidFailed).
	ResetAt     string `json:"resetFailedAt,omitempty"`
	ResetResult string `json:"resetFailedResult,omitempty"`
}

// snapshot returns a copy of the status of every unit, for the state file.
func (r *Repairer) snapshot() any {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]savedRepair, len(r.units))
	for name, st := range r.units {
		if !r.kept(name) {
			continue
		}
		out[name] = savedRepair{RepairStatus: *st, RestartFailed: st.restartFailed, FailedAt: st.failedAt, StopSeenAt: st.stopSeenAt,
			ResetAt: st.resetAt, ResetResult: st.resetResult}
	}
	return out
}

// touch says that the status changed (the state file is written soon).
func (r *Repairer) touch() {
	r.mu.Lock()
	m := r.memos
	r.mu.Unlock()
	if m != nil {
		m.Touch()
	}
}

func (r *Repairer) unitWatch() *UnitWatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watch
}

// started returns when u's running process started, on now's clock: from
// its monotonic start where systemd gave one, so that a step of the wall
// clock since (chrony's makestep at boot, after an RTC that ran ahead)
// neither holds off repairs for as long as the step nor shortens a
// cooldown; else from its wall-clock start, where a start in the future
// (such a step) counts as long ago.
func (r *Repairer) started(u systemd.Unit, now time.Time) time.Time {
	if u.MainStartMono > 0 {
		if since := r.sinceBoot() - u.MainStartMono; since >= 0 {
			return now.Add(-since)
		}
	}
	if u.MainStart.After(now) {
		return time.Time{}
	}
	return u.MainStart
}

// sinceBoot is CLOCK_MONOTONIC.
func sinceBoot() time.Duration { return time.Duration(rawsys.MonotonicMicros()) * time.Microsecond }

// Repair restarts unit if policy allows and returns what it did, in words
// for the condition message: the same words for as long as the unit's state
// and the decision stay the same (no clock, no count), so that a unit that
// stays unhealthy does not change its condition at every probe.
func (r *Repairer) Repair(ctx context.Context, unit string, cooldown time.Duration, reason string) (string, string) {
	r.restore()
	// Every unit asked for is listed (All: status's "Repairs:"), also one
	// never restarted because systemd did not load it.
	r.mu.Lock()
	r.status(unit)
	r.mu.Unlock()
	result, msg := r.repair(ctx, unit, cooldown, reason)
	if result != RepairRestarted {
		// A restart is counted once systemd took the request (restart):
		// one it refused started no job, and counts as failed only.
		r.countRepair(unit, result)
	}
	touch := result == RepairRestarted
	if result == RepairFailed || result == RepairNoSystemd {
		// Seen in status beside the repairs made, not only as a count.
		// The state file is asked to take it at once when the error is
		// new, and then once per cooldown while it stays the same (the
		// time alone moves): systemd away for long, each probe (every
		// 10 s, kubelet's and containerd's) wrote the state file.
		r.mu.Lock()
		st := r.status(unit)
		now := r.now()
		touch = msg != st.LastAttemptError || st.attemptSaved.IsZero() || now.Sub(st.attemptSaved) >= cooldown || now.Before(st.attemptSaved)
		if touch {
			st.attemptSaved = now
		}
		st.LastAttempt, st.LastAttemptError = now, msg
		r.mu.Unlock()
	}
	if touch {
		r.touch()
	}
	return result, msg
}

func (r *Repairer) repair(ctx context.Context, unit string, cooldown time.Duration, reason string) (string, string) {
	if r.mgr == nil {
		return RepairNoSystemd, "not repaired: systemd is not reachable over D-Bus"
	}
	u, err := r.mgr.Unit(ctx, unit)
	if err != nil {
		return RepairFailed, fmt.Sprintf("not repaired: %v", err)
	}
	watch := r.unitWatch()
	watch.Observe(u)
	if u.ActiveState == "active" && u.Job == 0 {
		// A stop seen on this invocation was called off.
		r.sawStop(unit, "")
	}
	switch {
	case u.LoadState != "loaded":
		return RepairNotLoaded, notLoadedMessage(unit, u.LoadState)
	case u.Job != 0 && u.JobType == "stop":
		// A shutdown stops it (the units are stopped in reverse order, and
		// this daemon is stopped after kubelet), or someone does.
		r.sawStop(unit, u.Invocation)
		return RepairUnitStopping, fmt.Sprintf("not restarted: systemd is stopping %s (%s/%s, stop job queued)", unit, u.ActiveState, u.SubState)
	case u.ActiveState == "activating" || u.ActiveState == "deactivating" || u.ActiveState == "reloading" || u.SubState == "auto-restart":
		return RepairSystemd, fmt.Sprintf("not restarted: systemd is already restarting %s (%s/%s)", unit, u.ActiveState, u.SubState)
	case (u.ActiveState == "inactive" || u.ActiveState == "failed") && u.Job != 0:
		// A start job queued (at boot, kubelet's waits for this daemon),
		// or the start half of a restart whose stop left the unit
		// inactive, or failed when it did not end cleanly (ComingBack):
		// not a stop, and not to be restarted again.
		return RepairStarting, fmt.Sprintf("%s has not started yet (job %d queued)", unit, u.Job)
	case u.ActiveState == "inactive" && startNotMade(u) == "" && !r.leftByOwnRestart(unit, u) && !r.stoppedWithBound(ctx, u):
		// One whose last start systemd skipped (a Condition…= not met)
		// or failed on an Assert…= (that start its own Restart= after a
		// crash, someone's start or restart, the boot's, the
		// repairer's) was asked to run, not stopped: it is the
		// repairer's, restarted at the cooldown.
		return RepairStopped, fmt.Sprintf("not restarted: %s is stopped (inactive/%s); a stopped unit is not started by the repair", unit, u.SubState)
	case u.ActiveState == "failed" && (r.stoppedBySomeone(unit, u) || u.StopEndedFailed() && !r.leftByOwnRestart(unit, u)):
		return RepairStopped, fmt.Sprintf("not restarted: %s was stopped and did not stop cleanly (failed/%s, result %s); a stopped unit is not started by the repair", unit, u.SubState, u.Result)
	}
	now := r.now()
	// The cooldown and the restart in flight are decided, and the restart
	// claimed, under one hold of the lock: two probes of the unit at once
	// (a reload replaced its check, and the old probe still runs beside
	// the new one's) restart it once, not once each.
	r.mu.Lock()
	st := r.status(unit)
	last := st.LastRepair
	if last.After(now) {
		// Read back from the state file (a wall-clock time), and the
		// clock was set back since: long ago, as a start in the future.
		last = time.Time{}
	}
	if started := r.started(u, now); started.After(last) {
		last = started
	}
	if !last.IsZero() && now.Sub(last) < cooldown {
		r.mu.Unlock()
		return RepairCooldown, repairMessage(u, cooldown)
	}
	if r.inflight[unit] {
		r.mu.Unlock()
		return RepairInProgress, fmt.Sprintf("not restarted: the previous restart of %s has not finished", unit)
	}
	r.inflight[unit] = true
	r.mu.Unlock()
	// Read only here, before a restart: a unit the shutdown has not
	// reached yet (or one that failed to stop, and is failed) is not
	// started again while the system goes down. A read that fails does
	// not hold the repair off. Meanwhile the restart is claimed: another
	// probe of the unit finds it in progress.
	if stopping, err := systemd.Stopping(ctx, r.mgr); err == nil && stopping {
		r.mu.Lock()
		delete(r.inflight, unit)
		r.mu.Unlock()
		return RepairShutdown, "not restarted: the system is shutting down"
	}
	r.mu.Lock()
	st.Repairs++
	st.Consecutive++
	st.LastRepair, st.LastReason, st.LastResult = now, reason, "requested"
	// Until the job's result comes, the unit at this invocation is the
	// repairer's, as for a result that never comes (jobOnItsWay): kept so
	// in the state file, so that a daemon restarted while the job runs
	// (an upgrade, a crash) does not take the unit the job's failed start
	// left inactive (or failed, a stop that did not end cleanly) at that
	// invocation for one someone stopped, and leave it down.
	st.restartFailed, st.failedAt = true, u.Invocation
	if u.ActiveState == "failed" && u.Invocation != "" {
		// The restart's reset-failed ends the failed state: should the
		// restart not start the unit, it stays failed (HidFailed).
		st.resetAt, st.resetResult = u.Invocation, u.Result
	}
	n := st.Consecutive
	r.mu.Unlock()
	// The restart job runs on its own: stopping a hung unit can take its
	// whole TimeoutStopSec, far longer than a probe may.
	r.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.jobTimeout)
		var took sync.Once
		count := func() { took.Do(func() { r.countRepair(unit, RepairRestarted) }) }
		err := r.mgr.Restart(systemd.WithTook(ctx, count), unit)
		if !errors.Is(err, systemd.ErrJobRefused) && !errors.Is(err, systemd.ErrNotRequested) {
			// A Manager that does not say when systemd took the request
			// (a test's), or a request whose fate is not known (the bus
			// went, the wait ran out): counted as a restart, as before.
			// One never sent (the bus not reached for it) made no job,
			// as one refused did not.
			count()
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			// The wait ran out, not the job: systemd goes on with it.
			err = fmt.Errorf("%s: the restart job did not finish within %s (it may still be running)", unit, r.jobTimeout)
		}
		cancel()
		// Read the unit again at once, on a context of its own (the
		// restart's may have run out): the watch counts this restart
		// (the new invocation) as ours, once.
		rctx, rcancel := context.WithTimeout(context.Background(), afterRestartRead)
		after, rerr := r.mgr.Unit(rctx, unit)
		rcancel()
		// A request systemd refused because of a stop someone queued
		// (systemd.StopQueued: of the unit or of one its start pulls in,
		// which mode "fail" does not cancel) made no job: a unit that ran
		// then, or was inactive (one its own failed restart left so,
		// retried), and is stopped now is the stop's, not left so by the
		// repairer. Only its reset-failed of a failed unit left that one
		// inactive. A refusal for any other reason (a unit its start
		// needs masked or not loadable for a while) is no one's stop:
		// the unit stays the repairer's, retried at the cooldown.
		at, left := u.Invocation, err != nil && !systemd.JobCanceled(err) && !(systemd.StopQueued(err) && u.ActiveState != "failed")
		if rerr == nil {
			if err == nil && after.Skipped == "" {
				watch.ObserveRestarted(after)
			} else {
				watch.Observe(after)
			}
			at = after.Invocation
			// A job another replaced (someone's stop) is not a restart
			// that could not start the unit: what it left is theirs.
			// Nor is one whose unit runs after it, whatever its result
			// says (a result lost with the D-Bus connection,
			// ErrJobConnLost, of a restart that worked): a stop of that
			// invocation later is someone's. But a unit that runs only
			// because the job, its result not come, still stops it (or
			// its start is still to come) may yet be left inactive at
			// that invocation by the job: it stays the repairer's.
			left = left && (!unitRuns(after) || jobOnItsWay(err, u, after))
		}
		// A start that systemd skipped (a Condition…= not met: the job
		// ends "done" with nothing started) or that an Assert…= failed
		// left the unit inactive at its invocation: the repairer's,
		// restarted at the cooldown, and no restart.
		skipped, assert := skippedStart(err, rerr, after)
		if skipped != "" {
			left, at = true, after.Invocation
			if assert {
				err = fmt.Errorf("%w: %s failed", err, skipped)
			}
		}
		r.mu.Lock()
		delete(r.inflight, unit)
		st.restartFailed, st.failedAt = left, at
		switch {
		case skipped != "" && !assert:
			st.LastResult = "skipped: " + skipped + " not met"
		case err != nil:
			st.LastResult = "failed: " + err.Error()
		default:
			st.LastResult = "done"
		}
		r.mu.Unlock()
		r.touch()
		if skipped != "" && !assert {
			r.countRepair(unit, RepairFailed)
			r.log.Warn("repair: systemd skipped the start of the unit: a condition of it is not met; tried again after the cooldown", "unit", unit, "condition", skipped, "reason", reason, "consecutive", n, "cooldown", cooldown)
			return
		}
		if err != nil {
			r.countRepair(unit, RepairFailed)
			r.log.Error("repair: restarting unit failed", "unit", unit, "reason", reason, "err", err)
			return
		}
		r.log.Warn("repair: restarted unit", "unit", unit, "reason", reason, "consecutive", n, "cooldown", cooldown)
	})
	return RepairRestarted, repairMessage(u, cooldown)
}

// skippedStart reports what kept the restart that ended with err, the unit
// read after it (rerr: that read's error), from starting the unit: the
// Condition…= systemd found not met, which made it skip the start (the
// job's result "done", the unit left inactive at the invocation it had:
// TestRepairOfAUnitWhoseConditionIsNotMet in tests/), or the Assert…= that
// failed the job (result "assert"), with whether it was an assert.
func skippedStart(err, rerr error, after systemd.Unit) (string, bool) {
	if rerr != nil || unitRuns(after) {
		return "", false
	}
	var je *systemd.JobError
	switch {
	case err == nil && after.Skipped != "":
		return after.Skipped, false
	case errors.As(err, &je) && je.Result == "assert" && after.AssertFailed != "":
		return after.AssertFailed, true
	}
	return "", false
}

// repairMessage is repairingMessage, but for a unit whose last start
// systemd skipped (a Condition…= not met) or failed on an Assert…=: then
// it says so, the same words for the restart and the cooldown after it.
func repairMessage(u systemd.Unit, cooldown time.Duration) string {
	if u.ActiveState == "inactive" {
		if why := startNotMade(u); why != "" {
			return fmt.Sprintf("%s; restarting it at most once per %s", why, cooldown)
		}
	}
	return repairingMessage(u.Name, cooldown)
}

// startNotMade says why systemd did not start u at its last start: a
// Condition…= not met (the start skipped) or an Assert…= that failed; ""
// for neither.
func startNotMade(u systemd.Unit) string {
	switch {
	case u.Skipped != "":
		return fmt.Sprintf("systemd skipped the start of %s: %s not met", u.Name, u.Skipped)
	case u.AssertFailed != "":
		return fmt.Sprintf("systemd did not start %s: %s failed", u.Name, u.AssertFailed)
	}
	return ""
}

// afterRestartRead bounds the read of a unit right after its restart job
// ended (or the wait for it did).
const afterRestartRead = 10 * time.Second

// unitRuns reports whether u is anything but inactive or failed.
func unitRuns(u systemd.Unit) bool {
	return u.ActiveState != "inactive" && u.ActiveState != "failed"
}

// jobOnItsWay reports whether a restart job whose result did not come (err
// is no *systemd.JobError: the wait for it ran out, or the bus dropped)
// may still be to leave the unit: read after it, the unit is at the
// invocation it had before the restart (u's), with a restart job on it, or
// the start job a restart job turns into once its stop is done. Its start
// may yet fail (result "dependency") and leave the unit inactive at that
// invocation; one that starts it moves it to a new one.
func jobOnItsWay(err error, u, after systemd.Unit) bool {
	var je *systemd.JobError
	if errors.As(err, &je) {
		return false
	}
	return after.Invocation == u.Invocation && after.Job != 0 && (after.JobType == "restart" || after.JobType == "start")
}

// notLoadedMessage says why a unit that systemd did not load is not
// repaired, and what to do, in NodeServiceDown's words (unitNotLoadable).
func notLoadedMessage(unit, loadState string) string {
	if loadState == "not-found" {
		return fmt.Sprintf("not repaired: %s is not installed (not-found)", unit)
	}
	return "not repaired: " + unitNotLoadable(unit, loadState, "")
}

// unitNotLoadable says why systemd will not start a unit it did not load,
// and what to do: a masked one is refused by `systemctl start` (unmasking
// is the fix); one whose file does not load (bad-setting, error) is
// explained by `systemctl status`. state, when set, is its state
// ("inactive/dead, result exit-code"), put beside the load state.
func unitNotLoadable(unit, loadState, state string) string {
	if loadState == "masked" {
		if state != "" {
			state = " (" + state + ")"
		}
		return fmt.Sprintf("%s is masked%s: systemd will not start it; systemctl unmask it", unit, state)
	}
	if state != "" {
		state = ", " + state
	}
	return fmt.Sprintf("%s does not load (%s%s): see systemctl status %s", unit, loadState, state, unit)
}

// leftByOwnRestart reports whether u, inactive, was left so by the daemon's
// own restart that failed, and has not run since (the same invocation): it
// is still the repairer's to restart, at the cooldown. A unit that ran
// after it, and someone stopped, is not; nor is one a probe saw a stop job
// on at this invocation: a restart job shows as "restart", then "start",
// never "stop", so that stop (someone's, or a shutdown's) replaced the
// restart, whose result, "canceled", did not come to this daemon (it was
// itself restarted mid-job, or the answer was lost).
func (r *Repairer) leftByOwnRestart(unit string, u systemd.Unit) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.units[unit]
	return ok && st.restartFailed && st.failedAt == u.Invocation && st.stopSeenAt != u.Invocation
}

// stoppedWithBound reports whether u, inactive, was stopped by systemd
// because a unit it BindsTo= (kubelet's containerd.service, on images
// that bind them) crashed and was brought back by its Restart= since
// (systemd.StoppedWithBound): nothing starts u again, and no one stopped
// it; it is the repairer's to start. Read only for an inactive unit the
// repairer's own restart did not leave so; a read that fails leaves it
// stopped.
func (r *Repairer) stoppedWithBound(ctx context.Context, u systemd.Unit) bool {
	br, ok := r.mgr.(systemd.BindsToReader)
	if !ok {
		return false
	}
	bound, err := br.BindsTo(ctx, u.Name)
	r.mu.Lock()
	key := ""
	if err != nil {
		key = u.Name + ": " + err.Error()
	}
	changed := key != r.bindsErr
	r.bindsErr = key
	r.mu.Unlock()
	if err != nil {
		if changed {
			r.log.Warn("repair: reading the units a stopped unit BindsTo= failed; taking it for stopped (logged again only when the error changes)", "unit", u.Name, "err", err)
		}
		return false
	}
	for _, b := range bound {
		if systemd.StoppedWithBound(u, b) {
			r.log.Info("repair: unit stopped by systemd because a unit it BindsTo= went down and came back; not someone's stop", "unit", u.Name, "bound", b.Name)
			return true
		}
		r.mu.Lock()
		seen, ok := r.upSeen[u.Name][b.Name]
		r.mu.Unlock()
		if ok && systemd.StoppedWithBoundCrashes(u, b, seen) {
			r.log.Info("repair: unit stopped by systemd because a unit it BindsTo= went down, which went down and came back more than once since the unit was last seen healthy; not someone's stop", "unit", u.Name, "bound", b.Name, "restarts", b.NRestarts-seen.NRestarts)
			return true
		}
	}
	// A unit u BindsTo= that runs now and did not stop u, or one down
	// whose every stop since u was seen healthy came after u's
	// (systemd.StoppedBeforeBound: read while it waits for its Restart=,
	// or stopped by hand after u): its later stops come after u's, and
	// cannot be why u stopped. u's stop is someone's for good (until u
	// runs again and is seen healthy): a stop of u by hand followed by
	// crashes of that unit is not taken for systemd's.
	r.mu.Lock()
	for _, b := range bound {
		seen, ok := r.upSeen[u.Name][b.Name]
		if b.ActiveState == "active" || ok && systemd.StoppedBeforeBound(u, b, seen) {
			delete(r.upSeen[u.Name], b.Name)
		}
	}
	r.mu.Unlock()
	return false
}

// sawStop records that unit, at invocation inv, has a stop job ("": none,
// the unit runs with no job).
func (r *Repairer) sawStop(unit, inv string) {
	r.mu.Lock()
	if _, ok := r.units[unit]; !ok && inv == "" {
		r.mu.Unlock()
		return
	}
	st := r.status(unit)
	changed := st.stopSeenAt != inv
	st.stopSeenAt = inv
	r.mu.Unlock()
	if changed {
		r.touch()
	}
}

// stoppedBySomeone reports whether u, failed, is at the invocation a stop
// job was seen on: a stop (someone's) that ended failed, which systemd does
// not restart. A unit that ran after it, and failed, is the repairer's.
func (r *Repairer) stoppedBySomeone(unit string, u systemd.Unit) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.units[unit]
	return ok && u.Invocation != "" && st.stopSeenAt == u.Invocation
}

// repairingMessage is the message of a restart and of the cooldown after
// it, the same words for both: the message goes into the condition, and a
// message that changed at every probe (a cooldown's "started 20s ago", a
// restart's count) would rewrite the Node's status every 10 s for as long as
// the unit stays unhealthy. When and how often the unit was repaired is in
// the services report and autopilot_health_repairs_total.
func repairingMessage(unit string, cooldown time.Duration) string {
	return fmt.Sprintf("restarting %s at most once per %s from its last start", unit, cooldown)
}

// HidFailed reports whether u, inactive with no job, is a unit the
// repairer found failed and whose failed state only its own reset-failed
// ended: its restart (mode "fail") was refused, or its start job did not
// start it, and it has not run since (the same invocation). systemd shows
// it inactive, result success; it is failed, with the result returned (the
// one it had). A `systemctl reset-failed` of such a unit by hand is not
// told from the repairer's: it stays failed here until it runs again.
func (r *Repairer) HidFailed(u systemd.Unit) (string, bool) {
	r.restore()
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.units[u.Name]
	if !ok || st.resetAt == "" || st.resetAt != u.Invocation || u.ActiveState != "inactive" || u.Job != 0 {
		return "", false
	}
	return st.resetResult, true
}

// Wait waits for restart jobs in flight (tests, shutdown).
func (r *Repairer) Wait() { r.wg.Wait() }

func (r *Repairer) status(unit string) *RepairStatus {
	st, ok := r.units[unit]
	if !ok {
		st = &RepairStatus{}
		r.units[unit] = st
	}
	return st
}

// Healthy records that the unit's probe passed: the run of repairs ends,
// and the other units as the unit watch last read them are kept (upSeen),
// with no read of its own.
func (r *Repairer) Healthy(unit string) {
	r.restore()
	r.mu.Lock()
	st := r.status(unit)
	was := st.Consecutive
	st.Consecutive = 0
	if r.watch != nil {
		// The units the watch read, as unit was healthy: whether one
		// unit BindsTo= went down twice since (stoppedWithBound).
		r.upSeen[unit] = r.watch.seenInto(unit, r.upSeen[unit])
	}
	r.mu.Unlock()
	if was != 0 {
		r.touch()
	}
}

// All returns what the repairer knows about every unit it was asked to
// repair, by unit name.
func (r *Repairer) All() map[string]RepairStatus {
	r.restore()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]RepairStatus, len(r.units))
	for name, st := range r.units {
		if !r.kept(name) {
			continue
		}
		out[name] = *st
	}
	return out
}

// Status returns the repair status of a unit.
func (r *Repairer) Status(unit string) RepairStatus {
	r.restore()
	r.mu.Lock()
	defer r.mu.Unlock()
	return *r.status(unit)
}
