package main

import (
	"os"
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
