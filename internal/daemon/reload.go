package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

// ErrNoConfigFile: the daemon was given no configuration file to read
// again (Options.ConfigPath is empty).
var ErrNoConfigFile = errors.New("no configuration file to reload")

// reloadLoop reloads the configuration on each signal (SIGHUP: `kill -HUP`;
// `systemctl reload` asks over the control socket, see ReloadNotified).
func (d *Daemon) reloadLoop(ctx context.Context, sig <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		case <-d.reloadReq: // becomeReady's; ReloadNotified waits for its READY=1
		}
		d.ReloadNotified()
	}
}

// ReloadNotified is Reload wrapped in systemd's reload protocol, for a
// reload asked for by a signal or on the control socket: once the daemon
// is ready, RELOADING=1 before and READY=1 after, whatever the outcome (a
// refused reload leaves the daemon running as it was), with the outcome in
// STATUS=. Before the first pass only STATUS= is sent: READY=1 would end
// the start. Reloads asked for at once run one after the other.
func (d *Daemon) ReloadNotified() (Reloaded, error) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	// The reload protocol only once the start's READY=1 is out: before,
	// RELOADING=1 would be a reload of a unit still starting.
	d.mu.Lock()
	ready := d.ready
	d.mu.Unlock()
	if ready {
		// The first pass is done: becomeReady is sending READY=1 (or
		// has); the reload's RELOADING=1 comes after it.
		<-d.readySent
		if err := d.tell(func(n Notifier) error { return n.Reloading("reloading the configuration") }); err != nil {
			d.log.Warn("sd_notify RELOADING failed", "err", err)
		}
	}
	// The status after the reload: one from before would undo the status
	// loop's update (a reload that removed a condition). Computed and
	// sent under the status loop's lock: a change the loop sent while the
	// reload ran is not undone by a line computed before it either.
	r, err := d.Reload()
	if ready {
		if err := d.sendReady(); err != nil {
			d.log.Warn("sd_notify READY failed", "err", err)
		}
	} else {
		d.sendStatus()
	}
	return r, err
}

// ReloadOutcome is the outcome of the last reload, for status.
type ReloadOutcome struct {
	At time.Time `json:"at"`
	// Result: "ok" (applied, or nothing changed) or "refused" (the
	// configuration in effect stays).
	Result  string `json:"result"`
	Error   string `json:"error,omitempty"`
	Changed string `json:"changed,omitempty"`
}

// StatusLine is systemd's STATUS=: the conditions' summary (before the
// first pass is over, "starting: first pass of N checks"), after the
// refusal of the last reload while the daemon runs on the configuration
// it refused to leave (a later reload that applies drops it), before that
// a write of the state file blocked in I/O (stateWriteNote), before that
// the metrics listener's bind failure while it cannot be bound, and first
// the Node not updated while the conditions' writes have failed for
// kube.NodeStaleAfter (what the summary says is then not what the Node
// shows, and what acts on the Node acts on that).
func (d *Daemon) StatusLine() string {
	d.mu.Lock()
	last, ready := d.lastReload, d.ready
	d.mu.Unlock()
	s := d.Summary()
	if !ready {
		// Until the first pass is over (READY=1), what the daemon does,
		// with the notes in front as once it runs: a note that clears
		// during the first pass (a minute, with a check's timeout) leaves
		// the line then, and one that comes is shown then.
		s = fmt.Sprintf("starting: first pass of %d checks", len(d.currentRunner().Checks()))
	}
	if last != nil && last.Result == "refused" {
		// Cut (the journal and status have it whole): the summary
		// after it is what the line is for, and systemd ignores a
		// notification over 4096 bytes whole (notifyMax).
		s = "configuration reload refused (running on the previous one): " + report.CapMessage(last.Error) + "; " + s
	}
	if note := d.stateWriteNote(); note != "" {
		s = note + "; " + s
	}
	s = d.metricsNote() + s
	if n, ok := d.kubeM.NodeNotUpdated(); ok {
		s = n.Note() + "; " + s
	}
	return s
}

// reloadIfChangedDuringStart reloads the configuration file when it is no
// longer what the start or the last reload read: systemd merges a `systemctl reload`
// asked for while the unit starts into the start job, so the file written
// then is read here, once the start is over, and applied or refused (and
// logged and counted) as any reload.
func (d *Daemon) reloadIfChangedDuringStart() {
	if d.cfgPath == "" {
		return
	}
	// Against what the start or the last reload read (a reload in flight
	// included), not what is in effect: a refused file put right again is
	// read again (it ends the refusal), a refused one left as it was is
	// not refused twice.
	d.mu.Lock()
	read := d.readDigest
	d.mu.Unlock()
	if config.FileDigest(d.cfgPath) == read {
		return
	}
	d.log.Info("the configuration file changed while the daemon started (systemd folds a reload asked for then into the start); reloading it", "file", d.cfgPath)
	select {
	case d.reloadReq <- struct{}{}:
	default:
	}
}

