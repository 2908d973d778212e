package daemon

import (
	"log/slog"
	"slices"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

// NewEnv detects the node and builds the checks' environment.
func NewEnv(cfg *config.Config, log *slog.Logger) (*checks.Env, Identity, error) {
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
