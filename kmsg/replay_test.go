package kmsg

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/syself/autopilot-health/report"
)

func replayFile(t *testing.T, path string) ([]string, ReplayStats) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	st, err := Replay(f, NewMonitor(opts(t, report.NewStore("replay"))), func(a Action) {
		b, _ := json.Marshal(a)
		got = append(got, string(b))
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, st
}

// Each form an operator pastes, captured from this machine's real dmesg,
// journalctl and /dev/kmsg (testdata/replay/capture.sh), gives the same
// actions as plain dmesg, and is read as the form it is.
func TestReplayEveryForm(t *testing.T) {
	forms := map[string]Form{
		"dmesg.txt":                     FormDmesg,
		"dmesg-T.txt":                   FormDmesgCtime,
		"dmesg-x.txt":                   FormDmesg + " -x",
		"dmesg-T-x.txt":                 FormDmesgCtime + " -x",
		"dmesg-iso.txt":                 FormDmesgISO,
		"dmesg-r.txt":                   FormDmesgRaw,
		"dmesg-reltime.txt":             FormDmesgReltime,
		"dmesg-delta.txt":               FormDmesgDelta,
		"dmesg-t.txt":                   FormBare,
		"kmsg-raw.txt":                  FormKmsg,
		"journal-short.txt":             FormJournalShort,
		"journal-short-iso.txt":         FormJournalISO,
		"journal-short-precise.txt":     FormJournalPrecise,
		"journal-short-monotonic.txt":   FormJournalMono,
		"journal-short-delta.txt":       FormJournalDelta,
		"journal-short-full.txt":        FormJournalFull,
		"journal-short-iso-precise.txt": FormJournalISOPrec,
		"journal-short-unix.txt":        FormJournalUnix,
		"journal-json.txt":              FormJournalJSON,
		"journal-cat.txt":               FormBare,
	}
	files, _ := filepath.Glob("testdata/replay/*.txt")
	if len(files) != len(forms) {
		t.Fatalf("%d fixtures, %d forms: %v", len(files), len(forms), files)
	}
	want, _ := replayFile(t, "testdata/replay/dmesg.txt")
	for _, c := range []string{`"type":"KernelDeadlock"`, `"type":"ReadonlyFilesystem"`, `"type":"VerityCorruption"`} {
		if !slices.ContainsFunc(want, func(a string) bool { return strings.Contains(a, c) }) {
			t.Fatalf("plain dmesg gives no %s:\n%s", c, strings.Join(want, "\n"))
		}
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			got, st := replayFile(t, f)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("actions:\n%s\nwant (plain dmesg):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if wf := forms[filepath.Base(f)]; !slices.Equal(st.Forms, []Form{wf}) || st.Unknown != 0 || st.Lines != 7 || st.Skipped != 0 {
				t.Errorf("stats %+v, want form %q, 7 lines, none unknown or skipped", st, wf)
			}
		})
	}
}

// A line in no known form is counted and named, never taken for a message
// that did not match.
func TestReplayUnknownForm(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, in string
		unknown  int
		first    string
		actions  int
	}{
		// A log shipper's form: every line unknown, the first named.
		{"shipper", "2026-12-02 19:07:04.278 node-1 kernel: INFO: task kubelet:1 blocked for more than 120 seconds.\n2026-12-02 19:07:05.000 node-1 kernel: x\n", 2, `line 1: "2026-12-02 19:07:04.278 node-1 kernel: INFO: task kubelet:1 blocked for more than 120 seconds."`, 0},
		// dmesg lines, then pasted garbage: the garbage is unknown, the
		// dmesg lines count; an indented line continues the message.
		{"mixed", "[    1.000000] EXT4-fs (sda1): Remounting filesystem read-only\n  continued\nINFO: task kubelet:1 blocked for more than 120 seconds.\n", 1, `line 3: "INFO: task kubelet:1 blocked for more than 120 seconds."`, 1},
		// Bare messages (dmesg -t): every line is a message.
		{"bare", "[drm] Initialized\nINFO: task kubelet:1 blocked for more than 120 seconds.\n", 0, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name)
			os.WriteFile(p, []byte(tc.in), 0o644)
			got, st := replayFile(t, p)
			if st.Unknown != tc.unknown || st.FirstUnknown != tc.first || len(got) != tc.actions {
				t.Errorf("stats %+v, actions %v; want %d unknown, first %s, %d actions", st, got, tc.unknown, tc.first, tc.actions)
			}
		})
	}
}