// Reloaded says what a reload changed.
type Reloaded struct {
	// Keys are the keys that differ from the running configuration.
	Keys []string
	// Checks: what the runner changed (checks.Applied).
	Checks checks.Applied
	// Rules: what changed in the kernel log rules.
	Rules kmsg.RuleChanges
	// Notes: the new file's values taken otherwise than written
	// (config.Note), which Reload logs when it had not.
	Notes []config.Note
}

// LogConfigNotes logs, once each, the notes (config.Note) of a
// configuration that are not among logged: a value the file sets that
// the daemon takes otherwise than written, what it took and why. A note
// logged is not logged again for a line moved (a key added above it).
func LogConfigNotes(log *slog.Logger, notes, logged []config.Note) {
	for _, n := range notes {
		if slices.ContainsFunc(logged, func(l config.Note) bool { l.Line = n.Line; return l == n }) {
			continue
		}
		log.Info("configuration: "+n.Key+" is taken otherwise than written: "+n.Why,
			"file", n.File, "line", n.Line, "key", n.Key, "taken", n.Taken)
	}
}

// Summary is the log line's account of the changes.
func (r Reloaded) Summary() string {
	var parts []string
	add := func(what string, names []string) {
		if len(names) > 0 {
			parts = append(parts, what+": "+strings.Join(names, ", "))
		}
	}
	add("checks changed", r.Checks.Changed)
	add("started", r.Checks.Started)
	add("stopped", r.Checks.Stopped)
	if n := len(r.Rules.Added) + len(r.Rules.Removed) + len(r.Rules.Changed); n > 0 {
		parts = append(parts, fmt.Sprintf("kmsg rules: +%d -%d ~%d", len(r.Rules.Added), len(r.Rules.Removed), len(r.Rules.Changed)))
	}
	if len(parts) == 0 {
		parts = append(parts, "no check or kernel log rule changed")
	}
	return strings.Join(parts, "; ")
}

// Text is what the reload did, for the operator who asked: "no changes",
// or the changed keys and Summary.
func (r Reloaded) Text() string {
	if len(r.Keys) == 0 {
		return "no changes"
	}
	return fmt.Sprintf("%d %s %s changed; %s", len(r.Keys), plural(len(r.Keys), "key", "keys"), strings.Join(r.Keys, ", "), r.Summary())
}

// Reload reads the configuration file again (the same path, the same
// strict parsing as at start) and applies it in place, all or nothing:
//
//   - a file that does not load is refused with its file, line and key
//     (the text of `config validate`);
//   - under the privileged helper, a file run --privileged-helper would
//     refuse (HelperRefuses), with run's words, not as a key that needs a
//     restart: that restart would refuse it; so is a host_root changed to
//     no directory (HostRootRefuses);
//   - a file that changes a key that needs a restart (config.RestartKeys)
//     is refused as a whole, naming the keys;
//   - else the checks are re-planned (checks.Runner.Apply: an unchanged
//     check keeps its timer, a changed one restarts with its new settings,
//     a disabled one stops and its condition leaves the store, the state
//     file and the Node, and its series the metrics, as a condition not
//     evaluated at start; an enabled one starts), and the kernel log rules
//     are swapped
//     (kmsg.Monitor.Reconfigure: the reader's cursor stays).
//
// The conditions held in the store are kept: nothing flaps. It logs once:
// what changed, "no changes", or why it was refused; and counts the reload
// (config_reloads_total).
func (d *Daemon) Reload() (Reloaded, error) {
	d.planMu.Lock()
	defer d.planMu.Unlock()
	r, err := d.reload()
	now := time.Now()
	d.metrics.ConfigReload(err, now)
	out := &ReloadOutcome{At: now, Result: "ok"}
	if err != nil {
		out.Result, out.Error = "refused", err.Error()
	} else {
		out.Changed = r.Text()
	}
	// The file was loaded now by any reload not refused, one that changed
	// nothing included (README: "at start, or by the last reload that was
	// not refused"): the time status shows is
	// config_last_reload_success_timestamp_seconds (ConfigReload above).
	d.mu.Lock()
	d.lastReload = out
	logged := d.notes
	if err == nil {
		d.cfgSince = now
		d.cfgAbsent = d.readDigest == config.AbsentDigest
		d.notes = r.Notes
	}
	d.mu.Unlock()
	switch {
	case err != nil:
		d.log.Error("configuration reload refused; running on the previous configuration", "err", err)
	case len(r.Keys) == 0:
		d.log.Info("config reloaded, no changes", "file", d.cfgPath)
	default:
		d.log.Info("config reloaded from "+d.cfgPath+": "+r.Summary(), "keys", strings.Join(r.Keys, ", "))
	}
	if err == nil {
		LogConfigNotes(d.log, r.Notes, logged)
	}
	return r, err
}

// checkStopped handles a check that stopped (a reload disabled it, or the
// node's role or GPU no longer has it): the liveness no longer expects its
// loop, and its series leave the metrics (its loop's progress, its runs
// and durations), as for a check not run at start: a progress timestamp
// left frozen would look like a stuck check. A check started again later
// makes its series anew.
func (d *Daemon) checkStopped(c string) {
	loop := "check/" + c
	d.live.Forget(loop)
	d.metrics.RemoveLoop(loop)
	d.metrics.RemoveCheck(c)
}

