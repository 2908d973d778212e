package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"unicode/utf16"

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
	if code := parseFlags(fs, args, stdout); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "autopilot-health reload: unexpected argument %q\n", fs.Arg(0))
		return exitError
	}
	paths := []string{*socket}
	if *socket == "" {
		paths = socketCandidates(*cfgPath, flagSet(fs, "config"), func(c *config.Config) string { return c.ControlSocket })
	}
	var what string
	var err error
	var notSocket error
	for _, p := range paths {
		if what, err = daemon.RequestReload(p); !errors.Is(err, daemon.ErrNotRunning) {
			break
		}
		// A file, a directory or a symlink at the path: the other
		// candidate may answer; if none does, this is what the
		// operator needs to know (a daemon whose control_socket names
		// it does not start), not "not running, or still starting".
		if errors.As(err, new(daemon.NotASocketError)) && notSocket == nil {
			notSocket = err
		}
	}
	if errors.Is(err, daemon.ErrNotRunning) && notSocket != nil {
		var ns daemon.NotASocketError
		if errors.As(notSocket, &ns) && ns.Socket == paths[0] {
			// Where a daemon runs, the file came after its start.
			if words := controlNotASocket(ns, stateDirOf(*cfgPath, flagSet(fs, "config")), true); words != "" {
				fmt.Fprintf(stderr, "autopilot-health reload: %s\n", words)
				return exitError
			}
			fmt.Fprintf(stderr, "autopilot-health reload: %v\n", notSocket)
			return exitError
		}
		// Only at the default socket: it keeps a daemon started before
		// control_socket changed from starting, not the one of this
		// file, which binds its own (a stale socket there is removed):
		// named with "nor on" the socket the file names, below.
		err = notSocket
	}
	if errors.Is(err, daemon.ErrNotRunning) && notSocket == nil && *socket != "" {
		if other := answersElsewhere(*socket, socketCandidates(*cfgPath, flagSet(fs, "config"), func(c *config.Config) string { return c.ControlSocket })); other != "" {
			fmt.Fprintln(stderr, elsewhereWords("reload", *socket, other))
			return exitError
		}
	}
	if errors.Is(err, daemon.ErrNotRunning) && notSocket == nil && *socket == "" {
		if words := socketNotKnown(*cfgPath, flagSet(fs, "config"), "control", paths[len(paths)-1]); words != "" {
			fmt.Fprintf(stderr, "autopilot-health reload: %s\n", words)
			return exitError
		}
	}
	if errors.Is(err, daemon.ErrNotRunning) && notSocket == nil {
		// Nothing answers, but a daemon holds the state directory: it
		// runs (stopping, or its socket's file removed under it).
		if words := socketGone(paths, stateDirOf(*cfgPath, flagSet(fs, "config")), true); words != "" {
			fmt.Fprintf(stderr, "autopilot-health reload: %s\n", words)
			return exitError
		}
	}
	var refused daemon.RefusedError
	switch {
	case errors.As(err, &refused):
		fmt.Fprintf(stderr, "autopilot-health reload: refused: %v\n", err)
		return exitProblem
	case errors.Is(err, daemon.ErrNotRunning) && len(paths) > 1:
		fmt.Fprintf(stderr, "autopilot-health reload: %v; nor on %s, which %s names (control_socket needs a restart to change: systemctl restart autopilot-health)\n", err, paths[0], *cfgPath)
		return exitError
	case err != nil:
		fmt.Fprintf(stderr, "autopilot-health reload: %v\n", err)
		return exitError
	}
	fmt.Fprintf(stdout, "reloaded: %s\n", what)
	return exitOK
}