// Any input replays without a crash, and every line is counted once.
func FuzzReplay(f *testing.F) {
	for _, p := range []string{"dmesg-T-x.txt", "journal-json.txt", "dmesg-reltime.txt", "kmsg-raw.txt"} {
		b, _ := os.ReadFile("testdata/replay/" + p)
		f.Add(b)
	}
	if b, err := os.ReadFile("testdata/multiline/dmesg-T.txt"); err == nil {
		f.Add(b) // indented continuation lines
	}
	f.Add([]byte("[  +9999999999999.9] x\n[<99999999999999.999999>] y\n1796238424.278559 h kernel: z\n"))
	o := opts(f, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		o.Store = report.NewStore("replay")
		st, err := Replay(strings.NewReader(string(b)), NewMonitor(o), func(Action) {})
		if errors.Is(err, errUTF16) && (b[0] == 0xff && b[1] == 0xfe || b[0] == 0xfe && b[1] == 0xff) {
			return // refused, naming it
		}
		if err != nil {
			t.Fatal(err) // only a read error, or UTF-16, ends a replay
		}
		if st.Unknown > st.Lines || st.Skipped > st.Lines || (st.Unknown > 0) != (st.FirstUnknown != "") {
			t.Fatalf("stats %+v", st)
		}
	})
}