func (d *Daemon) reload() (Reloaded, error) {
	if d.cfgPath == "" {
		return Reloaded{}, ErrNoConfigFile
	}
	cfg, _, digest, err := config.LoadDigest(d.cfgPath, d.cfgOptional)
	d.mu.Lock()
	d.readDigest = digest
	d.mu.Unlock()
	if err != nil {
		return Reloaded{}, err
	}
	if d.helper {
		// Said as run says it: a restart would refuse it too.
		if err := HelperRefuses(cfg, d.cfgPath); err != nil {
			return Reloaded{}, err
		}
	}
	old := d.currentEnv()
	if cfg.HostRoot != old.Config.HostRoot {
		// Said as run says it: a restart would refuse it too.
		if err := HostRootRefuses(cfg, d.cfgPath); err != nil {
			return Reloaded{}, err
		}
	}
	res := Reloaded{Keys: config.Diff(old.Config, cfg), Notes: cfg.Notes()}
	if len(res.Keys) == 0 {
		return res, nil
	}
	var restart []string
	for _, k := range res.Keys {
		if config.NeedsRestart(k) {
			restart = append(restart, k)
		}
	}
	if len(restart) > 0 {
		// At the line of the first key, as every other configuration
		// error (none: the file no longer sets it or its table). A file
		// no longer there (the default path) is the embedded defaults,
		// which a restart would start on: said as the start says it.
		at := d.cfgPath
		if l := cfg.Line(restart[0]); l > 0 {
			at += ":" + strconv.Itoa(l)
		}
		if digest == config.AbsentDigest {
			at = "embedded defaults (" + d.cfgPath + " absent)"
		}
		return Reloaded{}, fmt.Errorf("%s: %s %s: %s (systemctl restart autopilot-health); nothing applied",
			at, plural(len(restart), "key", "keys"), strings.Join(restart, ", "), plural(len(restart), "needs a restart", "need a restart"))
	}
	env := *old
	env.Config = cfg
	var ko kmsg.Options
	if d.kmsg != nil {
		if ko, err = KmsgOptions(cfg, &env, d.store, nil); err != nil {
			return Reloaded{}, fmt.Errorf("%s: kernel log rules: %w", d.cfgPath, err)
		}
	}
	r := d.currentRunner()
	if res.Checks, err = r.Apply(&env); err != nil {
		return Reloaded{}, fmt.Errorf("%s: %w", d.cfgPath, err)
	}
	if env.Repair != nil {
		// A unit the file no longer names leaves status's "Repairs:".
		env.Repair.Watch(checks.WatchedUnits(cfg))
		env.Repair.Repaired(checks.RepairedUnits(cfg))
	}
	if len(res.Checks.Changed)+len(res.Checks.Started) > 0 {
		// During the first pass, their first runs are from now.
		d.extendStartAgain(r)
	}
	if d.kmsg != nil {
		res.Rules = d.kmsg.Reconfigure(ko)
	}
	d.envMu.Lock()
	d.env = &env
	d.parts.Config = cfg
	d.envMu.Unlock()

	// The loops the liveness expects, and the stopped checks' series.
	for _, c := range res.Checks.Stopped {
		d.checkStopped(c)
	}
	spread := cfg.Runner.FirstRunSpread.Duration
	for _, c := range slices.Concat(res.Checks.Changed, res.Checks.Started) {
		com, _ := cfg.Checks.Common(c)
		d.live.Expect("check/"+c, spread+com.Interval.Duration+com.Timeout.Duration)
	}
	// A condition no longer evaluated here is handled as at start, where
	// it is not evaluated: not in the store nor the state file, removed
	// from the Node, no series. A check that evaluates one part of its
	// condition (DisksFailure's SMART part) drops its part: the kernel's
	// part decides alone, as at a start with the check disabled.
	now := time.Now()
	applicable := d.parts.applicable(&env)
	for _, c := range res.Checks.Stopped {
		desc, _ := report.Lookup(c)
		if _, isPart := desc.Part(desc.Source); isPart && slices.Contains(applicable, c) {
			d.store.RemovePart(desc.Source, c, now)
			continue
		}
		if slices.Contains(applicable, c) {
			continue
		}
		if cur, ok := d.store.Get(c); ok && cur.Status == report.StatusTrue && desc.Hold == report.HoldForever {
			// A finding only an operator's clear lowers: its check
			// disabled takes it off the Node all the same, on the record.
			d.log.Warn(report.TamperFindingRemovedLog,
				"condition", c, "reason", cur.Reason, "message", cur.Message, "since", cur.LastTransitionTime)
		}
		if !d.store.Remove(c) {
			// Not set yet (stopped before its first run, within the
			// first-run spread): the series the start made for it at 0
			// go all the same, as the store's removal takes them.
			d.metrics.ConditionRemoved(report.Condition{Type: c})
		}
	}
	d.parts.initMetrics(&env, old)
	return res, nil
}
