package main

import (
	"fmt"
	"io"

	"github.com/syself/autopilot-health/internal/config"
)

func cmdConfig(args []string, stdout, stderr io.Writer) int {
	const syn = "config default | config validate FILE"
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		return printUsage(len(args) > 0, "Usage: autopilot-health "+syn+"\n  default         print the default configuration, every key commented\n  validate FILE   check FILE; exit 0 when valid, 2 with file:line: key: problem when not\n", stdout, stderr)
	}
	// A subcommand's --help is its usage, on stdout with exit 0, as every
	// command's: not the defaults, nor a file named "--help" to validate.
	if len(args) > 1 && (args[1] == "--help" || args[1] == "-h") {
		switch args[0] {
		case "default":
			fmt.Fprintln(stdout, "Usage: autopilot-health config default\n  print the default configuration, every key commented")
			return exitOK
		case "validate":
			fmt.Fprintln(stdout, "Usage: autopilot-health config validate FILE\n  check FILE; exit 0 when valid, 2 with file:line: key: problem when not")
			return exitOK
		}
	}
	switch args[0] {
	case "default":
		stdout.Write(config.DefaultTOML())
		return exitOK
	case "validate":
		if len(args) != 2 {
			fmt.Fprintln(stderr, "Usage: autopilot-health config validate FILE")
			return exitError
		}
		if _, _, err := config.Load(args[1], false); err != nil {
			fmt.Fprintln(stderr, err)
			return exitError
		}
		fmt.Fprintf(stdout, "%s: valid\n", args[1])
		return exitOK
	}
	fmt.Fprintf(stderr, "autopilot-health config: unknown subcommand %q (want default or validate)\n", args[0])
	return exitError
}

// loadConfig loads --config: the default path may be missing (defaults
// apply); an explicitly named file must exist.
func loadConfig(path string, explicit bool) (*config.Config, bool, error) {
	return config.Load(path, !explicit)
}
