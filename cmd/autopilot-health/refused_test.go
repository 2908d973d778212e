package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Under systemd ($STATE_DIRECTORY) run records the file it refuses, as it
// last read it, and `config refused-changed` (autopilot-health-refused.service,
// the unit's OnFailure=) says whether the file changed since: a fix written
// after the refusing daemon's last look starts it, an unchanged file does
// not. Each start of run removes the record first, so a flag refused
// afterwards (no file to blame) starts nothing, and neither does an absent
// record.
func TestRunRecordsARefusedFile(t *testing.T) {
	state := t.TempDir()
	t.Setenv("STATE_DIRECTORY", state)
	// The record's start is the daemon unit's last (as under
	// autopilot-health-refused.service), whatever this machine runs.
	t.Setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
	t.Setenv("MONITOR_INVOCATION_ID", "0123456789abcdef0123456789abcdef")
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("role = \"master\"\n"), 0o644)
	changed := func() (int, string) {
		code, out, errs := run(t, "config", "refused-changed")
		return code, out + errs
	}
	if code, out := changed(); code != exitProblem || !strings.Contains(out, "no refused configuration file recorded") {
		t.Errorf("before any refusal: exit %d, %q; want 1, none recorded", code, out)
	}
	if code, _, errs := run(t, "run", "--config", cfg); code != exitError {
		t.Fatalf("run on a refused file: exit %d, %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(state, refusedRecordName)); err != nil {
		t.Fatalf("no record of the refusal: %v", err)
	}
	if code, out := changed(); code != exitProblem || !strings.Contains(out, "unchanged since it was refused") {
		t.Errorf("the refused file unchanged: exit %d, %q; want 1, unchanged", code, out)
	}
	os.WriteFile(cfg, []byte("role = \"worker\"\n"), 0o644)
	if code, out := changed(); code != exitOK || !strings.Contains(out, cfg+": changed since it was refused") {
		t.Errorf("the refused file changed: exit %d, %q; want 0, changed", code, out)
	}
	os.Remove(cfg)
	if code, out := changed(); code != exitOK {
		t.Errorf("the refused file removed: exit %d, %q; want 0, changed", code, out)
	}
	// A refused flag: the record of the earlier refusal is gone, none new.
	if code, _, errs := run(t, "run", "--config", cfg, "--bogus"); code != exitError {
		t.Fatalf("run with a bad flag: exit %d, %s", code, errs)
	}
	if code, out := changed(); code != exitProblem || !strings.Contains(out, "no refused configuration file recorded") {
		t.Errorf("after a refused flag: exit %d, %q; want 1, none recorded", code, out)
	}
	if code, _, errs := run(t, "config", "refused-changed", "extra"); code != exitError || !strings.Contains(errs, `unexpected argument "extra"`) {
		t.Errorf("an extra argument: exit %d, %q", code, errs)
	}
}

// A record run did not write (hand-made, cut short, another version's) is
// named for what is wrong with it, never "<nil>", and starts nothing: exit
// 1, as tamper status's tamper.json that does not parse. A record without
// a digest, or with a relative path, is not one run writes (its digest is
// never empty, its path absolute): read as "changed", it would start the
// daemon for a change no one made.
func TestRefusedChangedOddRecord(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("role = \"worker\"\n"), 0o644)
	for _, tc := range []struct{ record, want string }{
		{`{}`, "names no file"},
		{`null`, "names no file"},
		{`{"digest":"abc"}`, "names no file"},
		{`{"path":"` + cfg + `"}`, "holds no digest"},
		{`{"path":"` + cfg + `","digest":""}`, "holds no digest"},
		{`{"path":"config.toml","digest":"abc"}`, "not absolute"},
		{`[]`, "does not parse"},
		{`garbage`, "does not parse"},
		{``, "does not parse"},
	} {
		state := t.TempDir()
		rec := filepath.Join(state, refusedRecordName)
		os.WriteFile(rec, []byte(tc.record), 0o600)
		code, out, errs := run(t, "config", "refused-changed", "--state-dir", state)
		if code != exitProblem || strings.Contains(errs, "<nil>") || !strings.Contains(errs, rec) || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("record %q: exit %d, stdout %q, stderr %q; want 1, %q naming %s, nothing on stdout", tc.record, code, out, errs, tc.want, rec)
		}
	}
}

