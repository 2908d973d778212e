package checks

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("NodeServiceDown", newNodeServiceDown) }

// nodeServiceDown: True when an operability unit (tunnel agent, server,
// source-IP helper; per role) is not active. Active is what `systemctl
// is-active` calls active: "active", and "reloading" and "refreshing", in
// which the unit keeps running (its ExecReload=, systemd 255's refresh of
// its mount namespace).
type nodeServiceDown struct {
	env   *Env
	units []string
	// comingSince: since when each unit has been read coming back (a
	// start or restart job on it, not active), run after run. One that
	// has been so for comingBackLimit is down: a start job that never
	// ends (TimeoutStartSec=infinity, a job waiting on another that
	// hangs) would otherwise hold the condition Unknown for ever.
	comingSince map[string]time.Time
}

// comingBackLimit is how long a unit may be read coming back, run after
// run, before NodeServiceDown counts it down.
const comingBackLimit = 5 * time.Minute

// OperabilityUnit is one unit in the services report's
// operabilityServices: the unit as systemd reports it.
type OperabilityUnit struct {
	systemd.Unit
	// Down: it is not active (not installed counts), the check's True
	// (set by Probe; not in the report: Problem).
	Down bool `json:"-"`
}

// Problem reports whether the unit is down: not only a failed unit (the
// systemd.Unit's Problem) but a stopped or missing one is what the
// condition names, and its entry is kept when the list is cut.
func (u OperabilityUnit) Problem() bool { return u.Down }

func newNodeServiceDown(env *Env) (Check, error) {
	c := env.Config.Checks.NodeServiceDown
	units := c.WorkerUnits
	if env.Role == report.RoleControlPlane {
		units = c.ControlPlaneUnits
	}
	return &nodeServiceDown{env: env, units: units, comingSince: map[string]time.Time{}}, nil
}

func (c *nodeServiceDown) Probe(ctx context.Context) (Result, error) {
	if len(c.units) == 0 {
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Message: fmt.Sprintf("no operability units configured for role %s", c.env.Role)}, nil
	}
	if c.env.Systemd == nil {
		return Result{}, errNoSystemd
	}
	var down, starting []string
	units, err := systemd.UnitsOf(ctx, c.env.Systemd, c.units...)
	if err != nil {
		return Result{}, err
	}
	states := make([]OperabilityUnit, 0, len(units))
	now := c.env.Now()
	for _, u := range units {
		name := u.Name
		// A unit systemd is (re)starting is coming back, whatever its
		// state: `systemctl restart` (or the start half of one, waiting
		// for the units it is ordered after) is no outage (ComingBack).
		comingBack := u.LoadState == "loaded" && !isActive(u.ActiveState) && u.ComingBack()
		if !comingBack {
			delete(c.comingSince, name)
		} else if since, ok := c.comingSince[name]; !ok {
			c.comingSince[name] = now
		} else if now.Sub(since) >= comingBackLimit {
			// Being started for too long: down, as its message says.
			comingBack = false
			down = append(down, fmt.Sprintf("%s has been starting since %s (%s/%s, %s job queued)", name, since.UTC().Format(time.RFC3339), u.ActiveState, u.SubState, u.JobType))
			states = append(states, OperabilityUnit{Unit: u, Down: true})
			continue
		}
		// The unit a True names is kept first when the list is cut.
		states = append(states, OperabilityUnit{Unit: u, Down: u.LoadState == "not-found" || !isActive(u.ActiveState) && !comingBack})
		switch {
		case u.LoadState == "not-found":
			down = append(down, name+" is not installed")
		case comingBack:
			starting = append(starting, fmt.Sprintf("%s is being started (%s/%s, %s job queued)", name, u.ActiveState, u.SubState, u.JobType))
		case !isActive(u.ActiveState):
			what := u.ActiveState + "/" + u.SubState
			if u.Result != "" && u.Result != "success" {
				what += ", result " + u.Result
			}
			switch u.LoadState {
			case "masked", "bad-setting", "error":
				down = append(down, unitNotLoadable(name, u.LoadState, what))
			default:
				if why := startNotMade(u); why != "" && u.ActiveState == "inactive" {
					// Not stopped: its last start was skipped (a
					// Condition…= not met) or failed on an Assert…=.
					what += "; " + why
				}
				down = append(down, fmt.Sprintf("%s is not active (%s)", name, what))
			}
		}
	}
	details := []report.Detail{{Domain: "services", Field: "operabilityServices", Value: states}}
	if len(down) > 0 {
		return Result{Status: report.StatusTrue, Reason: report.ReasonUnitNotActive, Message: strings.Join(down, "; "), Details: details}, nil
	}
	if len(starting) > 0 {
		// Neither down nor up yet: the next run tells.
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNoData, Message: strings.Join(starting, "; "), Details: details}, nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonNodeServicesActive, Message: strings.Join(c.units, ", ") + ": active", Details: details}, nil
}

// isActive reports whether a unit's ActiveState is one `systemctl
// is-active` answers with success (its verb_is_active: UNIT_ACTIVE,
// UNIT_RELOADING, UNIT_REFRESHING).
func isActive(state string) bool {
	return state == "active" || state == "reloading" || state == "refreshing"
}
