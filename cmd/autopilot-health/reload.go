package main

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/BurntSushi/toml"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
)

const reloadSyn = "reload [--config FILE] [--socket PATH]"

// cmdReload asks the running daemon to read its configuration file again
// and waits for the outcome: the unit's ExecReload=, so that `systemctl
// reload` fails, with the daemon's reason in the journal, when the file is
// refused (the daemon runs on with the previous one). It needs root (the
// control socket's peer check).
func cmdReload(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("reload", reloadSyn, stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML) naming control_socket; the default path may be absent")
	socket := fs.String("socket", "", "the daemon's control socket (default: control_socket of the configuration)")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health reload: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	path := *socket
	if path == "" {
		path = controlSocketOf(*cfgPath, flagSet(fs, "config"))
	}
	what, err := daemon.RequestReload(path)
	var refused daemon.RefusedError
	if errors.As(err, &refused) {
		fmt.Fprintf(stderr, "autopilot-health reload: refused: %v\n", err)
		return exitProblem
	}
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health reload: %v\n", err)
		return exitError
	}
	fmt.Fprintf(stdout, "reloaded: %s\n", what)
	return exitOK
}

// controlSocketOf is the control socket a configuration file names. A file
// the daemon would refuse is still asked for its control_socket (the
// daemon's refusal, with file, line and key, is the answer the operator
// needs, and it counts in the daemon's metrics); a file that names none, or
// is not TOML at all, gives the default.
func controlSocketOf(path string, explicit bool) string {
	if cfg, _, err := loadConfig(path, explicit); err == nil {
		return cfg.ControlSocket
	}
	var partial struct {
		ControlSocket string `toml:"control_socket"`
	}
	if _, err := toml.DecodeFile(path, &partial); err == nil && filepath.IsAbs(partial.ControlSocket) {
		return partial.ControlSocket
	}
	return config.Default().ControlSocket
}
