package checks

import (
	"context"
	"time"

	"github.com/syself/autopilot-health/report"
)

func init() { Register("ContainerRuntimeUnhealthy", newContainerdCheck) }

// containerdCheck makes a real CRI call (RuntimeService/Status, as kubelet
// does) over the runtime's socket; on failure it asks the repairer to
// restart containerd.service (2 min cooldown). NetworkReady=false is normal
// before the CNI is up; only RuntimeReady counts.
type containerdCheck struct {
	env         *Env
	callTimeout time.Duration
	unit        string
	cooldown    time.Duration
	cri         *criClient
}

func newContainerdCheck(env *Env) (Check, error) {
	c := env.Config.Checks.ContainerRuntimeUnhealthy
	return &containerdCheck{env: env, callTimeout: probeTimeout(c.Timeout.Duration), unit: c.Unit, cooldown: c.RestartCooldown.Duration,
		cri: newCRIClient(env.Path(c.Socket))}, nil
}

// Close closes the kept CRI connection (Closer).
func (c *containerdCheck) Close() { c.cri.close() }

func (c *containerdCheck) Probe(ctx context.Context) (Result, error) {
	callCtx, cancel := context.WithTimeout(ctx, c.callTimeout)
	defer cancel()
	if err := c.cri.status(callCtx); err != nil {
		if _, denied := socketDenied(err); denied {
			// Not a runtime that fails: one this process may not ask.
			return Result{}, err
		}
		r := repairResult(ctx, c.env, c.unit, c.cooldown, report.ReasonCRIProbeFailed, err)
		if criNotInitialized(err) && r.repair == RepairCooldown {
			// Started within the cooldown (at boot, or restarted by
			// systemd or the repair) and still initialising: starting,
			// not unhealthy. Past the cooldown it is a failure, and
			// restarted, as any other.
			return Result{Status: report.StatusUnknown, Reason: report.ReasonNoData,
				Message: c.unit + " is starting: its CRI plugin has not initialised yet (" + err.Error() + ")"}, nil
		}
		return r.Result, nil
	}
	if c.env.Repair != nil {
		c.env.Repair.Healthy(c.unit)
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonContainerRuntimeIsHealthy, Message: "CRI RuntimeService/Status on " + c.cri.socket + ": RuntimeReady"}, nil
}
