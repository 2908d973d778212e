//go:build integration

package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
)

// TestNativeJournalReaderAfterFlushToVar: journald starts in
// /run/log/journal and, at systemd-journal-flush.service, copies it to
// /var/log/journal (a file of a new sequence: other sequence numbers, the
// same boot, times and hashes) and removes /run/log/journal. The check's
// cursor is then of a file that is gone; its next read, natively, goes on
// after the cursor's entry's copy and gives the lines after it once each; it
// does not fall back to journalctl once every boot at the flush. After any cursor of the /run
// file, the native reader gives the entries after its copy, as journalctl
// orders the flushed journal (journalctl --after-cursor itself gives a
// burst's lines before the cursor's again: TestNativeJournalCursorOfAnotherSequence).
func TestNativeJournalReaderAfterFlushToVar(t *testing.T) {
	s, journalctl := startJournald(t, "jflush")
	ctx := context.Background()
	startStandinKubelet(t, s, standinKubeletSeq, "")
	root := s.Root("/")
	r := &churnReader{t: t, root: root, journalctl: journalctl, fallbacks: map[string]int{}}
	eventually(t, 30*time.Second, "kubelet's first lines read natively from /run", func() (bool, string) {
		why := r.read(ctx, "before the flush")
		return why == "" && r.last > 200, fmt.Sprint(r.last, " ", why)
	})
	r.fallbacks = map[string]int{} // journald's first file, being created, may have been read
	const unit = "kubelet.service"
	before, err := checks.ReadJournalForTest(ctx, journalctl, root, unit, "", time.Unix(0, 0), 0)
	if err != nil || len(before) < 200 {
		t.Fatalf("kubelet's entries before the flush: %d, %v", len(before), err)
	}

	if err := os.MkdirAll(s.Root("/var/log/journal"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.KillMain(ctx, "systemd-journald.service", int32(syscall.SIGUSR1)); err != nil { // flush
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "/run/log/journal flushed to /var and removed", func() (bool, string) {
		v, _ := filepath.Glob(s.Root("/var/log/journal/*/system.journal"))
		run, _ := filepath.Glob(s.Root("/run/log/journal/*/*.journal*"))
		return len(v) == 1 && len(run) == 0, fmt.Sprint(v, run)
	})

	// The check's next run: after its cursor, in the /run file that is gone.
	last := r.last
	if why := r.read(ctx, "the first read after the flush"); why != "" {
		t.Errorf("fell back to journalctl: %s", why)
	}
	if r.last <= last || len(r.gaps) > 0 {
		t.Errorf("after kseq %d: read up to kseq %d, gaps %v", last, r.last, r.gaps)
	}

	// Kubelet's last line, then cursors of the /run file (every 7th, the
	// last ones), read both ways.
	if err := os.WriteFile(s.Root("/run/stop-kubelet"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "kubelet's last line", func() (bool, string) {
		r.read(ctx, "after the flush")
		return r.lastSeen > 0, fmt.Sprint(r.last)
	})
	if r.last != r.lastSeen || len(r.gaps) > 0 || len(r.fallbacks) > 0 {
		t.Errorf("read up to kseq %d, kubelet's last %d; gaps %v; fell back %v", r.last, r.lastSeen, r.gaps, r.fallbacks)
	}
	// The flushed journal, as journalctl reads it: the copies of the /run
	// file's entries first, in its order, then the lines logged since.
	all, err := checks.ReadJournalForTest(ctx, journalctl, root, unit, "", time.Unix(0, 0), 0)
	if err != nil || len(all) <= len(before) {
		t.Fatalf("kubelet's entries after the flush: %d (%v), %d before", len(all), err, len(before))
	}
	for i, e := range before {
		c := all[i]
		if c.Realtime != e.Realtime || !reflect.DeepEqual(c.Messages, e.Messages) || c.Cursor == e.Cursor {
			t.Fatalf("entry %d after the flush %+v, before %+v: not its copy in a file of another sequence", i, c, e)
		}
	}
	var cursors []int
	for i := 0; i < len(before); i += 7 {
		cursors = append(cursors, i)
	}
	for i := max(0, len(before)-3); i < len(before); i++ {
		cursors = append(cursors, i)
	}
	for _, i := range cursors {
		for _, max := range []int{0, 5} {
			want := all[i+1:]
			if max > 0 {
				want = want[:min(max, len(want))]
			}
			got, err := checks.ReadJournalForTest(ctx, "", root, unit, before[i].Cursor, time.Time{}, max)
			if err != nil {
				t.Fatalf("native after %s (max %d): %v", before[i].Cursor, max, err)
			}
			if !reflect.DeepEqual(want, got) {
				var w, g any = "(none)", "(none)"
				if len(want) > 0 {
					w = want[0]
				}
				if len(got) > 0 {
					g = got[0]
				}
				t.Fatalf("after entry %d of /run, %s (max %d): %d entries native, want %d; the first\nwant   %+v\nnative %+v", i, before[i].Cursor, max, len(got), len(want), w, g)
			}
		}
	}
	t.Logf("%d entries before the flush, %d after; %d cursors of the /run file read after it natively: the entries after their copies", len(before), len(all), len(cursors))
}

// TestNativeJournalReaderAfterFlushToVarLinesAlike: kubelet's same line
// twice in one burst (one write: journald stamps both with one time, and
// their fields, so their hash, are the same) has two copies alike after the
// flush. After either line's cursor the native reader goes on after that
// line's own copy: the second line is not read again after the second's
// cursor, nor left out after the first's.
func TestNativeJournalReaderAfterFlushToVarLinesAlike(t *testing.T) {
	s, _ := startJournald(t, "jalike")
	ctx := context.Background()
	startStandinKubelet(t, s, "#!/bin/sh\nprintf 'burst a\\nsame\\nsame\\nburst z\\n'\nexec sleep infinity\n", "")
	root := s.Root("/")
	const unit = "kubelet.service"
	var before []checks.JournalEntryForTest
	eventually(t, 30*time.Second, "kubelet's four lines read natively from /run", func() (bool, string) {
		var err error
		before, err = checks.ReadJournalForTest(ctx, "", root, unit, "", time.Unix(0, 0), 0)
		return err == nil && len(before) == 4, fmt.Sprint(len(before), err)
	})
	alike := func(c string) string { return c[strings.Index(c, ";b="):] } // boot, times, hash
	if string(before[1].Messages[0]) != "same" || alike(before[1].Cursor) != alike(before[2].Cursor) {
		t.Fatalf("the two same lines are not alike but for their sequence numbers: %s, %s", before[1].Cursor, before[2].Cursor)
	}

	if err := os.MkdirAll(s.Root("/var/log/journal"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.KillMain(ctx, "systemd-journald.service", int32(syscall.SIGUSR1)); err != nil { // flush
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "/run/log/journal flushed to /var and removed", func() (bool, string) {
		v, _ := filepath.Glob(s.Root("/var/log/journal/*/system.journal"))
		run, _ := filepath.Glob(s.Root("/run/log/journal/*/*.journal*"))
		return len(v) == 1 && len(run) == 0, fmt.Sprint(v, run)
	})
	for i, want := range map[int][]string{1: {"same", "burst z"}, 2: {"burst z"}} {
		got, err := checks.ReadJournalForTest(ctx, "", root, unit, before[i].Cursor, time.Time{}, 0)
		var msgs []string
		for _, e := range got {
			msgs = append(msgs, string(bytes.Join(e.Messages, nil)))
		}
		if err != nil || !reflect.DeepEqual(msgs, want) {
			t.Errorf("after the copy of line %d (%s): %q (%v), want %q", i, before[i].Cursor, msgs, err, want)
		}
	}
}
