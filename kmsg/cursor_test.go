package kmsg

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// The cursor's window goes into the state file as one string and comes
// back the same: devices interleaved, equal and decreasing times, device
// names with blanks, '@', '%' or nothing (escaped as URL paths).
func TestCursorWindowRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	devs := []string{"sda", "nvme0n1", "dm-3", "sdb"}
	for _, n := range []int{0, 1, 2, 7, 1024} {
		var es []ioError
		usec := uint64(r.Int64N(1 << 40))
		for range n {
			usec += uint64(r.Int64N(5000))
			if r.IntN(10) == 0 {
				usec -= uint64(r.Int64N(int64(min(usec, 3000))))
			}
			es = append(es, ioError{Usec: usec, Dev: devs[r.IntN(len(devs))]})
		}
		c := cursor{Seq: 42, Have: true, IOErrors: es}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back cursor
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%d entries: %v\n%s", n, err, b)
		}
		if back.Seq != 42 || !back.Have || len(back.IOErrors) != len(es) || (len(es) > 0 && !reflect.DeepEqual(back.IOErrors, es)) {
			t.Fatalf("%d entries: got %+v", n, back)
		}
	}
	// Names a custom rule's dev group may catch: blanks, '@', '%', none.
	names := []ioError{{Usec: 5, Dev: "my disk"}, {Usec: 6, Dev: ""}, {Usec: 7, Dev: "@x%20"}, {Usec: 8, Dev: "a\tb"}}
	b, _ := json.Marshal(cursor{Seq: 1, Have: true, IOErrors: names})
	var back cursor
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.IOErrors, names) {
		t.Errorf("odd names: %+v, %v (%s)", back, err, b)
	}
}

// A state file written before keeps its window as an array of objects:
// it is read back.
func TestCursorReadsTheEarlierWindow(t *testing.T) {
	var c cursor
	if err := json.Unmarshal([]byte(`{"seq":9,"have":true,"ioErrors":[{"usec":100,"dev":"sda"},{"usec":250,"dev":"sdb"}]}`), &c); err != nil {
		t.Fatal(err)
	}
	if want := (cursor{Seq: 9, Have: true, IOErrors: []ioError{{100, "sda"}, {250, "sdb"}}}); !reflect.DeepEqual(c, want) {
		t.Errorf("got %+v", c)
	}
	// A window that does not decode costs the window, never the position.
	for _, bad := range []string{"12 @sda", "@%zz 12", "@sda x", "@sda 5 -6", "@sda -5", "@sda 18446744073709551615 1"} {
		var c cursor
		if err := json.Unmarshal([]byte(`{"seq":7,"have":true,"ioErrorWindow":"`+bad+`"}`), &c); err != nil || c.Seq != 7 || !c.Have || c.IOErrors != nil || c.windowErr == nil {
			t.Errorf("window %q: %+v, %v", bad, c, err)
		}
	}
}

// Through the reader: a state file whose window is malformed resumes after
// its cursor all the same (records 6-8 of 1-8 after seq 5), whether it
// reads from the boot's start or not, and says the window was lost.
//
// Counts of suppressed lines that do not decode cost those counts alone:
// the log says so, and not that the window (read whole) was lost.
func TestMalformedWindowKeepsTheCursor(t *testing.T) {
	for _, tc := range []struct {
		fromStart  bool
		memo, want string
		notWant    string
	}{
		{false, `"ioErrorWindow":"@sda 5 x"`, "the saved disk I/O error window is unreadable", ""},
		{true, `"ioErrorWindow":"@sda 5 x"`, "the saved disk I/O error window is unreadable", ""},
		{false, `"ioErrorWindow":"@sda 5","ioErrorSuppressed":"12:x"`, "the saved counts of I/O error lines the kernel suppressed are unreadable", "window is unreadable"},
	} {
		fromStart := tc.fromStart
		dir := t.TempDir()
		sf := `{"version":1,"bootID":"b","savedAt":"2026-01-01T00:00:00Z","conditions":[],"memos":{"kmsg":{"seq":5,"have":true,` + tc.memo + `}}}`
		if err := os.WriteFile(filepath.Join(dir, report.StateFileName), []byte(sf), 0o600); err != nil {
			t.Fatal(err)
		}
		store := report.NewStore("b")
		if res, _ := store.Load(dir); res.Corrupt != nil {
			t.Fatal(res.Corrupt)
		}
		var recs [][]byte
		for seq := 1; seq <= 8; seq++ {
			recs = append(recs, fmt.Appendf(nil, "6,%d,%d,-;ordinary chatter\n", seq, seq))
		}
		dev := &fakeDevice{recs: recs}
		mon, logs := readAllThenStop(t, store, dev, dev, fromStart)
		if n := mon.Metrics().Records(); n != 3 {
			t.Errorf("from_boot_start %v: %v records handled, want 3 (6-8)", fromStart, n)
		}
		if !strings.Contains(logs, tc.want) || tc.notWant != "" && strings.Contains(logs, tc.notWant) {
			t.Errorf("from_boot_start %v, %s: want %q logged (and not %q):\n%s", fromStart, tc.memo, tc.want, tc.notWant, logs)
		}
	}
}

// A full window (1,024 errors of one device a millisecond apart) in the
// state file's indented JSON is a few KB (README, "Kernel log monitor").
func TestCursorFullWindowSize(t *testing.T) {
	var es []ioError
	for i := range 1024 {
		es = append(es, ioError{Usec: 86_400_000_000 + uint64(i)*1000, Dev: "nvme0n1"})
	}
	b, err := json.MarshalIndent(map[string]any{"memos": map[string]any{CursorKey: cursor{Seq: 1 << 20, Have: true, IOErrors: es}}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 7000 {
		t.Errorf("a full window takes %d bytes of the state file:\n%.300s", len(b), b)
	}
	if !strings.Contains(string(b), `"ioErrorWindow": "@nvme0n1 86400000000 1000 1000`) {
		t.Errorf("%.300s", b)
	}
}

// FuzzDecodeWindow: whatever the state file holds, reading the window
// returns an error or entries that write and read back the same.
func FuzzDecodeWindow(f *testing.F) {
	f.Add("@sda 100 5 -3 @nvme0n1 0 7")
	f.Add("@sda 18446744073709551615 1")
	f.Fuzz(func(t *testing.T, s string) {
		es, err := decodeWindow(s)
		if err != nil {
			return
		}
		back, err := decodeWindow(encodeWindow(es))
		if err != nil || len(back) != len(es) {
			t.Fatalf("%q: %v -> %v, %v", s, es, back, err)
		}
		for i := range es {
			if back[i].Usec != es[i].Usec {
				t.Fatalf("%q: %v -> %v", s, es, back)
			}
		}
	})
}
