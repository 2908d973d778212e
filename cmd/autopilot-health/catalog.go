package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

func cmdCatalog(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("catalog", "catalog [--markdown | --json]", stderr)
	md := fs.Bool("markdown", false, "print the README's Markdown tables")
	asJSON := fs.Bool("json", false, "print JSON")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health catalog: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	switch {
	case *asJSON:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"conditions": report.Conditions, "events": report.Events})
	case *md:
		io.WriteString(stdout, CatalogMarkdown())
	default:
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONDITION\tSOURCE\tDISPOSITION\tINTERVAL\tNODES\tREASONS (True)")
		for _, c := range report.Conditions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.Type, c.Source, c.Disposition, interval(c), c.Scope, report.JoinReasons(c.ProblemReasons, ","))
		}
		tw.Flush()
		fmt.Fprintln(stdout)
		tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "EVENT\tSOURCE\tNODES")
		for _, e := range report.Events {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Reason, e.Source, e.Scope)
		}
		tw.Flush()
	}
	return exitOK
}

func interval(c report.ConditionDesc) string {
	if c.Interval == 0 {
		return "on kernel line"
	}
	return config.ShortDuration(c.Interval)
}

// heldThroughFailures is the runner's rule for a True whose check fails
// (checks.maxHeldFailures), as the README's catalog and the man page say
// it, in Markdown.
func heldThroughFailures() string {
	var forever []string
	for _, c := range report.Conditions {
		if c.Source != report.SourceKmsg && c.Hold == report.HoldForever {
			forever = append(forever, "`"+c.Type+"`")
		}
	}
	return fmt.Sprintf("a condition a check evaluates that is `True` (but for %s, held forever) stays `True`, with its reason, message and transition time, "+
		"through up to 2 failed runs of its check in a row (an error, a timeout, a previous run not returned, a panic: the runner's `CheckFailed`, `CheckTimeout`, `CheckPanicked`); "+
		"the 3rd failed run in a row makes it `Unknown`, and a run that decides starts the count again", strings.Join(forever, " and "))
}

// CatalogMarkdown renders the catalog as the README's tables.
func CatalogMarkdown() string {
	var b strings.Builder
	b.WriteString("| Condition | Source | Disposition | Interval | Nodes | Reason when False | Reasons when True | Triggered when |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range report.Conditions {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | `%s` | %s | %s |\n", c.Type, c.Source, c.Disposition, interval(c), c.Nodes(),
			c.HealthyReason, "`"+report.JoinReasons(c.ProblemReasons, "`, `")+"`", c.Trigger)
	}
	b.WriteString("\n| Event reason | Source | Nodes | Emitted when |\n| --- | --- | --- | --- |\n")
	for _, e := range report.Events {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", e.Reason, e.Source, e.Scope, e.Trigger)
	}
	fmt.Fprintf(&b, "\nWhile a condition cannot be evaluated its status is `Unknown` with one of the reasons %s, except that %s (`TestRunnerHoldsATrueThroughTwoFailedRuns`, `TestRunnerHoldsATrueThroughAStuckProbe`).\n",
		"`"+report.JoinReasons(report.UnknownReasons, "`, `")+"`", heldThroughFailures())
	for _, c := range report.Conditions {
		if len(c.UnknownReasons) > 0 {
			fmt.Fprintf(&b, "`%s` is also `Unknown` with %s.\n", c.Type, "`"+report.JoinReasons(c.UnknownReasons, "`, `")+"`")
		}
	}
	return b.String()
}
