package checks

import (
	"context"
	"time"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("KubeletUnhealthy", newKubeletCheck) }

// kubeletCheck probes kubelet's /healthz; on failure it asks the repairer
// to restart kubelet.service (1 min cooldown).
type kubeletCheck struct {
	env      *Env
	url      string
	unit     string
	cooldown time.Duration
	get      *healthzGet
}

func newKubeletCheck(env *Env) (Check, error) {
	c := env.Config.Checks.KubeletUnhealthy
	return &kubeletCheck{env: env, url: c.HealthzURL, unit: c.Unit, cooldown: c.RestartCooldown.Duration,
		get: newHealthzGet(c.HealthzURL, c.Timeout.Duration)}, nil
}

// Close closes the kept connection (Closer): a check a reload replaced does
// not hold it until its idle timeout.
func (c *kubeletCheck) Close() { c.get.close() }

func (c *kubeletCheck) Probe(ctx context.Context) (Result, error) {
	if err := c.probe(ctx); err != nil {
		return repairResult(ctx, c.env, c.unit, c.cooldown, report.ReasonKubeletHealthzFailed, err).Result, nil
	}
	if c.env.Repair != nil {
		c.env.Repair.Healthy(c.unit)
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonKubeletIsHealthy, Message: "GET " + c.url + ": ok"}, nil
}

// probe GETs /healthz (healthzGet): a 200 with its body is healthy.
func (c *kubeletCheck) probe(ctx context.Context) error { return c.get.get(ctx) }

// repairResult is the result of a failed repair probe: True with the
// failure and what the repairer did about it; Unknown (NoData) while the
// unit has not started yet (at boot kubelet waits for this daemon, ordered
// Before=kubelet.service, so its first probes find it not running).
func repairResult(ctx context.Context, env *Env, unit string, cooldown time.Duration, reason report.Reason, probeErr error) repaired {
	action := "not repaired (only the daemon repairs; autopilot-health check does not)"
	var res string
	if env.Repair != nil {
		res, action = env.Repair.Repair(ctx, unit, cooldown, probeErr.Error())
		if res == RepairStarting {
			return repaired{Result{Status: report.StatusUnknown, Reason: report.ReasonNoData, Message: action + "; " + probeErr.Error()}, res}
		}
	}
	return repaired{Result{Status: report.StatusTrue, Reason: reason, Message: probeErr.Error() + "; " + action}, res}
}

// repaired is a failed probe's result and what the repairer did ("" when
// nothing repairs: the one-shot check).
type repaired struct {
	Result
	repair string
}

// probeTimeout leaves a fifth of the check's timeout for the repair, so a
// hung service is a failed probe (True, repaired), not a check timeout.
func probeTimeout(checkTimeout time.Duration) time.Duration { return checkTimeout * 4 / 5 }
