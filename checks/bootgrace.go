package checks

import (
	"context"
	"fmt"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// bootGrace holds back the True of a check whose service starts after this
// daemon at every boot (cniUnhealthy: cilium-agent, a pod; GpuActivationFailed:
// gpu-activate): until the check has found it healthy (False) once in this
// boot, and within grace of the boot (CLOCK_BOOTTIME), a True is Unknown,
// NoData, "<notYet> (<the probe's message>)". After the grace the same
// answer is True; once found healthy in this boot, at once. "Found healthy
// in this boot" is kept in the state file (Env.Memos), so a daemon restart
// within the boot does not give a failure the grace again.
type bootGrace struct {
	healthy bootValue[bool]
	grace   time.Duration
	notYet  string
}

func newBootGrace(key string, grace time.Duration, notYet string) bootGrace {
	return bootGrace{healthy: bootValue[bool]{key: key}, grace: grace, notYet: notYet}
}

// probe runs probe and applies the grace to what it found.
func (g *bootGrace) probe(ctx context.Context, env *Env, probe func(context.Context) (Result, error)) (Result, error) {
	g.healthy.restore(env.Memos)
	r, err := probe(ctx)
	switch {
	case err != nil:
	case r.Status == report.StatusFalse:
		g.healthy.set(env.Memos, true)
	case r.Status == report.StatusTrue && !g.healthy.get():
		if up, uerr := env.Sys.SinceBoot(); uerr == nil && up < g.grace {
			return Result{Status: report.StatusUnknown, Reason: report.ReasonNoData,
				Message: fmt.Sprintf("%s (%s); it is a problem from %s after the boot", g.notYet, r.Message, config.ShortDuration(g.grace))}, nil
		}
	}
	return r, err
}
