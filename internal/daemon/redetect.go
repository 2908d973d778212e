package daemon

import (
	"context"
	"slices"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/report"
)

// currentEnv returns the checks' environment as of the last detection.
func (d *Daemon) currentEnv() *checks.Env {
	d.envMu.Lock()
	defer d.envMu.Unlock()
	return d.env
}

// currentRunner returns the runner of the current plan.
func (d *Daemon) currentRunner() *checks.Runner {
	d.envMu.Lock()
	defer d.envMu.Unlock()
	return d.runner
}

// applicable lists the conditions evaluated on a node like env (by the
// runner or the kernel log monitor).
func (d *Daemon) applicable(env *checks.Env) []string {
	var out []string
	for _, p := range checks.Plan(env, nil, KmsgExternal(d.kmsg)) {
		if p.State == checks.Scheduled || p.State == checks.Elsewhere {
			out = append(out, p.Desc.Type)
		}
	}
	return out
}

// initMetrics creates the series (at 0) of the conditions and events that
// apply to a node like env and did not apply to one like prev (nil: none).
func (d *Daemon) initMetrics(env, prev *checks.Env) {
	var had []string
	if prev != nil {
		had = d.applicable(prev)
	}
	var conds []string
	for _, t := range d.applicable(env) {
		if !slices.Contains(had, t) {
			conds = append(conds, t)
		}
	}
	d.metrics.InitConditions(conds)
	var events []string
	for _, e := range report.Events {
		if e.Scope.Applies(env.Role, env.GPU) && (prev == nil || !e.Scope.Applies(prev.Role, prev.GPU)) {
			events = append(events, e.Reason)
		}
	}
	d.metrics.InitEvents(events)
}

// newRunner builds the runner of the checks that apply to a node like env,
// and tells the liveness which loops to expect.
func (d *Daemon) newRunner(env *checks.Env) (*checks.Runner, error) {
	r, err := checks.NewRunner(env, checks.Options{Store: d.store, Metrics: d.metrics, Details: d.details, Progress: d.live.Beat, External: KmsgExternal(d.kmsg)})
	if err != nil {
		return nil, err
	}
	spread := d.cfg.Runner.FirstRunSpread.Duration
	for _, c := range r.Checks() {
		com, _ := d.cfg.Checks.Common(c)
		d.live.Expect("check/"+c, spread+com.Interval.Duration+com.Timeout.Duration+loopSlack)
	}
	return r, nil
}

// runChecks runs the current runner until ctx is done, and swaps in a new
// one when the plan changes (see redetect). The first full pass (of
// whichever runner gets there) makes the daemon ready.
func (d *Daemon) runChecks(ctx context.Context) {
	for {
		r := d.currentRunner()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.Run(rctx, func() { d.firstPass.Do(d.becomeReady) })
		}()
		select {
		case <-ctx.Done():
		case <-d.replan:
		}
		cancel()
		<-done
		if ctx.Err() != nil {
			return
		}
	}
}

// becomeReady records the first full pass and tells systemd.
func (d *Daemon) becomeReady() {
	d.mu.Lock()
	d.ready = true
	d.mu.Unlock()
	d.metrics.SetReady(true)
	status := d.Summary()
	d.log.Info("first pass complete", "status", status)
	if err := d.notify.Ready(status); err != nil {
		d.log.Warn("sd_notify READY failed", "err", err)
	}
}

// redetect looks at the node's role and GPU again every interval (those
// the configuration does not fix): on a first boot the kube-apiserver
// manifest appears after the daemon started, and a GPU may be added or
// activated later. A change is logged once, re-plans the checks (a check
// that no longer applies reports Unknown/NotApplicable), and the report
// annotations carry the new role from their next refresh.
func (d *Daemon) redetect(ctx context.Context, interval time.Duration) {
	const loop = "detect"
	d.live.Expect(loop, interval+loopSlack)
	defer d.live.Forget(loop)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.live.Beat(loop, interval+loopSlack)
		role, roleSource, gpu, gpuSource := DetectRoleGPU(d.cfg)
		old := d.currentEnv()
		if role == old.Role && gpu == old.GPU {
			continue
		}
		d.log.Warn("node identity changed; re-planning the checks",
			"role_from", old.Role, "role", role, "role_source", roleSource,
			"gpu_from", old.GPU, "gpu", gpu, "gpu_source", gpuSource)
		env := *old
		env.Role, env.GPU = role, gpu
		r, err := d.newRunner(&env)
		if err != nil {
			d.log.Error("re-planning the checks failed; keeping the old plan", "err", err)
			continue
		}
		for _, c := range d.currentRunner().Checks() {
			if !slices.Contains(r.Checks(), c) {
				d.live.Forget("check/" + c)
			}
		}
		d.initMetrics(&env, old)
		d.envMu.Lock()
		d.env, d.runner = &env, r
		d.envMu.Unlock()
		if d.kmsg != nil {
			d.kmsg.SetGPU(gpu, time.Now())
		}
		now := time.Now()
		for _, p := range checks.Plan(&env, nil, KmsgExternal(d.kmsg)) {
			if p.State != checks.NotApplicable {
				continue
			}
			if c, ok := d.store.Get(p.Desc.Type); ok && (c.Status != report.StatusUnknown || c.Reason != report.ReasonNotApplicable) {
				d.store.Set(p.Placeholder, now)
			}
		}
		select {
		case d.replan <- struct{}{}:
		default:
		}
	}
}
