package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/kmsg"
)

func cmdKmsg(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "replay" && args[0] != "rules") {
		return printUsage(len(args) > 0 && (args[0] == "--help" || args[0] == "-h"),
			"Usage: autopilot-health kmsg replay [--json] [--config FILE] FILE|-\n       autopilot-health kmsg rules [--config FILE]\n", stdout, stderr)
	}
	sub := args[0]
	fs := newFlags("kmsg "+sub, map[string]string{"replay": "kmsg replay [--json] [--config FILE] FILE|-", "rules": "kmsg rules [--config FILE]"}[sub], stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML) with custom kmsg rules; the default path may be absent")
	// --json is replay's alone: rules prints a table, and a --json it
	// ignored would hand jq that table.
	asJSON := new(bool)
	if sub == "replay" {
		asJSON = fs.Bool("json", false, "one JSON object per line for each action")
	}
	if code := parseFlags(fs, args[1:], stdout); code >= 0 {
		return code
	}
	if sub == "rules" && fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health kmsg rules: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	cfg, _, err := loadConfig(*cfgPath, flagSet(fs, "config"))
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health kmsg: %v\n", err)
		return exitError
	}
	if sub == "rules" {
		opts, err := daemon.KmsgOptions(cfg, &checks.Env{Config: cfg}, nil, nil)
		if err != nil {
			fmt.Fprintf(stderr, "autopilot-health kmsg: %v\n", err)
			return exitError
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RULE\tKIND\tCONDITION\tREASON\tPATTERN")
		for _, r := range opts.Rules.Rules() {
			pattern := r.Pattern
			if r.Kind == kmsg.PodVolume {
				pattern = "(none: a ReadonlyFilesystem line on a pod's volume)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.Kind, r.Condition, r.Reason, pattern)
		}
		tw.Flush()
		return exitOK
	}
	// The same kernel log monitor as the daemon's (Assemble), as a GPU node
	// so GPU rules show; it logs nothing.
	parts, err := daemon.Assemble(cfg, slog.New(slog.DiscardHandler), daemon.AssembleOptions{Purpose: daemon.ForReplay})
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health kmsg: %v\n", err)
		return exitError
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "Usage: autopilot-health kmsg replay [--json] [--config FILE] FILE|-")
		return exitError
	}
	in := io.Reader(os.Stdin)
	if name := fs.Arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintf(stderr, "autopilot-health kmsg replay: %v\n", err)
			return exitError
		}
		defer f.Close()
		in = f
	}
	enc := json.NewEncoder(stdout)
	// The table is flushed every replayFlushRows rows or replayFlushBytes
	// bytes: a tabwriter holds every row until it is flushed, so a capture
	// of millions of matching lines would be held whole in memory, and
	// nothing printed until its end. Columns line up within each block.
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	rows, pending := 0, 0
	st, err := kmsg.Replay(in, parts.Kmsg, func(a kmsg.Action) {
		if *asJSON {
			enc.Encode(a)
			return
		}
		var n int
		if a.Kind == "condition" {
			n, _ = fmt.Fprintf(tw, "condition\t%s=%s\t%s\t%s\n", a.Type, a.Status, a.Reason, a.Message)
		} else {
			n, _ = fmt.Fprintf(tw, "event\t\t%s\t%s\n", a.Reason, a.Message)
		}
		if rows, pending = rows+1, pending+n; rows >= replayFlushRows || pending >= replayFlushBytes {
			tw.Flush()
			rows, pending = 0, 0
		}
	})
	tw.Flush()
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health kmsg replay: %v\n", err)
		return exitError
	}
	if !*asJSON {
		forms := make([]string, len(st.Forms))
		for i, f := range st.Forms {
			forms[i] = string(f)
		}
		read := fmt.Sprintf("%d lines read", st.Lines)
		if len(forms) > 0 {
			read += " (" + strings.Join(forms, "; ") + ")"
		}
		fmt.Fprintf(stderr, "%s, %d skipped, %d actions\n", read, st.Skipped, st.Matched)
	}
	if st.Unknown > 0 {
		// Also with --json: these lines were not matched at all.
		fmt.Fprintf(stderr, "%d lines in an unknown format, first: %s\n", st.Unknown, st.FirstUnknown)
	}
	return exitOK
}

// The most rows and bytes of the replay's table held before it is written.
const (
	replayFlushRows  = 256
	replayFlushBytes = 64 << 10
)
