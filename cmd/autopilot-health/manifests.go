package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/syself/autopilot-health/internal/manifests"
)

func cmdManifests(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("manifests", "manifests [--list | KIND]", stderr)
	list := fs.Bool("list", false, "list the kinds and the file each is shipped as under packaging/manifests")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if *list && fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health manifests: unexpected argument %q: --list takes none\n", fs.Arg(0))
		return exitError
	}
	if *list || fs.NArg() == 0 {
		out := stdout
		if !*list {
			out = stderr
			fmt.Fprintln(stderr, "autopilot-health manifests: name a KIND:")
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tFILE\tWHAT")
		for _, m := range manifests.All {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Kind, m.File, m.Help)
		}
		tw.Flush()
		if !*list {
			return exitError
		}
		return exitOK
	}
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "autopilot-health manifests: one KIND at a time, got %d\n", fs.NArg())
		return exitError
	}
	m, ok := manifests.Lookup(fs.Arg(0))
	if !ok {
		fmt.Fprintf(stderr, "autopilot-health manifests: unknown kind %q (see --list)\n", fs.Arg(0))
		return exitError
	}
	b, err := m.Render()
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health manifests: %s: %v\n", m.Kind, err)
		return exitError
	}
	stdout.Write(b)
	return exitOK
}
