package tamper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/syself/autopilot-health/report"
)

// README ("Tamper conditions") promises that a tamper.json moved aside goes
// to the next tamper.json.corrupt.N in order and that the newest 5 are
// kept, as for state.json: a baseline corrupted at every start does not
// fill the state directory. Eight corrupt loads leave .corrupt.3 to .7,
// the newest, and the load that removed one says so.
func TestCorruptTamperStatesKeepTheNewest(t *testing.T) {
	dir := t.TempDir()
	p := StatePath(dir)
	for i := range 8 {
		if err := os.WriteFile(p, fmt.Appendf(nil, `{"version":1,"baseline":%d`, i), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadState(dir)
		var ce *CorruptError
		if !errors.As(err, &ce) {
			t.Fatalf("load %d: %v, want a CorruptError", i, err)
		}
		if want := p + ".corrupt"; i > 0 {
			want = fmt.Sprintf("%s.corrupt.%d", p, i)
			if ce.MovedTo != want {
				t.Fatalf("load %d moved it to %s, want %s", i, ce.MovedTo, want)
			}
		}
		if removed := i >= report.KeepAside; removed != (len(ce.Removed) == 1) ||
			removed != strings.Contains(err.Error(), "removed 1 older moved aside, keeping the newest 5") {
			t.Errorf("load %d: removed %q: %v", i, ce.Removed, err)
		}
	}
	names, err := filepath.Glob(p + ".corrupt*")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for n := 3; n <= 7; n++ {
		want = append(want, fmt.Sprintf("%s.corrupt.%d", p, n))
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("left %q, want the newest 5: %q", names, want)
	}
	if b, err := os.ReadFile(p + ".corrupt.7"); err != nil || string(b) != `{"version":1,"baseline":7` {
		t.Errorf("the newest moved aside holds %q, %v", b, err)
	}
}
