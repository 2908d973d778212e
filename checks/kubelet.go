package checks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
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
	client   *http.Client
}

func newKubeletCheck(env *Env) (Check, error) {
	c := env.Config.Checks.KubeletUnhealthy
	return &kubeletCheck{env: env, url: c.HealthzURL, unit: c.Unit, cooldown: c.RestartCooldown.Duration,
		client: keptClient(c.Timeout.Duration)}, nil
}

// Close closes the kept connection (Closer): a check a reload replaced does
// not hold it until its idle timeout.
func (c *kubeletCheck) Close() { c.client.CloseIdleConnections() }

func (c *kubeletCheck) Probe(ctx context.Context) (Result, error) {
	if err := c.probe(ctx); err != nil {
		return repairResult(ctx, c.env, c.unit, c.cooldown, report.ReasonKubeletHealthzFailed, err).Result, nil
	}
	if c.env.Repair != nil {
		c.env.Repair.Healthy(c.unit)
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonKubeletIsHealthy, Message: "GET " + c.url + ": ok"}, nil
}

// probe GETs /healthz. On the kept connection: when it fails before an
// answer (kubelet restarted since the last probe), net/http makes the GET
// once more on a new one (an idempotent request on a connection used
// before), so a restart is never taken for an outage.
func (c *kubeletCheck) probe(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		// "Get \"<url>\": <cause>", without the local port, another at
		// each new connection (the message would change at every probe).
		return withoutLocalAddr(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d: %s", c.url, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if err != nil {
		// A 200 is an answer only once its body came: a kubelet that hung
		// or died mid-answer is not healthy (the client's timeout ends a
		// body that never comes, as it ends an answer that never starts).
		return fmt.Errorf("GET %s: HTTP 200, reading the answer: %w", c.url, withoutLocalAddr(err))
	}
	return nil
}

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
