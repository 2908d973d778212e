package kmsg

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

func replayBytes(t *testing.T, b []byte) ([]string, ReplayStats, error) {
	t.Helper()
	var got []string
	st, err := Replay(bytes.NewReader(b), NewMonitor(opts(t, report.NewStore("replay"))), func(a Action) {
		j, _ := json.Marshal(a)
		got = append(got, string(j))
	})
	return got, st, err
}

// Each pasted form gives the same actions with CRLF line endings (a paste
// through a Windows terminal or a ticket) and without its last newline.
func TestReplayCRLFAndPartialLastLine(t *testing.T) {
	want, _ := replayFile(t, "testdata/replay/dmesg.txt")
	files, _ := filepath.Glob("testdata/replay/*.txt")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for name, in := range map[string][]byte{
			"crlf":    bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")),
			"partial": bytes.TrimSuffix(b, []byte("\n")),
		} {
			t.Run(filepath.Base(f)+"/"+name, func(t *testing.T) {
				got, st, err := replayBytes(t, in)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) || st.Unknown != 0 || st.Lines != 7 {
					t.Errorf("stats %+v actions:\n%s\nwant:\n%s", st, strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			})
		}
	}
}

// Lines of several forms pasted together (dmesg, then journalctl -k, then
// raw records) are each read in their own form.
func TestReplayMixedForms(t *testing.T) {
	var in []byte
	for _, f := range []string{"dmesg-T.txt", "journal-short-iso.txt", "kmsg-raw.txt", "journal-json.txt"} {
		b, err := os.ReadFile("testdata/replay/" + f)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, b...)
	}
	_, st, err := replayBytes(t, in)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unknown != 0 || st.Lines != 28 || len(st.Forms) != 4 {
		t.Errorf("stats %+v, want 28 lines in 4 forms, none unknown", st)
	}
}

// A line longer than the reader's limit (a pasted binary blob, a journal
// JSON record with a huge field) is counted as unknown and named; the lines
// after it are still read.
func TestReplayHugeLine(t *testing.T) {
	b, err := os.ReadFile("testdata/replay/dmesg.txt")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := replayFile(t, "testdata/replay/dmesg.txt")
	huge := append([]byte("[    0.000000] "), bytes.Repeat([]byte("x"), 2<<20)...)
	in := slices.Concat(huge, []byte("\n"), b)
	got, st, err := replayBytes(t, in)
	if err != nil {
		t.Fatalf("a huge line ends the replay: %v", err)
	}
	if !slices.Equal(got, want) || st.Lines != 8 || st.Unknown != 1 || !strings.HasPrefix(st.FirstUnknown, "line 1: ") {
		t.Errorf("stats %+v actions:\n%s\nwant:\n%s", st, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Lines of exactly the limit are read; one byte more is too long.
func TestReplayLineReaderLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		long []bool
	}{
		{strings.Repeat("a", maxLine) + "\nb", []int{maxLine, 1}, []bool{false, false}},
		{strings.Repeat("a", maxLine+1) + "\nb\n", []int{maxLine, 1}, []bool{true, false}},
		{strings.Repeat("a", maxLine+1), []int{maxLine}, []bool{true}},
		{"\n\nx", []int{0, 0, 1}, []bool{false, false, false}},
		{"", nil, nil},
	} {
		lr := lineReader{r: bufio.NewReaderSize(strings.NewReader(tc.in), 64*1024)}
		var got []int
		var long []bool
		for {
			b, l, err := lr.next()
			if err != nil {
				t.Fatal(err)
			}
			if b == nil {
				break
			}
			got, long = append(got, len(b)), append(long, l)
		}
		if !slices.Equal(got, tc.want) || !slices.Equal(long, tc.long) {
			t.Errorf("%.20q...: lengths %v long %v, want %v %v", tc.in, got, long, tc.want, tc.long)
		}
	}
}
