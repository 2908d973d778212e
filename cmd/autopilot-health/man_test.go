package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

var spaces = regexp.MustCompile(`\s+`)

// renderMan renders the page with man-db as a reader sees it (one line per
// paragraph: no hyphenation, no justification), whitespace collapsed.
func renderMan(t *testing.T, page string) string {
	t.Helper()
	if _, err := exec.LookPath("man"); err != nil {
		testenv.Skip(t, "man not installed (apt install man-db)")
	}
	f := filepath.Join(t.TempDir(), "autopilot-health.8")
	if err := os.WriteFile(f, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("man", "--warnings", "-E", "UTF-8", "-l", f)
	cmd.Env = append(os.Environ(), "MANWIDTH=2000", "LC_ALL=C.UTF-8", "MANPAGER=cat", "PAGER=cat")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("man -l: %v\n%s", err, stderr.String())
	}
	// Bold and italics as overstrikes (man without a pager keeps them off,
	// but col -b's job is cheap to do here).
	text := regexp.MustCompile(".\b").ReplaceAllString(string(out), "")
	return spaces.ReplaceAllString(text, " ")
}

// helpOf is what "autopilot-health ARGS... --help" prints.
func helpOf(t *testing.T, words []string) string {
	t.Helper()
	code, out, errOut := run(t, append(append([]string{}, words...), "--help")...)
	if code != exitOK {
		t.Fatalf("%s --help: exit %d\n%s%s", strings.Join(words, " "), code, out, errOut)
	}
	return out + errOut
}

// commandWords are the leading command words of a usage synopsis.
func commandWords(syn string) []string {
	var w []string
	for _, f := range strings.Fields(syn) {
		if !regexp.MustCompile(`^[a-z]+$`).MatchString(f) {
			break
		}
		w = append(w, f)
	}
	return w
}

// TestManPageAgreesWithHelp renders the page with man and finds in it every
// command of the usage, every line of every command's --help (each column
// of it), every exit code, and every condition, reason and event of the
// catalog. man --warnings must not complain (lintian runs the same).
func TestManPageAgreesWithHelp(t *testing.T) {
	code, page, errOut := run(t, "man", "--date", "2026-01-02")
	if code != exitOK {
		t.Fatalf("man: exit %d: %s", code, errOut)
	}
	text := renderMan(t, page)
	has := func(what, s string) {
		t.Helper()
		if s = spaces.ReplaceAllString(strings.TrimSpace(s), " "); !strings.Contains(text, s) {
			t.Errorf("the man page lacks %s %q", what, s)
		}
	}
	has("the date", "2026-01-02")
	has("the version", "autopilot-health "+Version())

	_, top, _ := run(t, "--help")
	entries := regexp.MustCompile(`(?m)^  autopilot-health (\S.*?)(?:  +(\S.*))?$`).FindAllStringSubmatch(top, -1)
	if len(entries) < 5 {
		t.Fatalf("found %d commands in the usage:\n%s", len(entries), top)
	}
	for _, e := range entries {
		has("the synopsis", "autopilot-health "+e[1])
		if e[2] != "" {
			has("the command text", e[2])
		}
		words := commandWords(e[1])
		help := helpOf(t, words[:1])
		if len(words) > 1 {
			help = helpOf(t, words)
		}
		for _, line := range strings.Split(help, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "Usage:") || strings.HasPrefix(line, "autopilot-health ") {
				continue
			}
			for _, col := range regexp.MustCompile(`\t|  +`).Split(line, -1) {
				if col = strings.TrimSpace(col); strings.HasPrefix(col, "-") {
					col = "-" + col // flag prints -name; the page says --name as the usage does
				}
				has("from "+strings.Join(words, " ")+" --help", col)
			}
		}
	}
	// Each exit code whole, with the lines that continue its text.
	_, codes, _ := strings.Cut(top, "Exit codes:\n")
	for _, m := range regexp.MustCompile(`(?m)^  ([0-9])  (.*(?:\n     .*)*)$`).FindAllStringSubmatch(codes, -1) {
		has("the exit code", m[1]+" "+m[2])
	}
	for _, c := range report.Conditions {
		has("the condition", c.Type)
		has("the trigger of "+c.Type, c.Trigger)
		has("the healthy reason of "+c.Type, string(c.HealthyReason))
		has("the reasons of "+c.Type, report.JoinReasons(c.ProblemReasons, ", "))
		if len(c.UnknownReasons) > 0 {
			has("the Unknown reasons of "+c.Type, report.JoinReasons(c.UnknownReasons, ", "))
		}
	}
	has("the shared Unknown reasons", report.JoinReasons(report.UnknownReasons, ", "))
	for _, e := range report.Events {
		has("the event", e.Reason+" "+string(e.Source))
		has("the trigger of event "+e.Reason, e.Trigger)
	}
	// It is hidden: the usage does not list it.
	if regexp.MustCompile(`(?m)^  autopilot-health man\b`).MatchString(top) {
		t.Errorf("the usage lists the hidden man command:\n%s", top)
	}
}

// TestUsageSynopsesMatchCommandHelp: each command's line in the usage is
// one of the Usage lines of its own --help (the page shows both).
func TestUsageSynopsesMatchCommandHelp(t *testing.T) {
	_, top, _ := run(t, "--help")
	for _, e := range regexp.MustCompile(`(?m)^  autopilot-health (\S.*?)(?:  +\S.*)?$`).FindAllStringSubmatch(top, -1) {
		words := commandWords(e[1])
		if words[0] == "config" { // one --help for both subcommands, as "config default | config validate FILE"
			if help := helpOf(t, words[:1]); !strings.Contains(help, e[1]) {
				t.Errorf("usage says %q, config --help:\n%s", e[1], help)
			}
			continue
		}
		help := helpOf(t, words)
		found := false
		for _, line := range strings.Split(help, "\n") {
			line = strings.TrimSpace(strings.TrimPrefix(line, "Usage:"))
			found = found || line == "autopilot-health "+e[1]
		}
		if !found {
			t.Errorf("usage says %q, %s --help:\n%s", e[1], strings.Join(words, " "), help)
		}
	}
}

func TestManRejectsBadDate(t *testing.T) {
	if code, _, errOut := run(t, "man", "--date", "yesterday"); code != exitError || !strings.Contains(errOut, "want YYYY-MM-DD") {
		t.Errorf("man --date yesterday: exit %d, %q", code, errOut)
	}
	if code, _, _ := run(t, "man", "extra"); code != exitError {
		t.Errorf("man extra: exit %d", code)
	}
}

// TestUsageListsEveryREADMECommand: every command README's "Using it on a
// node" shows an operator is in the usage (and so in the manual page,
// which is made from it): `tamper layers` was missing from both.
func TestUsageListsEveryREADMECommand(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n## Using it on a node\n")
	section, _, _ = strings.Cut(section, "\n### ")
	var listed []string
	for _, c := range usageCommands() {
		listed = append(listed, strings.Join(commandWords(c.Synopsis), " "))
	}
	found := 0
	for _, m := range regexp.MustCompile(`(?m)(?:^\$ |sudo |\| )autopilot-health ([a-z]+(?: [a-z]+)*)`).FindAllStringSubmatch(section, -1) {
		found++
		if !slices.Contains(listed, m[1]) {
			t.Errorf("README shows `autopilot-health %s`; the usage does not list it (it lists %q)", m[1], listed)
		}
	}
	if found < 10 {
		t.Fatalf("found %d commands in README's \"Using it on a node\"", found)
	}
}
