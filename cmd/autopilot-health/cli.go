package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
)

// Exit codes.
const (
	exitOK      = 0 // success; for check: no condition is True
	exitProblem = 1 // check, status: a condition is True; run: failed while running; reload, tamper: see the usage
	exitError   = 2 // bad usage, bad configuration, or the command could not run
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

const usage = `autopilot-health: the Syself Autopilot node health daemon.

Usage:
  autopilot-health run [--config FILE] [--privileged-helper SOCKET]
                                                  run the daemon (under systemd; the helper
                                                  autopilot-health-privileged does what needs privileges)
  autopilot-health check [--config FILE] [--json] [--only NAME,...]
                                                  run every enabled check once on this host
  autopilot-health kmsg replay [--json] [--config FILE] FILE|-
                                                  what the daemon would do for captured kernel log lines
  autopilot-health kmsg rules [--config FILE]     list the kernel log rules in effect
  autopilot-health status [--json] [--config FILE] [--socket PATH]
                                                  what the running daemon believes now (asks it; probes nothing)
  autopilot-health reload [--config FILE] [--socket PATH]
                                                  read the configuration again in the running daemon
                                                  and wait for the outcome (root; systemctl reload)
  autopilot-health tamper clear --reason TEXT [--config FILE] [--socket PATH]
                                                  clear the tamper conditions on the running daemon (root)
  autopilot-health tamper status [--config FILE]  print the daemon's tamper baseline and findings
  autopilot-health tamper layers [--config FILE]  print the verity root hashes the kernel enforces (root)
  autopilot-health catalog [--markdown | --json]  list every condition and event the daemon owns
  autopilot-health config default                 print the default configuration, every key set, with a comment
  autopilot-health config validate [--privileged-helper SOCKET] FILE
                                                  validate a configuration file (with the flag, as the unit's run loads it)
  autopilot-health config refused-changed [--state-dir DIR]
                                                  exit 0 when the file run last refused changed since
                                                  (autopilot-health-refused.service, the unit's OnFailure=)
  autopilot-health manifests [--list | KIND]      print the shipped alert rules, MachineHealthChecks,
                                                  remediation templates or Grafana dashboard
  autopilot-health version                        print the version

Run "autopilot-health COMMAND --help" for a command's flags.

Exit codes:
  0  success; for check and status: no condition is True
  1  check, status: at least one condition is True; run: the daemon could not start (not for its
     configuration: another daemon holds the control socket or the state directory, the node not
     detected, an I/O error reading the file) or failed while running;
     reload: the daemon refused the file and runs on with the previous configuration;
     tamper clear: applied, but not saved or not re-evaluated within 30s;
     tamper status: tamper.json cannot be read or does not parse;
     config refused-changed: the file run refused is unchanged since, none was refused, or the record of
     the refusal cannot be read (not a regular file, over 64 KiB), is not one run writes, or is one of
     another start of the daemon's unit than its last (named on stderr)
  2  bad usage, bad configuration, or the command could not run (status, reload, tamper clear: the
     daemon is not running (or still starting; reload, tamper clear: or stopping), runs without its
     socket (its file removed and not bound again), did not answer in time (reload, tamper clear:
     still starting or hung; the request not applied), or its socket refused the caller, not root;
     run: refused its flags or configuration file, which its unit does not restart on: the file's next
     change starts it)
`

// Main runs the command line and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return printUsage(false, usage, stdout, stderr)
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(rest, stdout, stderr)
	case "check":
		return cmdCheck(rest, stdout, stderr)
	case "kmsg":
		return cmdKmsg(rest, stdout, stderr)
	case "status":
		return cmdStatus(rest, stdout, stderr)
	case "reload":
		return cmdReload(rest, stdout, stderr)
	case "tamper":
		return cmdTamper(rest, stdout, stderr)
	case "catalog":
		return cmdCatalog(rest, stdout, stderr)
	case "config":
		return cmdConfig(rest, stdout, stderr)
	case "manifests":
		return cmdManifests(rest, stdout, stderr)
	case "version", "--version":
		fs := newFlags("version", "version", stderr)
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), "Usage: autopilot-health version\n  print the version and the Go version it was built with")
		}
		if code := parseFlags(fs, rest, stdout); code >= 0 {
			return code
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "autopilot-health version: unexpected argument %q\n", fs.Arg(0))
			return exitError
		}
		fmt.Fprintf(stdout, "autopilot-health %s (%s)\n", Version(), runtime.Version())
		return exitOK
	case "help", "-h", "--help":
		return printUsage(true, usage, stdout, stderr)
	case "man": // hidden: the manual page, for the package (man.go)
		return cmdMan(rest, stdout, stderr)
	}
	fmt.Fprintf(stderr, "autopilot-health: unknown command %q\n\n%s", cmd, usage)
	return exitError
}