// The record is opened without blocking and read only as the small
// regular file run writes (a path and a digest): a FIFO there (no writer)
// is refused at once, not waited on until the unit's start timeout; a
// directory, or a file larger than any record, is refused without reading
// it all. Each is named, exit 1, and starts nothing.
func TestRefusedChangedRecordNotAFile(t *testing.T) {
	big := strings.Repeat("x", maxRefusedRecord+1)
	for _, tc := range []struct {
		name, want string
		make       func(rec string) error
	}{
		{"fifo", "not a regular file", func(rec string) error { return syscall.Mkfifo(rec, 0o600) }},
		{"directory", "not a regular file", func(rec string) error { return os.Mkdir(rec, 0o700) }},
		// open(2) of a socket fails (ENXIO): named for what it is, not
		// "no such device or address".
		{"socket", "not a regular file (a socket)", func(rec string) error {
			ln, err := net.Listen("unix", rec)
			if err == nil {
				t.Cleanup(func() { ln.Close() })
			}
			return err
		}},
		{"too large", "larger than a record", func(rec string) error {
			return os.WriteFile(rec, []byte(`{"path":"/`+big+`","digest":"abc"}`), 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			rec := filepath.Join(state, refusedRecordName)
			if err := tc.make(rec); err != nil {
				t.Fatal(err)
			}
			type result struct {
				code      int
				out, errs string
			}
			done := make(chan result, 1)
			go func() {
				code, out, errs := run(t, "config", "refused-changed", "--state-dir", state)
				done <- result{code, out, errs}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				// Unblock the open for the test's end.
				if f, err := os.OpenFile(rec, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				t.Fatalf("config refused-changed still waiting on the record after 10s")
			}
			if r.code != exitProblem || r.out != "" || !strings.Contains(r.errs, rec) || !strings.Contains(r.errs, tc.want) || !strings.Contains(r.errs, "not starting the daemon for it") {
				t.Errorf("exit %d, stdout %.300q, stderr %.300q; want 1, %q naming %s, not starting the daemon", r.code, r.out, r.errs, tc.want, rec)
			}
		})
	}
}

// A record that the daemon's start could not remove (a read-only state
// directory, an immutable file) is one of an earlier start: it names
// another $INVOCATION_ID than the daemon unit's last start
// (daemonInvocation: $MONITOR_INVOCATION_ID where systemd gives it, else
// systemd's InvocationID of the unit) and is refused, so that a later
// failure of a daemon that ran (a stop that timed out) does not start it
// against the operator's stop. The record of the failed run itself is
// read as before.
func TestRefusedChangedStaleRecord(t *testing.T) {
	state := t.TempDir()
	t.Setenv("STATE_DIRECTORY", state)
	t.Setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("role = \"master\"\n"), 0o644)
	if code, _, errs := run(t, "run", "--config", cfg); code != exitError {
		t.Fatalf("run on a refused file: exit %d, %s", code, errs)
	}
	os.WriteFile(cfg, []byte("role = \"worker\"\n"), 0o644)
	t.Setenv("MONITOR_INVOCATION_ID", "0123456789abcdef0123456789abcdef")
	if code, out, errs := run(t, "config", "refused-changed"); code != exitOK || !strings.Contains(out, "changed since it was refused") {
		t.Errorf("the failed run's own record: exit %d, %q %q; want 0, changed", code, out, errs)
	}
	t.Setenv("MONITOR_INVOCATION_ID", "fedcba9876543210fedcba9876543210")
	code, out, errs := run(t, "config", "refused-changed")
	if code != exitProblem || out != "" || !strings.Contains(errs, "0123456789abcdef0123456789abcdef") || !strings.Contains(errs, "fedcba9876543210fedcba9876543210") || !strings.Contains(errs, "not starting the daemon for it") {
		t.Errorf("a record of another start: exit %d, stdout %q, stderr %q; want 1, both starts named, not starting the daemon", code, out, errs)
	}
	// One without the start that wrote it (hand-made, an older version's)
	// cannot be told to be this failure's either.
	os.WriteFile(filepath.Join(state, refusedRecordName), []byte(`{"path":"`+cfg+`","digest":"abc"}`), 0o600)
	if code, out, errs := run(t, "config", "refused-changed"); code != exitProblem || out != "" || !strings.Contains(errs, "not starting the daemon for it") {
		t.Errorf("a record naming no start: exit %d, stdout %q, stderr %q; want 1, not starting the daemon", code, out, errs)
	}
}

// A record run's start cannot remove (here a non-empty directory in its
// place, as an immutable file refuses the unlink) is named, not ignored.
func TestForgetRefusalFailureIsReturned(t *testing.T) {
	state := t.TempDir()
	t.Setenv("STATE_DIRECTORY", state)
	if err := forgetRefusal(); err != nil {
		t.Errorf("no record: %v, want nil", err)
	}
	rec := filepath.Join(state, refusedRecordName)
	os.MkdirAll(filepath.Join(rec, "x"), 0o700)
	if err := forgetRefusal(); err == nil || !strings.Contains(err.Error(), rec) {
		t.Errorf("a record that cannot be removed: %v, want its error naming %s", err, rec)
	}
}

// A daemon that starts with a record it cannot remove says so at warning
// level (journalctl -p warning), naming the record and the cause, and runs.
func TestRunWarnsOfARecordItCannotRemove(t *testing.T) {
	if cfg := os.Getenv(runChildEnv + "_FORGET"); cfg != "" {
		os.Exit(Main([]string{"run", "--config", cfg}, os.Stdout, os.Stderr))
	}
	dir := t.TempDir()
	state := filepath.Join(dir, "state-directory")
	rec := filepath.Join(state, refusedRecordName)
	if err := os.MkdirAll(filepath.Join(rec, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := fakeHost(t, fmt.Sprintf("node_name = \"n\"\nrole = \"worker\"\ngpu = \"false\"\ncontrol_socket = %q\n"+
		"[metrics]\nlisten_address = %q\n[status]\nsocket = \"\"\n[kubernetes]\nkubeconfig = \"\"\n"+
		"[kmsg]\nenabled = false\n[runner]\nfirst_run_spread = \"0s\"\n", filepath.Join(dir, "control.sock"), freeMetricsAddress(t)))
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunWarnsOfARecordItCannotRemove$")
	cmd.Env = append(os.Environ(), runChildEnv+"_FORGET="+cfg, "STATE_DIRECTORY="+state)
	all, err := signalAfter(t, cmd, syscall.SIGTERM, `msg="serving metrics"`, `msg="starting without the metrics listener"`)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	var warn string
	for _, l := range strings.Split(all, "\n") {
		if strings.Contains(l, "cannot remove the record of an earlier refusal") {
			warn = l
		}
	}
	if !strings.Contains(warn, "level=WARN") || !strings.Contains(warn, rec) || !strings.Contains(warn, "directory not empty") {
		t.Errorf("no warning naming the record %s and its cause:\n%s", rec, all)
	}
}