// A record of several lines (the NVIDIA driver's GPU that fell off the bus
// as it loads, GpuFallenOffBus's three lines) is one record in the kernel
// log, which the daemon matches whole; dmesg and journalctl print its
// lines after the first indented. Captured from this machine's real dmesg
// of the record written to /dev/kmsg (testdata/multiline/): each form
// sets the condition, as the raw record does, with the kernel's message.
// Before, the indented lines were skipped, and a replay of the dmesg of a
// node whose GPU fell off the bus said nothing.
func TestReplayJoinsAMultiLineRecord(t *testing.T) {
	const want = `{"kind":"condition","type":"GpuFallenOffBus","status":"True","reason":"GpuFellOffBus","message":"NVRM: The NVIDIA GPU 0000:3b:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands."}`
	// Each also with CRLF line ends (a capture saved or passed through a
	// Windows tool): the same action (before, each continuation line kept
	// its \r: "has\x0d\x0aNVRM: fallen off ...").
	var files []string
	for _, f := range []string{"kmsg-raw.txt", "dmesg.txt", "dmesg-T.txt", "dmesg-x.txt"} {
		files = append(files, f, f+" with CRLF")
	}
	for _, f := range files {
		name, crlf := strings.CutSuffix(f, " with CRLF")
		b, err := os.ReadFile(filepath.Join("testdata/multiline", name))
		if err != nil {
			t.Fatal(err)
		}
		if crlf {
			b = bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
		}
		in := bytes.NewReader(b)
		o := opts(t, report.NewStore("replay"))
		o.GPU = true // as kmsg replay's monitor is
		var got []string
		st, err := Replay(in, NewMonitor(o), func(a Action) {
			b, _ := json.Marshal(a)
			got = append(got, string(b))
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: actions %q, want [%s]", f, got, want)
		}
		if st.Unknown != 0 {
			t.Errorf("%s: %d unknown lines (%s)", f, st.Unknown, st.FirstUnknown)
		}
	}
}

// A capture saved by an editor that writes a byte order mark: UTF-8's
// (EF BB BF) is dropped, and the capture reads as the form it is; before,
// the mark made the first line no known form's, the whole capture was read
// as bare messages, and a dmesg capture with a ReadonlyFilesystem line gave
// no action at all. UTF-16 (PowerShell's redirection writes it) is refused,
// naming it and the conversion, rather than read as bare messages that
// match nothing.
func TestReplayByteOrderMark(t *testing.T) {
	plain, err := os.ReadFile("testdata/replay/dmesg.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := replayFile(t, "testdata/replay/dmesg.txt")
	p := filepath.Join(t.TempDir(), "bom.txt")
	if err := os.WriteFile(p, append([]byte("\xef\xbb\xbf"), plain...), 0o644); err != nil {
		t.Fatal(err)
	}
	got, st := replayFile(t, p)
	if strings.Join(got, "\n") != strings.Join(want, "\n") || !slices.Equal(st.Forms, []Form{FormDmesg}) || st.Unknown != 0 {
		t.Errorf("UTF-8 with a BOM: stats %+v, actions:\n%s\nwant (plain dmesg):\n%s", st, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	units := utf16.Encode([]rune(string(plain)))
	for _, tc := range []struct {
		name string
		put  func([]byte, uint16)
		bom  []byte
	}{
		{"UTF-16LE", func(b []byte, u uint16) { b[0], b[1] = byte(u), byte(u>>8) }, []byte{0xff, 0xfe}},
		{"UTF-16BE", func(b []byte, u uint16) { b[0], b[1] = byte(u>>8), byte(u) }, []byte{0xfe, 0xff}},
	} {
		in := slices.Clone(tc.bom)
		for _, u := range units {
			var b [2]byte
			tc.put(b[:], u)
			in = append(in, b[:]...)
		}
		var actions int
		_, err := Replay(strings.NewReader(string(in)), NewMonitor(opts(t, report.NewStore("replay"))), func(Action) { actions++ })
		const wantErr = "the input is UTF-16 (its byte order mark): convert it first, e.g. iconv -f UTF-16 -t UTF-8"
		if err == nil || err.Error() != wantErr || actions != 0 {
			t.Errorf("%s: %v, %d actions; want %q", tc.name, err, actions, wantErr)
		}
	}
}

// journalctl's forms that print an entry's fields (export, verbose) or
// frame each JSON object (json-seq, json-sse), captured from the real
// journalctl (testdata/replay/unread/capture.sh: a hung kubelet and a
// read-only remount), are refused naming the form and what replay does
// read. Before, each was read as bare messages ("message only") that
// matched nothing: 0 actions, as for a healthy node.
func TestReplayRefusesJournalFormsItDoesNotRead(t *testing.T) {
	for _, tc := range []struct{ file, form string }{
		{"journal-export.txt", "journalctl -o export"},
		{"journal-verbose.txt", "journalctl -o verbose"},
		{"journal-json-seq.txt", "journalctl -o json-seq"},
		{"journal-json-sse.txt", "journalctl -o json-sse"},
		{"journal-json-pretty.txt", "journalctl -o json-pretty"},
	} {
		f, err := os.Open(filepath.Join("testdata/replay/unread", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		var actions int
		_, err = Replay(f, NewMonitor(opts(t, report.NewStore("replay"))), func(Action) { actions++ })
		f.Close()
		want := "the input is " + tc.form + "'s output, which kmsg replay does not read: capture the kernel log with journalctl -k -o json (or -o short-monotonic), or dmesg"
		if err == nil || err.Error() != want || actions != 0 {
			t.Errorf("%s: %v, %d actions; want %q", tc.file, err, actions, want)
		}
	}
}

// A capture in UTF-32 (iconv -t UTF-32 writes 0xff 0xfe 0x00 0x00 first,
// whose start is UTF-16's mark) is named UTF-32, and one with UTF-16's mark
// before UTF-8 text is told to remove the mark: before, each was told to
// convert from UTF-16, which turns UTF-32 into text with a NUL byte after
// every character and UTF-8 into CJK characters (config does the same,
// TestBadConfigs).
func TestReplayByteOrderMarkNotUTF16(t *testing.T) {
	plain, err := os.ReadFile("testdata/replay/dmesg.txt")
	if err != nil {
		t.Fatal(err)
	}
	utf32 := func(bom []byte, put func([]byte, rune)) []byte {
		in := slices.Clone(bom)
		for _, r := range string(plain) {
			var b [4]byte
			put(b[:], r)
			in = append(in, b[:]...)
		}
		return in
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"UTF-32LE", utf32([]byte{0xff, 0xfe, 0, 0}, func(b []byte, r rune) { b[0], b[1], b[2], b[3] = byte(r), byte(r>>8), byte(r>>16), byte(r>>24) }),
			"the input is UTF-32 (its byte order mark): convert it first, e.g. iconv -f UTF-32 -t UTF-8"},
		{"UTF-32BE", utf32([]byte{0, 0, 0xfe, 0xff}, func(b []byte, r rune) { b[0], b[1], b[2], b[3] = byte(r>>24), byte(r>>16), byte(r>>8), byte(r) }),
			"the input is UTF-32 (its byte order mark): convert it first, e.g. iconv -f UTF-32 -t UTF-8"},
		{"UTF-16LE's mark before UTF-8", append([]byte{0xff, 0xfe}, plain...),
			"the input starts with UTF-16's byte order mark but is not UTF-16 (no NUL byte): remove the mark's two bytes, e.g. tail -c +3"},
		{"UTF-16BE's mark before UTF-8", append([]byte{0xfe, 0xff}, plain...),
			"the input starts with UTF-16's byte order mark but is not UTF-16 (no NUL byte): remove the mark's two bytes, e.g. tail -c +3"},
	} {
		var actions int
		_, err := Replay(strings.NewReader(string(tc.in)), NewMonitor(opts(t, report.NewStore("replay"))), func(Action) { actions++ })
		if err == nil || err.Error() != tc.want || actions != 0 {
			t.Errorf("%s: %v, %d actions; want %q", tc.name, err, actions, tc.want)
		}
	}
}
