//go:build integration

package tests

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/tests/harness"
)

// standinKubeletJournal logs what the native journal reader must read as
// journalctl does: short lines, values journald compresses with zstd (over
// 512 bytes), one a byte under journalctl's JSON limit ("MESSAGE=" and the
// value 4095 bytes: a string) and two at and over it (null), a line that is
// not UTF-8, an entry with MESSAGE twice (logger --journald), and enough
// lines that the unit's entry arrays chain; then it waits for the test to
// rotate the journal (an archived file and a new one) and logs more.
const standinKubeletJournal = `#!/bin/sh
long() { seq -s , 1 3000 | head -c "$1"; echo; }
i=0; while [ $i -lt 20 ]; do echo "short line $i"; i=$((i+1)); done
long 600; long 3000; long 4087; long 4088; long 5000
sleep 1.1
printf 'not utf-8 \377\376 end\n'
two() { python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"MESSAGE=first of two\nMESSAGE=second of two\nPRIORITY=6\n", "/run/systemd/journal/socket")'; }
two
seq 1 1000 | sed 's/^/line /'
sleep 1.1
seq 1001 1500 | sed 's/^/line /'
echo phase1-done
while [ ! -e /run/phase2 ]; do sleep 0.05; done
long 700
two
seq 1 400 | sed 's/^/after rotation /'
long 4088
echo phase2-done
exec sleep infinity
`

