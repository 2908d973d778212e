package checks

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("ServiceNotRecovering", newServiceNotRecovering) }

// serviceNotRecovering watches the critical units (kubelet, containerd, and
// on a worker the failover proxy): True when one is failed, when
// systemd restarted it automatically the threshold number of times or more
// since the last run (counted by the UnitWatch, whose state, this check's
// baseline included, is kept in the state file), or when the daemon's own
// repairs of it did not help that many times in a row.
type serviceNotRecovering struct {
	env       *Env
	units     []string
	threshold int
	watch     *UnitWatch
}

// snrMark names this check's baseline in the UnitWatch.
const snrMark = "ServiceNotRecovering"

func newServiceNotRecovering(env *Env) (Check, error) {
	c := env.Config.Checks.ServiceNotRecovering
	units := c.WorkerUnits
	if env.Role == report.RoleControlPlane {
		units = c.ControlPlaneUnits
	}
	w := env.Units
	if w == nil {
		w = NewUnitWatch(nil, nil)
	}
	return &serviceNotRecovering{env: env, units: units, threshold: c.RestartThreshold, watch: w}, nil
}

// ServiceState is one unit in the services report domain.
type ServiceState struct {
	systemd.Unit
	Repair *RepairStatus `json:"repair,omitempty"`
	// NotRecovering: the check's True names it, failed or not (restarted
	// threshold times since the last run, or repaired as often in a row
	// without help); set by Probe, not in the report: Problem.
	NotRecovering bool `json:"-"`
}

// Problem reports whether the unit is one the condition names: failed,
// flapping or not helped by its repairs. Its entry is kept when the list
// is cut, though a flapping unit is active again.
func (s ServiceState) Problem() bool { return s.Unit.Problem() || s.NotRecovering }

var errNoSystemd = errors.New("systemd is not reachable over D-Bus")

func (c *serviceNotRecovering) Probe(ctx context.Context) (Result, error) {
	if c.env.Systemd == nil {
		return Result{}, errNoSystemd
	}
	var failed, flapping, notHelping, notes []string
	var states []ServiceState
	// The flapping marks move only once the run has looked at every unit.
	marks := map[string]uint64{}
	units, err := systemd.UnitsOf(ctx, c.env.Systemd, c.units...)
	if err != nil {
		return Result{}, err
	}
	for _, u := range units {
		name := u.Name
		c.watch.Observe(u)
		if u.LoadState == "not-found" {
			notes = append(notes, name+" is not installed")
			if u.ActiveState != "failed" {
				states = append(states, ServiceState{Unit: u})
				continue
			}
			// Failed, and its unit file removed since (systemctl
			// daemon-reload): systemd keeps it failed (systemctl
			// --failed lists it) until a reset-failed; it is failed.
		}
		// A failed read is lasting, whatever the unit's Restart=: systemd
		// sets failed and then auto-restart (failed-before-auto-restart
		// and auto-restart from 254) in one step of its one thread, and
		// answers a read only between such steps, so no read sees the
		// failed a unit passes through before an automatic restart (only
		// a PropertiesChanged signal tells it). A unit read failed is one
		// systemd will not restart on its own: its start limit hit (252
		// keeps the last run's result, exit-code, not start-limit-hit), a
		// result its Restart= does not restart, a stop that ended failed
		// (TestFailedIsNeverSeenBeforeAnAutomaticRestart in tests/).
		// But one with a start job is coming back: a restart whose stop
		// ended failed, read before its start half ran (ComingBack).
		st := ServiceState{Unit: u}
		if u.ActiveState == "failed" && !u.ComingBack() {
			failed = append(failed, fmt.Sprintf("%s is failed (%s)", name, u.Result))
		} else if c.env.Repair != nil {
			// Failed, and left inactive by the repair's reset-failed
			// before a restart that did not start it (refused:
			// RefuseManualStart=, a unit it requires masked).
			if res, ok := c.env.Repair.HidFailed(u); ok {
				msg := fmt.Sprintf("%s is failed (%s), left inactive by the repair's reset-failed before a restart that did not start it", name, res)
				if why := startNotMade(u); why != "" {
					msg += " (" + why + ")"
				}
				failed = append(failed, msg)
				st.NotRecovering = true
			}
		}
		n, auto := c.watch.PendingAuto(snrMark, name)
		marks[name] = auto
		if n >= uint64(max(c.threshold, 1)) {
			flapping = append(flapping, fmt.Sprintf("%s restarted %d times since the last check", name, n))
			st.NotRecovering = true
		}
		if c.env.Repair != nil {
			rs := c.env.Repair.Status(name)
			st.Repair = &rs
			if rs.Consecutive >= c.threshold {
				// The threshold, not the count: the count grows by one at
				// every restart (every cooldown, 1 min for kubelet) for as
				// long as the unit stays unhealthy, and in the message it
				// changed the condition, and so the Node's status, at every
				// run. The count is in the services report (repair).
				msg := fmt.Sprintf("%s was repaired %d+ times in a row and is still unhealthy", name, c.threshold)
				if why := startNotMade(u); why != "" && u.ActiveState == "inactive" {
					// Its restarts start nothing until the file, mount
					// or path its unit file names is there.
					msg += " (" + why + ")"
				}
				notHelping = append(notHelping, msg)
				st.NotRecovering = true
			}
		}
		states = append(states, st)
	}
	for name, auto := range marks {
		c.watch.MarkAuto(snrMark, name, auto)
	}
	details := []report.Detail{{Domain: "services", Field: "services", Value: states}}
	note := ""
	if len(notes) > 0 {
		note = " (" + strings.Join(notes, ", ") + ")"
	}
	all := append(append(append([]string{}, failed...), flapping...), notHelping...)
	switch {
	case len(failed) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonUnitFailed, Message: strings.Join(all, "; ") + note, Details: details}, nil
	case len(flapping) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonUnitFlapping, Message: strings.Join(all, "; ") + note, Details: details}, nil
	case len(notHelping) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonRepairNotHelping, Message: strings.Join(all, "; ") + note, Details: details}, nil
	case len(notes) == len(c.units):
		// Not one critical unit is installed (or none is configured):
		// nothing was watched, so this is not a healthy False.
		msg := "no critical units configured for role " + string(c.env.Role)
		if len(notes) > 0 {
			msg = "none of the critical units is installed: " + strings.Join(c.units, ", ")
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck, Message: msg, Details: details}, nil
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonCriticalUnitsRecovering,
		Message: fmt.Sprintf("%s: none failed or restarted %d+ times since the last check%s", strings.Join(c.units, ", "), c.threshold, note), Details: details}, nil
}