// newFlags returns a flag set that prints its errors and usage to stderr
// and reports --help as flag.ErrHelp.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: autopilot-health %s\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// printUsage prints a command's usage text: asked for (--help), on stdout with
// exit 0, so it can be paged; after a missing or unknown subcommand, on
// stderr with exit 2.
func printUsage(asked bool, text string, stdout, stderr io.Writer) int {
	if asked {
		fmt.Fprint(stdout, text)
		return exitOK
	}
	fmt.Fprint(stderr, text)
	return exitError
}

// isHelp reports whether arg asks for the usage.
func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// parseFlags parses and maps the outcome to an exit code (-1: go on). The
// usage asked for with --help goes to stdout with exit 0, as the top-level
// help does, so "autopilot-health check --help | less" pages it; after a
// bad flag it goes to stderr with the error, and the exit is 2.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) int {
	stderr := fs.Output()
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	if err == nil && slices.ContainsFunc(fs.Args(), isHelp) {
		// After a positional argument ("manifests alerts --help"), where
		// the flag package stops reading flags: asked for all the same.
		fs.Usage()
		err = flag.ErrHelp
	}
	if err == nil {
		// A flag of this command after a positional argument, where the
		// flag package stops reading flags ("kmsg replay - --json"): named
		// as such, not left to be taken for a second FILE or KIND.
		if f, arg := flagAfterArgument(fs, args); f != "" {
			err = fmt.Errorf("autopilot-health %s: flag %s after the argument %q is not read as a flag: flags go before any argument", fs.Name(), f, arg)
			fmt.Fprintln(&out, err)
			fs.Usage()
		}
	}
	if err == nil {
		if name := emptyFlag(fs); name != "" {
			err = fmt.Errorf("autopilot-health %s: --%s is empty: give it a value, or leave the flag out for its default", fs.Name(), name)
			fmt.Fprintln(&out, err)
		}
	}
	fs.SetOutput(stderr)
	if errors.Is(err, flag.ErrHelp) {
		stdout.Write(out.Bytes())
		return exitOK
	}
	stderr.Write(out.Bytes())
	if err != nil {
		return exitError
	}
	return -1
}

// emptyJudged names the flags whose command refuses an empty value in
// words of its own ("command --flag").
var emptyJudged = map[string]bool{"tamper clear --reason": true}

// emptyFlag returns the first flag given an empty value (--socket "",
// --only=): bad usage, not its default taken silently (status asked the
// default socket, check ran every check, run went without its helper, man
// printed an undated page). No flag's empty value means anything its
// omission does not; "" when there is none.
func emptyFlag(fs *flag.FlagSet) string {
	name := ""
	fs.Visit(func(f *flag.Flag) {
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			return
		}
		if name == "" && f.Value.String() == "" && !emptyJudged[fs.Name()+" --"+f.Name] {
			name = f.Name
		}
	})
	return name
}

// flagAfterArgument returns the first of fs's remaining arguments that
// names one of its flags (-name, --name, --name=value), and the positional
// argument the flags stopped at; "" when there is none, or when "--" ended
// the flags on purpose (a file named like a flag).
func flagAfterArgument(fs *flag.FlagSet, args []string) (string, string) {
	rest := fs.Args()
	if len(rest) == 0 {
		return "", ""
	}
	if i := len(args) - len(rest); i > 0 && args[i-1] == "--" {
		return "", ""
	}
	for _, a := range rest[1:] {
		if a == "--" {
			break
		}
		name, ok := strings.CutPrefix(a, "-")
		if !ok || name == "" {
			continue
		}
		name = strings.TrimPrefix(name, "-")
		name, _, _ = strings.Cut(name, "=")
		if name != "" && fs.Lookup(name) != nil {
			return a, rest[0]
		}
	}
	return "", ""
}
