package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/syself/autopilot-health/report"
)

// statusLoop keeps systemd's STATUS= line current, from the start (the
// first pass's line carries the notes too: StatusLine).
// The store's next change is waited for from before the line is
// computed: a change that comes while a line is computed and sent wakes
// the loop again (taken after the send, it was left out: the line of the
// change before it stayed on systemctl status until another change).
func (d *Daemon) statusLoop(ctx context.Context) {
	changed := d.store.Changed()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-d.statusWake: // the metrics listener bound, or failed anew; a state write blocked, or returned
		}
		changed = d.store.Changed()
		d.sendStatus()
	}
}

// sendStatus sends the status line (StatusLine) when it is not the last
// one sent here: computed and sent under one lock, so that a line computed
// earlier is never sent after a later one.
func (d *Daemon) sendStatus() {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	if s := d.StatusLine(); s != d.lastStatus {
		d.tell(func(n Notifier) error { return n.Status(s) })
		d.lastStatus = s
	}
}

// sendReady sends READY=1 with the status line (the start's, a reload's
// end), computed and sent under sendStatus's lock as sendStatus sends
// one: a line computed before a change the status loop sent meanwhile is
// never sent after it, and the status loop knows the line systemd has.
func (d *Daemon) sendReady() error {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	s := d.StatusLine()
	err := d.tell(func(n Notifier) error { return n.Ready(s) })
	if err == nil {
		d.lastStatus = s
	}
	return err
}

// Summary is the one-line status, e.g.
// "24 conditions: 23 ok, 1 problem (DiskUsageHigh)".
func (d *Daemon) Summary() string { return Summarize(d.store.All()) }

// Summarize formats conditions as the one-line status.
func Summarize(conds []report.Condition) string {
	var ok int
	var problems, failing, unknown []string
	for _, c := range conds {
		switch {
		case c.Status == report.StatusFalse:
			ok++
		case c.Status == report.StatusTrue:
			problems = append(problems, c.Type)
		case slices.Contains(checkFailures, c.Reason):
			failing = append(failing, c.Type)
		default:
			unknown = append(unknown, c.Type)
		}
	}
	slices.Sort(problems)
	slices.Sort(failing)
	slices.Sort(unknown)
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s: %d ok, %d %s", len(conds), plural(len(conds), "condition", "conditions"), ok, len(problems), plural(len(problems), "problem", "problems"))
	if len(problems) > 0 {
		fmt.Fprintf(&b, " (%s)", shortList(problems, 5))
	}
	// A check that fails is told apart from one with nothing to check
	// or still waiting, which a healthy node has too (SealedOSTampered's
	// NothingToCheck where no layer is sealed).
	if len(failing) > 0 {
		fmt.Fprintf(&b, ", %d %s (%s)", len(failing), plural(len(failing), "check failing", "checks failing"), shortList(failing, 3))
	}
	if len(unknown) > 0 {
		fmt.Fprintf(&b, ", %d unknown (%s)", len(unknown), shortList(unknown, 3))
	}
	return b.String()
}

// checkFailures are the reasons of a condition whose check failed, timed
// out or panicked (the runner's), not one that had nothing to decide.
var checkFailures = []report.Reason{report.ReasonCheckFailed, report.ReasonCheckTimeout, report.ReasonCheckPanicked}

// shortList joins up to n names and counts the rest, keeping the status line short.
func shortList(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, +%d more", strings.Join(names[:n], ", "), len(names)-n)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