// TestNativeJournalReaderMatchesJournalctl: the native reader of journald's
// files (KubeletHeartbeatFailed's) gives exactly the entries journalctl
// gives (cursor, time, boot ID, every MESSAGE value) for the check's query,
// on a real journald's files (systemd 252: keyed hash, compact, zstd): from
// a series of start times and after a series of cursors, with and without a
// bound, across a rotation (an archived file and a new one). Cursors work
// both ways: journalctl's (of any unit's entry: an older daemon's query
// matched PID 1's entries about the unit too) are read natively, and the
// native reader's are accepted by journalctl --after-cursor.
func TestNativeJournalReaderMatchesJournalctl(t *testing.T) {
	harness.Parallel(t, 1)
	s, journalctl := startJournald(t, "njournal")
	ctx := context.Background()
	// Another unit logs beside it: entries of the journal not of kubelet.
	if err := s.AddUnit(ctx, "other.service", "[Unit]\nDefaultDependencies=no\n\n[Service]\nExecStart=/bin/sh -c 'for i in $(seq 1 40); do echo other $i; sleep 0.01; done'\n"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnit(ctx, "other.service"); err != nil {
		t.Fatal(err)
	}
	startStandinKubelet(t, s, standinKubeletJournal, "stand-in kubelet (journal formats)")
	eventually(t, 30*time.Second, "the first phase in the journal", func() (bool, string) {
		j := s.Journal("kubelet.service")
		return strings.Contains(j, "phase1-done"), tailLines(j, 5)
	})
	if err := s.KillMain(ctx, "systemd-journald.service", int32(syscall.SIGUSR2)); err != nil { // rotate
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "an archived journal file", func() (bool, string) {
		m, _ := filepath.Glob(s.Root("/run/log/journal/*/system@*.journal"))
		return len(m) > 0, fmt.Sprint(m)
	})
	if err := os.WriteFile(s.Root("/run/phase2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the second phase in the journal", func() (bool, string) {
		j := s.Journal("kubelet.service")
		return strings.Contains(j, "phase2-done"), tailLines(j, 5)
	})

	root := s.Root("/")
	const unit = "kubelet.service"
	read := func(jctl, after string, since time.Time, max int) []checks.JournalEntryForTest {
		t.Helper()
		es, err := checks.ReadJournalForTest(ctx, jctl, root, unit, after, since, max)
		if err != nil {
			t.Fatalf("reading with %q after %q since %s max %d: %v", jctl, after, since, max, err)
		}
		return es
	}
	same := func(what string, want, got []checks.JournalEntryForTest) {
		t.Helper()
		if reflect.DeepEqual(want, got) {
			return
		}
		for i := 0; i < len(want) || i < len(got); i++ {
			if i >= len(want) || i >= len(got) || !reflect.DeepEqual(want[i], got[i]) {
				var w, g any = "(none)", "(none)"
				if i < len(want) {
					w = want[i]
				}
				if i < len(got) {
					g = got[i]
				}
				t.Fatalf("%s: %d entries from journalctl, %d native; first difference at %d:\njournalctl %+v\nnative     %+v", what, len(want), len(got), i, w, g)
			}
		}
	}

	all := read(journalctl, "", time.Unix(0, 0), 0)
	allNative := read("", "", time.Unix(0, 0), 0)
	same("everything", all, allNative)

	// The entries hold what the test is about.
	var two, null, under, notUTF8 bool
	for _, e := range allNative {
		switch {
		case len(e.Messages) == 2 && string(e.Messages[0])+"|"+string(e.Messages[1]) == "first of two|second of two":
			two = true
		case len(e.Messages) == 0:
			null = true
		case len(e.Messages) == 1 && len(e.Messages[0]) == 4087:
			under = true
		case len(e.Messages) == 1 && bytes.Contains(e.Messages[0], []byte("\xff\xfe")):
			notUTF8 = true
		}
	}
	if len(allNative) < 1900 || !two || !null || !under || !notUTF8 {
		t.Fatalf("%d entries; MESSAGE twice %v, a null MESSAGE %v, a 4087-byte one %v, one not UTF-8 %v", len(allNative), two, null, under, notUTF8)
	}

	// From a series of start times (whole seconds, as the check asks).
	seen := map[int64]bool{}
	for i, e := range all {
		sec := e.Realtime.Unix()
		if seen[sec] && i != len(all)-1 {
			continue
		}
		seen[sec] = true
		for _, since := range []time.Time{time.Unix(sec, 0), time.Unix(sec+1, 0)} {
			same("since "+since.String(), read(journalctl, "", since, 0), read("", "", since, 0))
		}
	}

	// After a series of cursors journalctl printed: every 97th of the
	// unit's, the last ones, and every 7th of all the journal's entries
	// (an older daemon's --unit= query could end on PID 1's entry about
	// the unit); with and without a bound.
	var cursors, others []string
	for i := 0; i < len(all); i += 97 {
		cursors = append(cursors, all[i].Cursor)
	}
	for i := max(0, len(all)-3); i < len(all); i++ {
		cursors = append(cursors, all[i].Cursor)
	}
	out, err := exec.Command(journalctl, "--root="+root, "--no-pager", "--output=json", "--output-fields=_SYSTEMD_UNIT").Output()
	if err != nil {
		t.Fatal(err)
	}
	other := 0
	for i, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var e struct {
			Cursor string `json:"__CURSOR"`
			Unit   string `json:"_SYSTEMD_UNIT"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if e.Unit != unit && (i%7 == 0 || other == 0) {
			others = append(others, e.Cursor)
			other++
		}
	}
	if other == 0 {
		t.Fatal("no entry of another unit in the journal")
	}
	for _, c := range cursors {
		same("after "+c, read(journalctl, c, time.Time{}, 0), read("", c, time.Time{}, 0))
		same("after "+c+" max 5", read(journalctl, c, time.Time{}, 5), read("", c, time.Time{}, 5))
	}

	// After the cursor of another unit's entry journalctl 252 also skips
	// the first entry of the unit (its --after-cursor skips the first entry
	// it finds, taking it for the cursor's own); the native reader skips
	// only the cursor's own entry, so an upgrade from a daemon whose saved
	// cursor is PID 1's entry about kubelet does not lose kubelet's next one.
	for _, c := range others {
		j, n := read(journalctl, c, time.Time{}, 0), read("", c, time.Time{}, 0)
		if len(n) > 0 {
			n = n[1:]
		}
		same("after another unit's "+c, j, n)
	}

	// The native reader's cursors, read by journalctl.
	for i := 0; i < len(allNative); i += 211 {
		c := allNative[i].Cursor
		same("native cursor "+c, read("", c, time.Time{}, 0), read(journalctl, c, time.Time{}, 0))
	}
	t.Logf("%d entries of %s, %d start times, %d cursors (%d of other units' entries), %d native cursors: the same", len(all), unit, len(seen), len(cursors), other, (len(allNative)+210)/211)

	if out := os.Getenv("NATIVE_JOURNAL_TESTDATA"); out != "" {
		if err := writeJournalTestdata(out, s.Root("/run/log/journal"), all); err != nil {
			t.Fatal(err)
		}
	}
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// writeJournalTestdata writes the journal directory (journal.tar.gz, paths
// under run/log/journal) and journalctl's reading of it (journalctl.json.gz:
// the entries, one a line) for the unit tests of the native reader.
func writeJournalTestdata(out, journalDir string, entries []checks.JournalEntryForTest) error {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	err := filepath.Walk(journalDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(journalDir, p)
		if err := tw.WriteHeader(&tar.Header{Name: filepath.Join("run/log/journal", rel), Mode: 0o644, Size: fi.Size(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "journal.tar.gz"), buf.Bytes(), 0o644); err != nil {
		return err
	}
	var js bytes.Buffer
	for _, e := range entries {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		js.Write(b)
		js.WriteByte('\n')
	}
	buf.Reset()
	zw, _ = gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Write(js.Bytes())
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "journalctl.json.gz"), buf.Bytes(), 0o644)
}
