package checks

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// journalFixture returns the lines of testdata/journal/kubelet.json, real
// journalctl output (see the README beside it).
func journalFixture(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile("testdata/journal/kubelet.json")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func TestParseJournalLineCaptured(t *testing.T) {
	lines := journalFixture(t)
	if len(lines) != 10 {
		t.Fatalf("%d lines in the fixture, want 10", len(lines))
	}
	klog := `E1202 19:00:00.000000    69 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`
	for _, tc := range []struct {
		line     int
		realtime int64
		messages []string
	}{
		{1, 1796238406913451, []string{`I1202 19:00:00.000000    69 server.go:487] "Kubelet version" kubeletVersion="v1.31.0"`}},
		{3, 1796238406913451, []string{klog}},
		{4, 1796238406913451, []string{"E1202 19:00:00.000000    69 kubelet.go:1 bad \xff\xfe utf8"}},
		{5, 1796238406914011, nil},
		{7, 1796238437952467, []string{`E1202 19:00:02.000000    74 kubelet_node_status.go:380] Unable to update node status: update node status exceeds retry count`}},
		{10, 1796238447647904, []string{"first of two", `E1202 19:00:04.000000       1 kubelet_node_status.go:536] "Unable to update node status" err="update node status exceeds retry count"`, "\xff\xfe"}},
	} {
		e, err := parseJournalLine([]byte(lines[tc.line-1]))
		if err != nil {
			t.Errorf("line %d: %v", tc.line, err)
			continue
		}
		if !strings.HasPrefix(e.Cursor, "s=3a7de8ba767941d7802f48f8d5767386;i=") {
			t.Errorf("line %d: cursor %q", tc.line, e.Cursor)
		}
		if want := time.UnixMicro(tc.realtime).UTC(); !e.Realtime.Equal(want) {
			t.Errorf("line %d: realtime %s, want %s", tc.line, e.Realtime, want)
		}
		var got []string
		for _, m := range e.Messages {
			got = append(got, string(m))
		}
		if strings.Join(got, "\x00") != strings.Join(tc.messages, "\x00") || len(got) != len(tc.messages) {
			t.Errorf("line %d: messages %q, want %q", tc.line, got, tc.messages)
		}
	}
}

func TestParseJournalLineRejects(t *testing.T) {
	for _, tc := range []struct{ line, err string }{
		{`-- No entries --`, "not a journal entry: invalid character"},
		{`{"MESSAGE":"x","__REALTIME_TIMESTAMP":"1"}`, "not a journal entry: no __CURSOR"},
		{`{"__CURSOR":"s=1","MESSAGE":"x"}`, "not a journal entry: no __REALTIME_TIMESTAMP"},
		{`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"soon"}`, `not a journal entry: __REALTIME_TIMESTAMP "soon" is not microseconds`},
		{`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"-5"}`, `not a journal entry: __REALTIME_TIMESTAMP "-5" is not microseconds`},
		{`{"__CURSOR":1,"__REALTIME_TIMESTAMP":"1"}`, "not a journal entry: json: cannot unmarshal number"},
		{`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1","MESSAGE":{"a":1}}`, `not a journal entry: MESSAGE: value {"a":1} is neither a string nor bytes`},
		{`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1","MESSAGE":[104,256]}`, "not a journal entry: MESSAGE: byte 1: 256 is not 0-255"},
		{`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1","MESSAGE":["a",true]}`, "not a journal entry: MESSAGE: value true is neither a string nor bytes"},
		{`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1","MESSAGE":["a",[1,"b"]]}`, "not a journal entry: MESSAGE: byte 1: \"b\" is not 0-255"},
	} {
		_, err := parseJournalLine([]byte(tc.line))
		if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want %q...", tc.line, err, tc.err)
		}
	}
}

func TestReadLineSkipsOverlong(t *testing.T) {
	in := "short\n" + strings.Repeat("x", 100) + "\nnext\r\nlast"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	var got []string
	for {
		line, overlong, err := readLine(br, 50)
		switch {
		case overlong:
			got = append(got, "<overlong>")
		case len(line) > 0:
			got = append(got, string(line))
		}
		if err != nil {
			break
		}
	}
	if want := []string{"short", "<overlong>", "next", "last"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", got, want)
	}
}

// journalctlLine is the line journalctl writes for an entry with one
// MESSAGE: a string when it is UTF-8, else an array of its bytes.
func journalctlLine(msg []byte) []byte {
	var m any = string(msg)
	if !utf8.Valid(msg) {
		nums := make([]int, len(msg))
		for i, b := range msg {
			nums[i] = int(b)
		}
		m = nums
	}
	mj, _ := json.Marshal(m)
	return fmt.Appendf(nil, `{"__CURSOR":"s=1;i=2","__REALTIME_TIMESTAMP":"1796238406913451","MESSAGE":%s}`, mj)
}

// FuzzParseJournalLine: no input panics; an entry is only returned with its
// cursor; and a MESSAGE written as journalctl writes it (string or bytes)
// comes back byte for byte.
func FuzzParseJournalLine(f *testing.F) {
	for _, l := range journalFixture(f) {
		f.Add([]byte(l), []byte("Unable to update node status"))
	}
	f.Add([]byte(`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1","MESSAGE":[]}`), []byte{0xff, 0})
	f.Add([]byte(`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1","MESSAGE":[[],null,"a"]}`), []byte(""))
	f.Add([]byte(`-- No entries --`), []byte("\n"))
	f.Fuzz(func(t *testing.T, line, msg []byte) {
		if e, err := parseJournalLine(line); err == nil && e.Cursor == "" {
			t.Fatalf("%q: entry without a cursor", line)
		}
		l := journalctlLine(msg)
		e, err := parseJournalLine(l)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		if len(e.Messages) != 1 || !bytes.Equal(e.Messages[0], msg) {
			t.Fatalf("%s: messages %q, want [%q]", l, e.Messages, msg)
		}
	})
}

func BenchmarkParseJournalLine(b *testing.B) {
	line := []byte(journalFixture(b)[2])
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := parseJournalLine(line); err != nil {
			b.Fatal(err)
		}
	}
}
