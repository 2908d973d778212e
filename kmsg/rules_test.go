package kmsg

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
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
				rec, _, skip := ParseLine([]byte(line[2:]))
				if skip {
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

func TestEveryRuleHasAnAnchor(t *testing.T) {
	rs, _ := Compile(DefaultRules, DefaultCriticalTasks)
	if len(rs.always) > 0 {
		for _, i := range rs.always {
			t.Errorf("rule %s has no literal anchor: it would run its regexp on every line", rs.rules[i].Name)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	for _, tc := range []struct {
		r    Rule
		want string
	}{
		{Rule{Name: "X", Kind: Perm, Condition: "DiskUsageHigh", Reason: "FilesystemSpaceHigh", Pattern: "x"}, `kmsg rule X: condition "DiskUsageHigh" is not a kernel-log condition`},
		{Rule{Name: "X", Kind: Perm, Condition: "KernelDeadlock", Reason: "Nope", Pattern: "x"}, `kmsg rule X: reason "Nope" is not a reason of KernelDeadlock (want CriticalTaskHung)`},
		{Rule{Name: "X", Kind: Temp, Reason: "OOMKilling", Pattern: "x"}, `kmsg rule X: event reason "OOMKilling" is not in the catalog`},
		{Rule{Name: "X", Kind: "sometimes", Reason: "IOError", Pattern: "x"}, `kmsg rule X: kind "sometimes", want perm or temp`},
		{Rule{Name: "X", Kind: Temp, Reason: "IOError", Pattern: "("}, "kmsg rule X: pattern: error parsing regexp"},
		{Rule{Kind: Temp, Reason: "IOError", Pattern: "x"}, "kmsg rule without a name"},
	} {
		_, err := Compile([]Rule{tc.r}, nil)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Compile(%+v) = %v, want %s...", tc.r, err, tc.want)
		}
	}
	if _, err := Compile([]Rule{DefaultRules[0], DefaultRules[0]}, nil); err == nil || !strings.Contains(err.Error(), "defined twice") {
		t.Errorf("duplicate: %v", err)
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
