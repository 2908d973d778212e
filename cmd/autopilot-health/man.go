package main

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// cmdMan prints the manual page autopilot-health(8) in roff. It is hidden
// (not in the usage): packaging/deb/build.sh runs it to ship the page, so
// the page is generated from the usage, each command's --help and the
// condition catalog of the very binary it documents and cannot drift.
func cmdMan(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("man", "man [--date YYYY-MM-DD]", stderr)
	date := fs.String("date", "", "the page's date (the package passes its SOURCE_DATE_EPOCH)")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health man: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	if *date != "" && !regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`).MatchString(*date) {
		fmt.Fprintf(stderr, "autopilot-health man: --date %q: want YYYY-MM-DD\n", *date)
		return exitError
	}
	io.WriteString(stdout, ManPage(*date))
	return exitOK
}

// usageCommand is one command of the usage: its synopsis (without the
// program name) and what it does.
type usageCommand struct {
	Synopsis, Text string
}

// usageCommands parses the usage's command list: an entry starts with
// "  autopilot-health " and its synopsis and text are set apart by two or
// more spaces, or the text is on the next, indented line.
func usageCommands() []usageCommand {
	var cmds []usageCommand
	in := false
	for _, line := range strings.Split(usage, "\n") {
		switch {
		case line == "Usage:":
			in = true
			continue
		case !in:
			continue
		case strings.TrimSpace(line) == "":
			return cmds
		}
		if rest, ok := strings.CutPrefix(line, "  autopilot-health "); ok {
			syn, text, _ := strings.Cut(rest, "  ")
			cmds = append(cmds, usageCommand{Synopsis: strings.TrimSpace(syn), Text: strings.TrimSpace(text)})
		} else if n := len(cmds); n > 0 {
			cmds[n-1].Text = strings.TrimSpace(cmds[n-1].Text + " " + strings.TrimSpace(line))
		}
	}
	return cmds
}

// exitCodes parses the usage's "Exit codes:" block: code and meaning, a
// meaning's continuation lines (indented past the code) joined to it.
func exitCodes() [][2]string {
	_, block, _ := strings.Cut(usage, "Exit codes:\n")
	var codes [][2]string
	for _, line := range strings.Split(block, "\n") {
		code, text, ok := strings.Cut(strings.TrimSpace(line), "  ")
		switch {
		case strings.TrimSpace(line) == "":
		case ok && !strings.HasPrefix(line, "   "):
			codes = append(codes, [2]string{code, strings.TrimSpace(text)})
		case len(codes) > 0:
			codes[len(codes)-1][1] += " " + strings.TrimSpace(line)
		}
	}
	return codes
}

// commandHelp returns what "autopilot-health WORDS... --help" prints, for
// the leading lower-case words of a synopsis ("kmsg replay", "config
// default"). Where the command's subcommand does not take --help it falls
// back to the command's own.
func commandHelp(syn string) string {
	var words []string
	for _, w := range strings.Fields(syn) {
		if !regexp.MustCompile(`^[a-z]+$`).MatchString(w) {
			break
		}
		words = append(words, w)
	}
	for n := len(words); n > 0; n-- {
		var out bytes.Buffer
		if Main(append(append([]string{}, words[:n]...), "--help"), &out, &out) == exitOK &&
			strings.HasPrefix(out.String(), "Usage: autopilot-health "+words[0]) {
			return out.String()
		}
	}
	return ""
}

// helpItems are the lines of a --help text after its "Usage:" lines: a flag
// of flag.PrintDefaults ("  -name type" and its indented text), a "name
// text" row, or a sentence.
type helpItem struct {
	Term, Text string
}

func helpItems(help string) []helpItem {
	var items []helpItem
	for _, line := range strings.Split(help, "\n") {
		switch {
		case strings.TrimSpace(line) == "", strings.HasPrefix(line, "Usage: "), strings.HasPrefix(line, "       autopilot-health "):
		case strings.HasPrefix(line, "    \t"):
			if n := len(items); n > 0 {
				items[n-1].Text = strings.TrimSpace(items[n-1].Text + " " + strings.TrimSpace(line))
			}
		case strings.HasPrefix(line, "  -"):
			name, typ, _ := strings.Cut(strings.TrimSpace(line), " ")
			name, text, _ := strings.Cut(name, "\t") // a bool flag with a short text keeps it on the line
			term := "-" + name
			if typ = strings.TrimSpace(typ); typ != "" {
				term += " " + typ
			}
			items = append(items, helpItem{Term: term, Text: strings.TrimSpace(text)})
		default:
			term, text, ok := strings.Cut(strings.TrimSpace(line), "  ")
			if !ok {
				term, text = "", term
			}
			items = append(items, helpItem{Term: term, Text: strings.TrimSpace(text)})
		}
	}
	return items
}

// roff escapes text for a roff line: backslashes, minus signs, and a
// leading dot or quote that would start a request.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// ManPage renders autopilot-health(8); date is the page's date (may be "").
func ManPage(date string) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	title, _, _ := strings.Cut(usage, "\n")
	_, title, _ = strings.Cut(title, ": ")
	title = strings.TrimSuffix(title, ".")

	p(`.\" Generated by "autopilot-health man" from its usage, each command's --help`)
	p(`.\" and the condition catalog; do not edit.`)
	p(`.TH AUTOPILOT\-HEALTH 8 "%s" "autopilot\-health %s" "System Administration"`, date, roff(Version()))
	p(".SH NAME")
	p(`autopilot\-health \- %s`, roff(title))
	p(".SH SYNOPSIS")
	cmds := usageCommands()
	for i, c := range cmds {
		if i > 0 {
			p(".br")
		}
		p(`.B autopilot\-health`)
		p("%s", roff(c.Synopsis))
	}
	p(".SH DESCRIPTION")
	p(`.B autopilot\-health`)
	p("runs on every node of a Kubernetes cluster as a systemd service outside Kubernetes")
	p("(%s), checks the node continuously and reports each problem as a", roff("autopilot-health.service"))
	p("NodeCondition on its Node, a one\\-shot Event and Prometheus metrics.")
	p("It repairs kubelet and containerd in place by restarting them over D\\-Bus.")
	p("It never cordons, drains, taints or deletes.")
	p(".SH COMMANDS")
	seen := map[string]bool{}
	for _, c := range cmds {
		p(".TP")
		p(`.B autopilot\-health %s`, roff(c.Synopsis))
		p("%s", roff(c.Text))
		help := commandHelp(c.Synopsis)
		if seen[help] {
			continue
		}
		seen[help] = true
		// A sentence that only repeats the summary above is left out.
		items := slices.DeleteFunc(helpItems(help), func(it helpItem) bool { return it.Term == "" && it.Text == c.Text })
		if len(items) == 0 {
			continue
		}
		p(".RS")
		for _, it := range items {
			if it.Term == "" {
				p(".PP")
				p("%s", roff(it.Text))
				continue
			}
			p(".TP")
			p(".B %s", roff(it.Term))
			p("%s", roff(it.Text))
		}
		p(".RE")
	}
	p(".SH CONDITIONS")
	p("Each condition is a NodeCondition the daemon owns: status True while the problem lasts, False with its")
	p("healthy reason, Unknown while it cannot be evaluated. Source, disposition, interval and the nodes it applies to")
	p("follow the name.")
	for _, c := range report.Conditions {
		p(".TP")
		p(".B %s", roff(c.Type))
		p("%s", roff(fmt.Sprintf("%s, %s, %s, %s nodes.", c.Source, c.Disposition, interval(c), c.Scope)))
		if c.Evaluated != "" && c.Evaluated != c.Scope {
			p("%s", roff(fmt.Sprintf("Evaluated on %s nodes only; Unknown on the others.", c.Evaluated)))
		}
		p("%s", roff("True when "+strings.TrimSuffix(c.Trigger, ".")+"."))
		p("%s", roff(fmt.Sprintf("Reasons when True: %s; when False: %s.", report.JoinReasons(c.ProblemReasons, ", "), c.HealthyReason)))
		if len(c.UnknownReasons) > 0 {
			p("%s", roff(fmt.Sprintf("Also Unknown with %s.", report.JoinReasons(c.UnknownReasons, ", "))))
		}
	}
	p(".PP")
	p("%s", roff(fmt.Sprintf("While a condition cannot be evaluated its status is Unknown with one of the reasons %s, except that %s.",
		report.JoinReasons(report.UnknownReasons, ", "), strings.ReplaceAll(heldThroughFailures(), "`", ""))))
	p(".SH EVENTS")
	for _, e := range report.Events {
		p(".TP")
		p(".B %s", roff(e.Reason))
		p("%s", roff(fmt.Sprintf("%s, %s nodes.", e.Source, e.Scope)))
		p("%s", roff("Emitted when "+strings.TrimSuffix(e.Trigger, ".")+"."))
	}
	p(".SH EXIT STATUS")
	for _, ec := range exitCodes() {
		p(".TP")
		p(".B %s", roff(ec[0]))
		p("%s", roff(ec[1]))
	}
	p(".SH FILES")
	p(".TP")
	p(".I %s", roff(config.DefaultPath))
	p("The configuration (TOML). Every key is optional;")
	p(`.B autopilot\-health config default`)
	p("prints each with its default.")
	p(".TP")
	p(`.I /usr/lib/systemd/system/autopilot\-health.service`)
	p("The unit; enabled by")
	p(`.IR /usr/lib/systemd/system\-preset/80\-autopilot\-health.preset .`)
	p(".TP")
	p(`.I /var/lib/autopilot\-health`)
	p("The local state (the unit's StateDirectory), kept when the package is removed, deleted when it is purged.")
	p(".SH SEE ALSO")
	p(".BR systemctl (1),")
	p(".BR journalctl (1),")
	p(".BR systemd.service (5)")
	return b.String()
}