// socketCandidates are the sockets to ask for a daemon, in order: the one
// the configuration file names (of), and the default when it differs. The
// file may name another socket than the running daemon's (the socket keys
// need a restart to change), and a file the daemon would refuse is still
// asked for its socket: the daemon's answer (its refusal, with file, line
// and key) is what the operator needs; in a file that is not TOML at all
// the keys' own lines are read.
func socketCandidates(path string, explicit bool, of func(*config.Config) string) []string {
	def := of(config.Default())
	named := def
	if cfg, _, err := loadConfig(path, explicit); err == nil {
		named = of(cfg)
	} else {
		// The socket keys alone: a mistake elsewhere does not hide them.
		var keys struct {
			ControlSocket *string `toml:"control_socket"`
			Status        struct {
				Socket *string `toml:"socket"`
			} `toml:"status"`
		}
		// Read as the configuration is (config.ReadFile): a FIFO is
		// not opened to wait for a writer.
		if b, err := config.ReadFile(path); err == nil {
			b = utf8OfMarked(b)
			if config.CheckBounds(path, b) != nil {
				// A file of odd shape (nesting, a key of many
				// parts) the decoder would take a minute and
				// gigabytes over: its keys' own lines.
				keys.ControlSocket, keys.Status.Socket = scanSocketKeys(b)
			} else if _, err := toml.Decode(string(b), &keys); err != nil {
				// Not TOML (a syntax error, a duplicate key): the
				// keys' own lines, as written.
				keys.ControlSocket, keys.Status.Socket = scanSocketKeys(b)
			}
		}
		partial := config.Default()
		if keys.ControlSocket != nil {
			partial.ControlSocket = *keys.ControlSocket
		}
		if keys.Status.Socket != nil {
			partial.Status.Socket = *keys.Status.Socket
		}
		if filepath.IsAbs(of(partial)) {
			named = of(partial)
		}
	}
	if named == def || named == "" {
		return []string{def}
	}
	return []string{named, def}
}

// utf8OfMarked is b in UTF-8 where b starts with UTF-16's or UTF-32's byte
// order mark and is whole in that encoding (a file an editor saved as
// "Unicode", which the daemon refuses: its socket keys are read all the
// same); b itself otherwise. UTF-32's little-endian mark starts with
// UTF-16's, so it is looked for first.
func utf8OfMarked(b []byte) []byte {
	var runes []rune
	switch {
	case bytes.HasPrefix(b, []byte("\xff\xfe\x00\x00")), bytes.HasPrefix(b, []byte("\x00\x00\xfe\xff")):
		if len(b)%4 != 0 {
			return b
		}
		le := b[0] == 0xff
		for i := 4; i < len(b); i += 4 {
			if le {
				runes = append(runes, rune(binary.LittleEndian.Uint32(b[i:])))
			} else {
				runes = append(runes, rune(binary.BigEndian.Uint32(b[i:])))
			}
		}
	case bytes.HasPrefix(b, []byte("\xff\xfe")), bytes.HasPrefix(b, []byte("\xfe\xff")):
		if len(b)%2 != 0 || bytes.IndexByte(b[2:], 0) < 0 {
			return b // UTF-8 after the mark: the decoder skips the mark
		}
		le := b[0] == 0xff
		units := make([]uint16, 0, len(b)/2-1)
		for i := 2; i < len(b); i += 2 {
			if le {
				units = append(units, binary.LittleEndian.Uint16(b[i:]))
			} else {
				units = append(units, binary.BigEndian.Uint16(b[i:]))
			}
		}
		runes = utf16.Decode(units)
	default:
		return b
	}
	return []byte(string(runes))
}

var (
	tableLine  = regexp.MustCompile(`^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]`)
	socketLine = regexp.MustCompile(`^\s*(control_socket|socket)\s*=\s*"([^"\\]*)"\s*(#.*)?$`)
)

// scanSocketKeys reads control_socket (top level) and [status] socket from
// the lines of a file that is not valid TOML, as they are written (a basic
// string without escapes); nil where a key is not found so.
func scanSocketKeys(b []byte) (control, status *string) {
	table := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		if m := tableLine.FindStringSubmatch(line); m != nil {
			table = m[1]
			continue
		}
		m := socketLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v := m[2]
		switch {
		case table == "" && m[1] == "control_socket":
			control = &v
		case table == "status" && m[1] == "socket":
			status = &v
		}
	}
	return control, status
}
