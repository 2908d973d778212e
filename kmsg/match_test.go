package kmsg

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

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
		{Rule{Name: "X", Kind: Perm, Reason: "FilesystemIsReadOnly", Pattern: "x"}, `kmsg rule X: a rule of kind perm sets a condition: name it, condition = one of ReadonlyFilesystem, `},
		{Rule{Name: "X", Kind: Perm, Condition: "KernelDeadlock", Reason: "Nope", Pattern: "x"}, `kmsg rule X: reason "Nope" is not a reason of KernelDeadlock (want CriticalTaskHung)`},
		{Rule{Name: "X", Kind: Temp, Reason: "OOMKilling", Pattern: "x"}, `kmsg rule X: event reason "OOMKilling" is not a kernel-log event of the catalog`},
		{Rule{Name: "X", Kind: Temp, Reason: "TamperCleared", Pattern: "x"}, `kmsg rule X: event reason "TamperCleared" is not a kernel-log event of the catalog`},
		{Rule{Name: "X", Kind: "sometimes", Reason: "IOError", Pattern: "x"}, `kmsg rule X: kind "sometimes", want perm, temp or disk-io-error`},
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

// manyRules returns n custom temp rules named Custom000.. that all match
// "wedged disk sdq: status 7". anchored: each has the literal anchor
// "wedged disk"; otherwise none has a literal of two bytes or more, so each
// is a candidate on every line.
func manyRules(n int, anchored bool) []Rule {
	rules := make([]Rule, n)
	for i := range rules {
		p := fmt.Sprintf(`^[a-z]+ [a-z]+ \w+:\s\w+ [0-%d]`, 7+i%3)
		if anchored {
			p = fmt.Sprintf(`^wedged disk \w+: status [0-%d]`, 7+i%3)
		}
		rules[i] = Rule{Name: fmt.Sprintf("Custom%03d", i), Kind: Temp, Reason: "IOError", Pattern: p}
	}
	return rules
}

// Every rule that matches a line is reported, however many there are: no
// fixed bound on the candidates (there was one of 8).
func TestAnyNumberOfRulesMatchOneLine(t *testing.T) {
	for _, tc := range []struct {
		n        int
		anchored bool
	}{
		{20, false}, {20, true},
		// Past the bitset Matches keeps on its stack.
		{64*stackWords + 44, false}, {64*stackWords + 44, true},
	} {
		t.Run(fmt.Sprintf("%d anchored=%v", tc.n, tc.anchored), func(t *testing.T) {
			rules := append(manyRules(tc.n, tc.anchored), DefaultRules...)
			rs, err := Compile(rules, DefaultCriticalTasks)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(rs.always); tc.anchored != (got == 0) {
				t.Fatalf("%d rules without an anchor", got)
			}
			for range 2 { // the second time with a reused candidate set
				ms := rs.Matches(nil, []byte("wedged disk sdq: status 7"))
				if len(ms) != tc.n {
					t.Errorf("%d of %d rules matched", len(ms), tc.n)
				}
				for i, m := range ms {
					if want := fmt.Sprintf("Custom%03d", i); m.Rule.Name != want {
						t.Fatalf("match %d is %s, want %s (rule order)", i, m.Rule.Name, want)
					}
				}
				if ms := rs.Matches(nil, []byte("EXT4-fs error (device sda1): ext4_find_entry:1455")); len(ms) != 1 || ms[0].Rule.Name != "Ext4Error" {
					t.Errorf("a built-in rule after the custom ones: %+v", ms)
				}
			}
		})
	}
}

// Matches keeps no state between calls: concurrent callers each get their
// own matches (run with -race).
func TestMatchesConcurrently(t *testing.T) {
	for _, n := range []int{20, 64*stackWords + 1} {
		rs, err := Compile(append(manyRules(n, false), DefaultRules...), DefaultCriticalTasks)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				line, want := []byte("wedged disk sdq: status 7"), n
				if g%2 == 1 {
					line, want = []byte("INFO: task kubelet:128 blocked for more than 120 seconds."), 2
				}
				var ms []Match
				for range 200 {
					if ms = rs.Matches(ms[:0], line); len(ms) != want {
						t.Errorf("%d rules: %d matches on %q, want %d", n, len(ms), line, want)
						return
					}
				}
			})
		}
		wg.Wait()
	}
}

// Matching a line that no rule matches does not allocate, with rule sets on
// either side of the bitset Matches keeps on its stack.
func TestMatchesDoesNotAllocate(t *testing.T) {
	for _, n := range []int{0, 64*stackWords + 1} {
		rs, err := Compile(append(manyRules(n, true), DefaultRules...), DefaultCriticalTasks)
		if err != nil {
			t.Fatal(err)
		}
		line := []byte("IPv6: ADDRCONF(NETDEV_CHANGE): lxc8f2a1c3b4d5e: link becomes ready")
		var dst []Match
		rs.Matches(dst, line) // fill the pool
		if a := testing.AllocsPerRun(100, func() { dst = rs.Matches(dst[:0], line) }); a != 0 {
			t.Errorf("%d extra rules: %v allocations per non-matching line", n, a)
		}
	}
}

// Matches alone, on the benchmark's non-matching lines and its matching ones.
func BenchmarkMatches(b *testing.B) {
	for _, n := range []int{0, 20} {
		rs, err := Compile(append(manyRules(n, false), DefaultRules...), DefaultCriticalTasks)
		if err != nil {
			b.Fatal(err)
		}
		var msgs [][]byte
		for _, s := range append(append([]string(nil), nonMatching...), matching...) {
			r, err := ParseRecord([]byte(s))
			if err != nil {
				b.Fatal(err)
			}
			msgs = append(msgs, Unescape(nil, r.Message))
		}
		b.Run(fmt.Sprintf("unanchored=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var dst []Match
			for i := 0; b.Loop(); i++ {
				dst = rs.Matches(dst[:0], msgs[i%len(msgs)])
			}
		})
	}
}

// A critical_tasks pattern: each * any run of characters, the rest literal.
func TestTaskMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"kubelet", "kubelet", true},
		{"kubelet", "kubeletx", false},
		{"kubelet", "kube", false},
		{"containerd-shim*", "containerd-shim", true},
		{"containerd-shim*", "containerd-shim-runc-v2", true},
		{"containerd-shim*", "containerd", false},
		{"runc:*", "runc:[2:INIT]", true},
		{"runc:[2:INIT]", "runc:[2:INIT]", true},
		{"runc:[2:INIT]", "runc:2", false},
		{"CPU */KVM", "CPU 0/KVM", true},
		{"CPU */KVM", "CPU 127/KVM", true},
		{"CPU */KVM", "CPU /KVM", true},
		{"CPU */KVM", "CPU 0/TCG", false},
		{"CPU */KVM", "CPU/KVM", false},
		{"CPU */KVM", "CPU 0/KVMx", false},
		{"*", "anything", true},
		{"*", "", true},
		{"*/KVM", "/KVM", true},
		{"a*b*c", "abc", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "acb", false},
		{"a*bc*bc", "abcbc", true},
		{"a*bc*bc", "abc", false},
		{"ab*ba", "aba", false},
	} {
		if got := TaskMatch(c.pattern, c.name); got != c.want {
			t.Errorf("TaskMatch(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}
