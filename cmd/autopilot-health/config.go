package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/kmsg"
)

func cmdConfig(args []string, stdout, stderr io.Writer) int {
	const syn = "config default | config validate [--privileged-helper SOCKET] FILE | config refused-changed [--state-dir DIR]"
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		return printUsage(len(args) > 0, "Usage: autopilot-health "+syn+"\n  default         print the default configuration, every key set, with a comment\n  validate FILE   check FILE; exit 0 when valid, 2 with file:line: key: problem when not\n                  (with --privileged-helper, as run with that flag, the unit's, loads it)\n  refused-changed exit 0 when the file run last refused (exit 2) changed since, 1 when not, none was, or\n                  the record cannot be read, is not one run writes, or is another start's than the unit's last\n", stdout, stderr)
	}
	if args[0] == "refused-changed" {
		fs := newFlags("config refused-changed", "config refused-changed [--state-dir DIR]", stderr)
		def := stateDirectory()
		if def == "" {
			def = "/var/lib/autopilot-health"
		}
		dir := fs.String("state-dir", def, "the daemon's state directory, where run records the file it refused ($STATE_DIRECTORY under systemd)")
		if code := parseFlags(fs, args[1:], stdout); code >= 0 {
			return code
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "autopilot-health config refused-changed: unexpected argument %q\n", fs.Arg(0))
			return exitError
		}
		return refusedChanged(*dir, stdout, stderr)
	}
	// Each subcommand's flags are parsed as every command's: its --help,
	// also after FILE, is its usage on stdout with exit 0 (not the defaults,
	// nor a file named "--help" to validate); a flag it does not take, or
	// a stray argument, is bad usage (exit 2), not ignored or read as FILE.
	usages := map[string]string{
		"default":  "Usage: autopilot-health config default\n  print the default configuration, every key set, with a comment",
		"validate": "Usage: autopilot-health config validate [--privileged-helper SOCKET] FILE\n  check FILE; exit 0 when valid, 2 with file:line: key: problem when not\n  (a kmsg.device this host lacks, or one that is not the kernel log, is a\n  warning on stderr: run starts on it)",
	}
	if text, ok := usages[args[0]]; ok {
		fs := newFlags("config "+args[0], "config "+args[0], stderr)
		fs.Usage = func() { fmt.Fprintln(fs.Output(), text) }
		var helper *string
		if args[0] == "validate" {
			// The package's postinst checks the file as the unit's run
			// (--privileged-helper) loads it: a file only run refuses
			// passed configure and the daemon it restarted exited 2.
			helper = fs.String("privileged-helper", "", "check FILE as run --privileged-helper SOCKET loads it (the unit's ExecStart=): also what does not go with the helper")
			fs.Usage = func() { fmt.Fprintln(fs.Output(), text); fs.PrintDefaults() }
		}
		if code := parseFlags(fs, args[1:], stdout); code >= 0 {
			return code
		}
		if args[0] == "default" {
			if fs.NArg() > 0 {
				fmt.Fprintf(stderr, "autopilot-health config default: unexpected argument %q\n", fs.Arg(0))
				return exitError
			}
			stdout.Write(config.DefaultTOML())
			return exitOK
		}
		if fs.NArg() != 1 {
			if fs.NArg() > 1 {
				fmt.Fprintf(stderr, "autopilot-health config validate: one FILE, got %d: %s\n", fs.NArg(), quoteAll(fs.Args()))
			}
			fmt.Fprintln(stderr, "Usage: autopilot-health config validate [--privileged-helper SOCKET] FILE")
			return exitError
		}
		file := fs.Arg(0)
		cfg, _, err := config.Load(file, false)
		if err == nil {
			err = helperRefuses(cfg, file, *helper)
		}
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitError
		}
		for _, w := range deviceWarnings(cfg, file, *helper != "") {
			fmt.Fprintln(stderr, w)
		}
		fmt.Fprintf(stdout, "%s: valid\n", file)
		return exitOK
	}
	fmt.Fprintf(stderr, "autopilot-health config: unknown subcommand %q (want default, validate or refused-changed)\n", args[0])
	return exitError
}

// deviceWarnings are config validate's findings about kmsg.device on this
// host, each named by file, line and key: the device missing or not the
// kernel log (kmsg.CheckDevice's words), and, under the unit (helper:
// --privileged-helper), a device other than /dev/kmsg, which the daemon
// opens itself there without devices (PrivateDevices=). Warnings, exit 0,
// not refusals: run starts on such a file, its kernel log monitor failing
// and retrying as it does for any log it cannot read (README, "Kernel log
// monitor"), and a file may be validated on another host than its own (an
// image's build host); a host_root that is no directory here (run refuses
// it) says the file is not this host's, and is not looked under.
func deviceWarnings(cfg *config.Config, file string, helper bool) []string {
	if !cfg.Kmsg.Enabled || daemon.HostRootRefuses(cfg, file) != nil {
		return nil
	}
	const outcome = "run starts, and the kernel log monitor cannot read it: its conditions Unknown (CheckFailed) while it retries"
	warn := func(format string, args ...any) string {
		return (&config.Error{File: file, Line: cfg.Line("kmsg.device"), Key: "kmsg.device", Msg: "warning: " + fmt.Sprintf(format, args...)}).Error()
	}
	path := cfg.HostPath(cfg.Kmsg.Device)
	var out []string
	switch err := kmsg.CheckDevice(path); {
	case errors.Is(err, fs.ErrNotExist):
		out = append(out, warn("%s does not exist on this host: %s", path, outcome))
	case err != nil:
		out = append(out, warn("on this host, %v: %s", err, outcome))
	}
	if helper && path != "/dev/kmsg" {
		out = append(out, warn("%q: under the unit (--privileged-helper) the daemon opens a kmsg.device other than /dev/kmsg itself, without devices (PrivateDevices=): %s", cfg.Kmsg.Device, outcome))
	}
	return out
}

// loadConfig loads --config: the default path may be missing (defaults
// apply); an explicitly named file must exist.
func loadConfig(path string, explicit bool) (*config.Config, bool, error) {
	return config.Load(path, !explicit)
}

// quoteAll writes each argument quoted, separated by spaces.
func quoteAll(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return strings.Join(q, " ")
}
