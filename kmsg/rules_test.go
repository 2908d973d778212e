package kmsg

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"
)

// Every rule has a fixture file of real-format kernel lines, positive (+)
// and negative (-), and matches exactly the positive ones.
func TestRuleFixtures(t *testing.T) {
	rs, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range DefaultRules {
		t.Run(r.Name, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", "rules", r.Name+".txt"))
			if err != nil {
				t.Fatalf("no fixture for rule %s: %v", r.Name, err)
			}
			defer f.Close()
			pos, neg := 0, 0
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				line := sc.Text()
				if line == "" || line[0] == '#' {
					continue
				}
				want := line[0] == '+'
				if want {
					pos++
				} else {
					neg++
				}
				l := ParseLine([]byte(line[2:]))
				rec := l.Record
				if l.Skip {
					t.Fatalf("fixture line skipped by the parser: %q", line)
				}
				msg := Unescape(nil, rec.Message)
				got := false
				for _, m := range rs.Matches(nil, msg) {
					got = got || m.Rule.Name == r.Name
				}
				if got != want {
					t.Errorf("%s on %q = %v, want %v", r.Name, msg, got, want)
				}
			}
			if pos < 2 || neg < 2 {
				t.Errorf("fixture has %d positive and %d negative lines; want at least 2 of each", pos, neg)
			}
		})
	}
}

func TestBuildRules(t *testing.T) {
	custom := []Rule{
		{Name: "IOError", Kind: Temp, Reason: "IOError", Pattern: `^mydrv: Buffer I/O error`},
		{Name: "MyDriver", Kind: Temp, Reason: "BlockIOError", Pattern: `^mydrv \S+: I/O error`},
	}
	rules, err := BuildRules([]string{"NvmeError"}, custom)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, r := range rules {
		names[r.Name] = r.Pattern
	}
	if _, ok := names["NvmeError"]; ok {
		t.Error("disabled rule still there")
	}
	if names["IOError"] != `^mydrv: Buffer I/O error` || names["MyDriver"] == "" || len(rules) != len(DefaultRules)+1-1 {
		t.Errorf("override/add: %v", names)
	}
	if _, err := BuildRules([]string{"Nope"}, nil); err == nil {
		t.Error("unknown disabled rule accepted")
	}
	rs, err := Compile(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ms := rs.Matches(nil, []byte("mydrv sdx: I/O error at 42")); len(ms) != 1 || ms[0].Rule.Name != "MyDriver" {
		t.Errorf("custom rule: %+v", ms)
	}
}
