package kmsg

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// The cursor's window goes into the state file as one string and comes
// back the same: devices interleaved, equal and decreasing times, a
// device name with blanks (written with underscores).
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
	c := cursor{Seq: 1, Have: true, IOErrors: []ioError{{Usec: 5, Dev: "my disk"}, {Usec: 6, Dev: ""}}}
	b, _ := json.Marshal(c)
	var back cursor
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.IOErrors, []ioError{{Usec: 5, Dev: "my_disk"}, {Usec: 6, Dev: "?"}}) {
		t.Errorf("blank names: %+v, %v (%s)", back, err, b)
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
	for _, bad := range []string{"12 @sda", "@ 12", "@sda x", "@sda 5 -6", "@sda -5", "@sda 18446744073709551615 1"} {
		if err := json.Unmarshal([]byte(`{"seq":1,"have":true,"ioErrorWindow":"`+bad+`"}`), &c); err == nil {
			t.Errorf("window %q read", bad)
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
