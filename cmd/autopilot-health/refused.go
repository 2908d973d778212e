package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/smallfile"
	"github.com/syself/autopilot-health/internal/systemd"
)

// The record of a refused configuration file: `run` under systemd writes
// it in its state directory ($STATE_DIRECTORY, the unit's StateDirectory=)
// when it exits 2 on the file, and removes it at each start.
// autopilot-health-refused.service (the daemon's OnFailure=) runs `config
// refused-changed` once the unit is failed: a file changed since that last
// read (a fix written after the refusing daemon's last look, before
// systemd had its exit: autopilot-health.path watched nothing then, and
// its PathChanged= is not a state its watch would see afterwards) starts
// the daemon; an unchanged one, or no record (a refused flag, another
// failure), starts nothing.
const refusedRecordName = "refused-config.json"

type refusedRecord struct {
	Path   string `json:"path"`
	Digest string `json:"digest"`
	// Invocation is the refusing process's $INVOCATION_ID, the start of
	// the daemon's unit that wrote it: a record of another start than the
	// unit's last (one that start could not remove) is not its failure's.
	Invocation string `json:"invocation,omitempty"`
}

// maxRefusedRecord bounds what refusedChanged reads: a record is a path
// (at most PATH_MAX, 4096 bytes, each escaped in at most 6) and a digest.
const maxRefusedRecord = 64 << 10

// stateDirectory is the first of systemd's $STATE_DIRECTORY, or "".
func stateDirectory() string {
	dir, _, _ := strings.Cut(os.Getenv("STATE_DIRECTORY"), ":")
	return dir
}

// forgetRefusal removes the record of an earlier refusal (run's start).
// A record it cannot remove (a read-only state directory, an immutable
// file) is returned, for run to log: it stays, but names an earlier start
// (refusedRecord.Invocation), which refusedChanged does not start the
// daemon for.
func forgetRefusal() error {
	dir := stateDirectory()
	if dir == "" {
		return nil
	}
	if err := os.Remove(filepath.Join(dir, refusedRecordName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// recordRefusal records that the file at path, as digest says it was at
// the last read, was refused.
func recordRefusal(path, digest string, stderr io.Writer) {
	dir := stateDirectory()
	if dir == "" {
		return
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	b, _ := json.Marshal(refusedRecord{Path: path, Digest: digest, Invocation: os.Getenv("INVOCATION_ID")})
	tmp := filepath.Join(dir, "."+refusedRecordName+".tmp")
	err := os.WriteFile(tmp, b, 0o600)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, refusedRecordName))
	}
	if err != nil {
		os.Remove(tmp)
		fmt.Fprintf(stderr, "autopilot-health: cannot record the refusal (a fix written as this process exits is not seen; `systemctl start autopilot-health` starts it): %v\n", err)
	}
}

// refusedChanged is `config refused-changed [--state-dir DIR]`: exit 0
// when the refused file recorded in DIR changed since its refusal, 1 when
// it did not or nothing was refused.
//
// A record written by another start than the daemon unit's last one
// (daemonInvocation) is refused: one that start could not remove
// (forgetRefusal), left from a refusal before it, would start the daemon
// on a later failure that was not a refusal (a stop that timed out),
// against the operator's stop.
func refusedChanged(dir string, stdout, stderr io.Writer) int {
	rec := filepath.Join(dir, refusedRecordName)
	b, err := readRefusedRecord(rec)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintln(stdout, "no refused configuration file recorded")
		return exitProblem
	}
	if err != nil {
		fmt.Fprintf(stderr, "autopilot-health config refused-changed: cannot read the record %s: %v; not starting the daemon for it\n", rec, err)
		return exitProblem
	}
	r, problem := parseRefusedRecord(b)
	if last := daemonInvocation(); problem == "" && last != "" && r.Invocation != last {
		was := "no start of the daemon"
		if r.Invocation != "" {
			was = "another start of the daemon (invocation " + r.Invocation + ")"
		}
		problem = fmt.Sprintf("was written by %s, not by its last start (invocation %s), which could not remove it", was, last)
	}
	if problem != "" {
		// Not a record run writes: nothing to start the daemon for.
		fmt.Fprintf(stderr, "autopilot-health config refused-changed: the record %s %s; not starting the daemon for it\n", filepath.Join(dir, refusedRecordName), problem)
		return exitProblem
	}
	if config.FileDigest(r.Path) == r.Digest {
		fmt.Fprintf(stdout, "%s: unchanged since it was refused\n", r.Path)
		return exitProblem
	}
	fmt.Fprintf(stdout, "%s: changed since it was refused\n", r.Path)
	return exitOK
}

// daemonInvocation is the invocation ID of the last start of the daemon's
// unit, or "" where it cannot be told (not under systemd, no such unit, no
// system bus). An OnFailure= unit's ExecStart= is given it as
// $MONITOR_INVOCATION_ID, but its ExecCondition= (where refused-changed
// runs) is not, in systemd 252: there systemd is asked over D-Bus, as the
// daemon reads its units.
var daemonInvocation = func() string {
	if id := os.Getenv("MONITOR_INVOCATION_ID"); id != "" {
		return id
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bus := systemd.NewDBus()
	defer bus.Close()
	u, err := bus.Unit(ctx, daemonUnit)
	if err != nil {
		return ""
	}
	return u.Invocation
}

// daemonUnit is the daemon's unit, whose failure starts
// autopilot-health-refused.service.
const daemonUnit = "autopilot-health.service"

// readRefusedRecord reads the record at path as the small regular file
// recordRefusal writes. It opens it without blocking (a FIFO there, with
// no writer, would hold the unit's condition until its start timeout) and
// refuses what is not a regular file (a device too) or is larger than any
// record, without reading it.
func readRefusedRecord(path string) ([]byte, error) {
	b, err := smallfile.Read(path, smallfile.Limits{Max: maxRefusedRecord})
	var notRegular *smallfile.NotRegularError
	var tooLarge *smallfile.TooLargeError
	switch {
	case errors.As(err, &notRegular):
		return nil, fmt.Errorf("not a regular file (%s)", notRegular.Kind)
	case errors.As(err, &tooLarge):
		return nil, fmt.Errorf("larger than a record (over %d bytes)", maxRefusedRecord)
	}
	return b, err
}

// parseRefusedRecord reads a record as recordRefusal writes it: an
// absolute path and the file's digest (never empty). Anything else is
// named (problem), not read as a change: an empty digest would differ from
// every file's, and a relative path would be another file.
func parseRefusedRecord(b []byte) (r refusedRecord, problem string) {
	if err := json.Unmarshal(b, &r); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			return r, `does not parse: want {"path": "/the/file", "digest": "..."}`
		}
		return r, "does not parse as JSON: " + err.Error()
	}
	switch {
	case r.Path == "":
		return r, "names no file (no \"path\")"
	case !filepath.IsAbs(r.Path):
		return r, fmt.Sprintf("names %q, not absolute", r.Path)
	case r.Digest == "":
		return r, fmt.Sprintf("holds no digest of %s", r.Path)
	}
	return r, ""
}
