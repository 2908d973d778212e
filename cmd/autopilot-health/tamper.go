package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

const tamperUsage = `Usage:
  autopilot-health tamper clear --reason TEXT [--config FILE] [--socket PATH]
      clear NodeTampered and SealedOSTampered on the running daemon (as root):
      the findings and this boot's baseline are dropped, a new baseline is
      taken of the files as they are now, the recorded root hashes are read
      afresh; the clear is logged and sent as a TamperCleared event
  autopilot-health tamper status [--config FILE]
      print the daemon's tamper state (tamper.json in state_dir): this boot's
      baseline, the findings, the last clear (as the file records it); and
      the running daemon's tamper conditions (status socket), with a warning
      when it holds one True that the file has no finding of
  autopilot-health tamper layers [--config FILE]
      print the verity targets the kernel enforces (device-mapper ioctls on
      checks.SealedOSTampered.dm_control; root): device, root hash, table
`

func cmdTamper(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return printUsage(false, tamperUsage, stdout, stderr)
	}
	switch args[0] {
	case "clear":
		return cmdTamperClear(args[1:], stdout, stderr)
	case "status":
		return cmdTamperStatus(args[1:], stdout, stderr)
	case "layers":
		return cmdTamperLayers(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		return printUsage(true, tamperUsage, stdout, stderr)
	}
	fmt.Fprintf(stderr, "autopilot-health tamper: unknown command %q\n\n%s", args[0], tamperUsage)
	return exitError
}

func cmdTamperClear(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tamper clear", "tamper clear --reason TEXT [--config FILE] [--socket PATH]", stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML) naming control_socket; the default path may be absent")
	socket := fs.String("socket", "", "the daemon's control socket (default: control_socket of the configuration)")
	reason := fs.String("reason", "", "why the node is accepted as it is now (required; logged and evented)")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health tamper clear: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	if strings.TrimSpace(*reason) == "" {
		fmt.Fprintln(stderr, "autopilot-health tamper clear: --reason is required: a clear is a deliberate act, and its reason is logged and evented")
		return exitError
	}
	// The socket given is asked as it is, as reload's: the file is not
	// read (it may name another socket, or not load).
	path := *socket
	if path == "" {
		cfg, _, err := loadConfig(*cfgPath, flagSet(fs, "config"))
		if err != nil {
			fmt.Fprintf(stderr, "autopilot-health tamper clear: %v\n", err)
			return exitError
		}
		path = cfg.ControlSocket
	}
	conds, err := daemon.RequestTamperClear(path, *reason, operator())
	if errors.Is(err, daemon.ErrNotRunning) && !errors.As(err, new(daemon.NotASocketError)) && *socket != "" {
		if other := answersElsewhere(path, socketCandidates(*cfgPath, flagSet(fs, "config"), func(c *config.Config) string { return c.ControlSocket })); other != "" {
			fmt.Fprintln(stderr, elsewhereWords("tamper clear", path, other))
			return exitError
		}
	}
	if errors.Is(err, daemon.ErrNotRunning) && !errors.As(err, new(daemon.NotASocketError)) {
		// Nothing answers, but a daemon holds the state directory: it
		// runs (stopping, or its socket's file removed under it).
		if words := socketGone([]string{path}, stateDirOf(*cfgPath, flagSet(fs, "config")), true); words != "" {
			fmt.Fprintf(stderr, "autopilot-health tamper clear: %s\n", words)
			return exitError
		}
	}
	if ns := (daemon.NotASocketError{}); errors.As(err, &ns) {
		// Where a daemon runs, the file came after its start.
		if words := controlNotASocket(ns, stateDirOf(*cfgPath, flagSet(fs, "config")), false); words != "" {
			fmt.Fprintf(stderr, "autopilot-health tamper clear: %s\n", words)
			return exitError
		}
	}
	for _, c := range conds {
		fmt.Fprintf(stdout, "%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health tamper clear: %v\n", err)
		if len(conds) > 0 {
			// The daemon applied the clear and answered with the
			// conditions, with a problem (not saved; not re-evaluated
			// within its wait): 2 would say the command could not run.
			return exitProblem
		}
		return exitError
	}
	fmt.Fprintln(stdout, "cleared")
	return exitOK
}

// operator names who runs the command: the user behind sudo, the login
// user (the audit login uid, which su and sudo keep), the user.
func operator() string {
	var parts []string
	if u := os.Getenv("SUDO_USER"); u != "" {
		parts = append(parts, "sudo user "+u)
	}
	if b, err := os.ReadFile("/proc/self/loginuid"); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" && id != "4294967295" {
			name := id
			if u, err := user.LookupId(id); err == nil {
				name = u.Username
			}
			parts = append(parts, "login user "+name)
		}
	}
	parts = append(parts, "uid "+strconv.Itoa(os.Getuid()))
	return strings.Join(parts, ", ")
}

func cmdTamperStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tamper status", "tamper status [--config FILE]", stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML); the default path may be absent")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health tamper status: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	cfg, _, err := loadConfig(*cfgPath, flagSet(fs, "config"))
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health tamper status: %v\n", err)
		return exitError
	}
	boot, _ := os.ReadFile(cfg.HostPath("/proc/sys/kernel/random/boot_id"))
	st, err := tamper.LoadStateReadOnly(cfg.StateDir)
	if errors.Is(err, os.ErrPermission) {
		fmt.Fprintf(stderr, "autopilot-health tamper status: %v: the daemon's state_dir is root's (run with sudo)\n", err)
		return exitError
	}
	out := map[string]any{"bootID": strings.TrimSpace(string(boot)), "file": tamper.StatePath(cfg.StateDir)}
	// A file that cannot be read or does not parse (rewritten by hand, a
	// baseline that does not match its digest) is said, and the running
	// daemon's conditions are printed all the same: they are what counts,
	// and the daemon's own state may be intact.
	code := exitOK
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health tamper status: %v\n", err)
		out["state"] = "unreadable: " + err.Error()
		code = exitProblem
	} else if st == nil {
		out["state"] = "none yet (the daemon writes it at its first tamper check)"
	} else {
		out["findings"] = st.Findings
		if st.FindingsDropped > 0 {
			out["findingsDropped"] = st.FindingsDropped
		}
		// Changes of tolerated paths (known writers): they set nothing.
		out["tolerated"] = st.Tolerated
		if out["tolerated"] == nil {
			out["tolerated"] = []tamper.Finding{}
		}
		if st.ToleratedDropped > 0 {
			out["toleratedDropped"] = st.ToleratedDropped
		}
		out["cleared"] = st.Cleared
		if st.Cleared != nil {
			out["note"] = "cleared is as recorded in tamper.json, not verified: whoever can write state_dir can rewrite the file; the Node's tamper report shows the clear the daemon published"
		}
		if b := st.Baseline; b != nil {
			out["baseline"] = map[string]any{"bootID": b.BootID, "takenAt": b.TakenAt.Format(time.RFC3339), "digest": b.Digest, "files": len(b.Entries)}
		}
	}
	daemonTamper(cfg, st, out)
	// A finding's path is a file's name, which whoever created the file
	// chose: its C1 controls, DEL and bidi overrides as \u escapes.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.Encode(out)
	stdout.Write(report.PrintableJSON(b.Bytes()))
	return code
}

// daemonTamper adds to out the running daemon's tamper conditions (from its
// status socket: its state in memory, which the file may no longer match,
// since the daemon saves the file only on a change) and a warning when the
// daemon holds one True without a finding of it in the file st.
func daemonTamper(cfg *config.Config, st *tamper.State, out map[string]any) {
	if cfg.Status.Socket == "" {
		out["daemon"] = "status.socket is empty in the configuration: the daemon's conditions cannot be read"
		return
	}
	body, err := fetchStatus(cfg.Status.Socket)
	var rep daemon.StatusReport
	if err == nil {
		err = json.Unmarshal(body, &rep)
	}
	if err != nil {
		out["daemon"] = err.Error()
		return
	}
	conds := map[string]report.Condition{}
	var warn []string
	for _, c := range rep.Conditions {
		if c.Type != tamper.CondNode && c.Type != tamper.CondSealed {
			continue
		}
		conds[c.Type] = c.Condition
		if c.Status == report.StatusTrue && (st == nil || len(st.FindingsFor(c.Type)) == 0) {
			warn = append(warn, fmt.Sprintf("the daemon holds %s True, but tamper.json has no finding of it: the file was rewritten or lost since the daemon saved it; the daemon's conditions and the Node's are what counts", c.Type))
		}
	}
	out["daemon"] = conds
	if len(warn) > 0 {
		out["warning"] = strings.Join(warn, "; ")
	}
}

func cmdTamperLayers(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("tamper layers", "tamper layers [--config FILE]", stderr)
	cfgPath := fs.String("config", config.DefaultPath, "configuration file (TOML); the default path may be absent")
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health tamper layers: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	cfg, _, err := loadConfig(*cfgPath, flagSet(fs, "config"))
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health tamper layers: %v\n", err)
		return exitError
	}
	ts, err := tamper.DMControl{Path: cfg.HostPath(cfg.Checks.SealedOSTampered.DMControl)}.VerityTargets()
	if errors.Is(err, os.ErrPermission) {
		// The open of the control node, or its ioctls (CAP_SYS_ADMIN).
		err = fmt.Errorf("%w: reading the kernel's verity tables needs root (run with sudo)", err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health tamper layers: %v\n", err)
		return exitError
	}
	for _, t := range ts {
		fmt.Fprintf(stdout, "%s\t%s\t%s %s data %s hash %s blocks %d opts %s\n", t.Device, t.Table.RootHash,
			t.Table.Algorithm, "v"+strconv.Itoa(t.Table.Version), t.Table.DataDev, t.Table.HashDev, t.Table.NumDataBlocks, strings.Join(t.Table.Options, ","))
	}
	return exitOK
}
