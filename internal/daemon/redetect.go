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

// redetect looks at the node's role and GPU again every interval (those
// the configuration does not fix): on a first boot the kube-apiserver
// manifest appears after the daemon started, and a GPU may be added or
// activated later. A change is logged once, re-plans the checks (a check
// that no longer applies reports Unknown/NotApplicable), and the report
// annotations carry the new role from their next refresh. A node seen with
// a GPU in this boot stays a GPU node until the next boot (DetectRoleGPU):
// a GPU that fell off the bus may leave the PCI bus, and its conditions
// must not turn not applicable.
func (d *Daemon) redetect(ctx context.Context, interval time.Duration) {
	const loop = "detect"
	d.live.Expect(loop, interval)
	defer d.live.Forget(loop)
	t := d.grid().NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.live.Beat(loop, interval)
		d.detectOnce()
	}
}

// detectOnce is one round of redetect.
func (d *Daemon) detectOnce() {
	d.replanIdentity(DetectRoleGPU(d.cfg, d.currentEnv().GPUsSeen))
}

// replanIdentity re-plans the checks when the node's role or GPU changed.
func (d *Daemon) replanIdentity(role report.Role, roleSource string, gpu bool, gpuSource string) {
	d.planMu.Lock()
	defer d.planMu.Unlock()
	old := d.currentEnv()
	if role == old.Role && gpu == old.GPU {
		return
	}
	d.log.Warn("node identity changed; re-planning the checks",
		"role_from", old.Role, "role", role, "role_source", roleSource,
		"gpu_from", old.GPU, "gpu", gpu, "gpu_source", gpuSource)
	env := *old
	env.Role, env.GPU = role, gpu
	r, err := d.parts.newRunner(&env)
	if err != nil {
		d.log.Error("re-planning the checks failed; keeping the old plan", "err", err)
		return
	}
	for _, c := range d.currentRunner().Checks() {
		if !slices.Contains(r.Checks(), c) {
			d.checkStopped(c)
		}
	}
	// The kernel log monitor's GPU first: what it evaluates (External)
	// says which of its conditions apply to the new plan, and
	// initMetrics creates the series of those that apply now (a GPU
	// activated after the start: GpuFallenOffBus).
	if d.kmsg != nil {
		d.kmsg.SetGPU(gpu, time.Now())
	}
	d.parts.initMetrics(&env, old)
	d.envMu.Lock()
	d.env, d.runner = &env, r
	d.envMu.Unlock()
	now := time.Now()
	for _, p := range checks.Plan(&env, nil, d.parts.External()) {
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
