package checks

import (
	"fmt"
	"slices"

	"github.com/syself/autopilot-health/report"
)

// PlanState says what the runner does with a condition on this node.
type PlanState string

const (
	Scheduled      PlanState = "scheduled"
	Disabled       PlanState = "disabled"
	NotApplicable  PlanState = "not-applicable"
	NotImplemented PlanState = "not-implemented"
	// Elsewhere: evaluated by another part of the daemon (the kernel monitor).
	Elsewhere PlanState = "elsewhere"
)

// Planned is one catalog condition and what happens to it here.
type Planned struct {
	Desc  report.ConditionDesc
	State PlanState
	// Placeholder is the condition reported while the condition is not
	// scheduled (status Unknown with a reason saying why).
	Placeholder report.Condition
}

// Plan decides, for every condition of the catalog, whether this node runs
// it. only, when not empty, restricts the plan to those condition types.
// external lists the conditions that another part of the daemon (the kernel
// log monitor) evaluates on this node.
func Plan(env *Env, only, external []string) []Planned { return plan(env, only, external, registry) }

func plan(env *Env, only, external []string, factories map[string]Factory) []Planned {
	var out []Planned
	for _, d := range report.Conditions {
		if len(only) > 0 && !slices.Contains(only, d.Type) {
			continue
		}
		p := Planned{Desc: d}
		com, hasCfg := env.Config.Checks.Common(d.Type)
		switch {
		case !d.Scope.Applies(env.Role, env.GPU):
			p.State = NotApplicable
			p.Placeholder = unknown(d.Type, report.ReasonNotApplicable, scopeText(d.Scope))
		case d.Source == report.SourceKmsg:
			if slices.Contains(external, d.Type) {
				p.State = Elsewhere
			} else {
				p.State = Disabled
				p.Placeholder = unknown(d.Type, report.ReasonDisabled, "the kernel log monitor is disabled (kmsg.enabled = false)")
			}
		case hasCfg && !com.Enabled && slices.Contains(external, d.Type):
			p.State = Elsewhere
		case hasCfg && !com.Enabled:
			p.State = Disabled
			p.Placeholder = unknown(d.Type, report.ReasonDisabled, fmt.Sprintf("disabled in the configuration (checks.%s.enabled = false)", d.Type))
		case factories[d.Type] == nil && slices.Contains(external, d.Type):
			p.State = Elsewhere
		case factories[d.Type] == nil:
			p.State = NotImplemented
			p.Placeholder = unknown(d.Type, report.ReasonNotImplemented, "this check is not implemented yet")
		default:
			p.State = Scheduled
		}
		out = append(out, p)
	}
	return out
}

func unknown(t string, reason report.Reason, msg string) report.Condition {
	return report.Condition{Type: t, Status: report.StatusUnknown, Reason: reason, Message: msg}
}

func scopeText(s report.Scope) string {
	switch s {
	case report.ScopeControlPlane:
		return "applies to control plane nodes only"
	case report.ScopeWorker:
		return "applies to worker nodes only"
	case report.ScopeGPU:
		return "applies to GPU nodes only"
	}
	return ""
}
