package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

// checkRow is one line of `check` output.
type checkRow struct {
	Type        string             `json:"type"`
	Status      report.Status      `json:"status"`
	Reason      report.Reason      `json:"reason"`
	Message     string             `json:"message"`
	Disposition report.Disposition `json:"disposition"`
	Source      report.Source      `json:"source"`
	State       checks.PlanState   `json:"state"`
}

type checkOutput struct {
	Node       string      `json:"node"`
	Role       report.Role `json:"role"`
	GPU        bool        `json:"gpu"`
	Summary    string      `json:"summary"`
	Conditions []checkRow  `json:"conditions"`
	// Report is the health report the checks of this run collected, one
	// document per domain (storage, disks, ...), as the daemon writes them
	// to the Node's annotations.
	Report map[string]json.RawMessage `json:"report"`
}

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check", "check [--config FILE] [--json] [--only NAME,...]", stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML); the default path may be absent")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	only := fs.String("only", "", "comma-separated condition types to check (default: all)")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health check: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	var onlyList []string
	for _, n := range strings.Split(*only, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if _, ok := report.Lookup(n); !ok {
			fmt.Fprintf(stderr, "autopilot-health check: --only: unknown condition %q%s\n", n, validConditions(n))
			return exitError
		}
		onlyList = append(onlyList, n)
	}
	if len(onlyList) == 0 && flagSet(fs, "only") {
		// Not every check: that is --only left out.
		fmt.Fprintf(stderr, "autopilot-health check: --only %q names no condition: name one, or leave the flag out for every check\n", *only)
		return exitError
	}
	cfg, _, err := loadConfig(*cfgPath, flagSet(fs, "config"))
	if err == nil {
		err = daemon.HostRootRefuses(cfg, *cfgPath)
	}
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health check: %v\n", err)
		return exitError
	}
	// Checks log to stderr, warnings and up, so stdout stays the result.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	parts, err := daemon.Assemble(cfg, log, daemon.AssembleOptions{Purpose: daemon.ForCheck, Only: onlyList})
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health check: %v\n", err)
		return exitError
	}
	env, store := parts.Env, parts.Store
	if mon := parts.Kmsg; mon != nil {
		// The kernel conditions from the records of this boot still in the
		// ring buffer.
		mon.Start(time.Now(), kmsg.BootWall())
		if _, scanErr := kmsg.Scan(cfg.HostPath(cfg.Kmsg.Device), mon); scanErr != nil {
			mon.Blind(scanErr, time.Now())
		}
	}
	parts.Runner.RunOnce(context.Background())

	out := checkOutput{Node: env.NodeName, Role: env.Role, GPU: env.GPU}
	var all []report.Condition
	problem := false
	for _, p := range checks.Plan(env, onlyList, parts.External()) {
		c := p.Placeholder
		if p.State == checks.Scheduled || p.State == checks.Elsewhere {
			c, _ = store.Get(p.Desc.Type)
		}
		all = append(all, c)
		problem = problem || c.Status == report.StatusTrue
		out.Conditions = append(out.Conditions, checkRow{Type: p.Desc.Type, Status: c.Status, Reason: c.Reason,
			Message: c.Message, Disposition: p.Desc.Disposition, Source: p.Desc.Source, State: p.State})
	}
	out.Summary = daemon.Summarize(all)
	if *asJSON {
		docs, err := parts.Details.Documents(time.Now(), env.Role)
		if err != nil {
			// The failing domain carries an error document.
			fmt.Fprintf(stderr, "autopilot-health check: %v\n", err)
		}
		out.Report = make(map[string]json.RawMessage, len(docs))
		for k, v := range docs {
			out.Report[strings.TrimPrefix(k, report.AnnotationPrefix)] = json.RawMessage(v)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	} else {
		fmt.Fprintf(stdout, "node %s, role %s, gpu %t\n\n", out.Node, out.Role, out.GPU)
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONDITION\tSTATUS\tREASON\tDISPOSITION\tMESSAGE")
		for _, r := range out.Conditions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Type, r.Status, r.Reason, r.Disposition, r.Message)
		}
		tw.Flush()
		fmt.Fprintf(stdout, "\n%s\n", out.Summary)
	}
	if problem {
		return exitProblem
	}
	return exitOK
}

// validConditions says what --only takes instead of name: the condition
// it spells in another case, or else every condition of the catalog.
func validConditions(name string) string {
	types := make([]string, len(report.Conditions))
	for i, c := range report.Conditions {
		if strings.EqualFold(c.Type, name) {
			return ": did you mean " + c.Type + "?"
		}
		types[i] = c.Type
	}
	return "; the conditions are: " + strings.Join(types, ", ")
}

// flagSet reports whether the flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
