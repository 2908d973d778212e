package kmsg

import (
	"bytes"
	"fmt"
	"math/bits"
	"regexp"
	"regexp/syntax"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/syself/autopilot-health/report"
)

// compiled is a rule ready to match.
type compiled struct {
	Rule
	re      *regexp.Regexp
	taskIdx int   // index of the "task" group, or -1
	pidIdx  int   // index of the "pid" group, or -1
	devIdx  []int // indices of the groups named "dev"
	anchors [][]byte
}

// RuleSet matches a message against every rule. Matching a line that no
// rule can match does not allocate: each rule has a literal anchor that
// every match must contain; a single pass over the line with a table of the
// anchors' first two bytes finds the candidate rules, and only those run
// their regular expression. The candidates are a bitset over the rule
// indices, so any number of rules can be candidates at once. A RuleSet is
// not changed after Compile; Matches is safe for concurrent use.
type RuleSet struct {
	rules []compiled
	// words is the length of the candidate bitset: one bit per rule.
	words int
	// scratch holds candidate bitsets (*[]uint64 of length words) for rule
	// sets too large for the one Matches keeps on its stack.
	scratch sync.Pool
	// bigram[b0<<8|b1] lists the anchors that start with b0 b1.
	bigram map[uint16][]anchorRef
	// first holds bit b0<<8|b1 for every bigram that starts an anchor.
	first [1 << 16 / 64]uint64
	// always lists the rules without an anchor (run on every line).
	always []int
	// criticalTasks for KernelDeadlock; a * matches any run of characters.
	criticalTasks []string
	// podVolume is the index of PodVolumeRule among rules (never a
	// candidate: it has no pattern), or -1 when it is disabled.
	podVolume int
}

// PodVolumeEvents reports whether a ReadonlyFilesystem line on a pod's
// volume is a PodVolumeReadOnly event (PodVolumeRule not disabled).
func (rs *RuleSet) PodVolumeEvents() bool { return rs != nil && rs.podVolume >= 0 }

// Compile validates and compiles rules. Every perm rule must name a catalog
// condition and one of its True reasons; every temp rule a catalog event
// reason.
func Compile(rules []Rule, criticalTasks []string) (*RuleSet, error) {
	rs := &RuleSet{bigram: map[uint16][]anchorRef{}, criticalTasks: criticalTasks, podVolume: -1}
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Name == "" {
			return nil, fmt.Errorf("kmsg rule without a name")
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("kmsg rule %s: defined twice", r.Name)
		}
		seen[r.Name] = true
		// PodVolumeReadOnly names the pod volume lines of ReadonlyFilesystem
		// (its events, its series of the match counter): no other rule may
		// take the name, and the kind is that rule's alone: a copy of it
		// in the configuration, field for field, is no exception.
		if r.Kind == PodVolume || r.Name == PodVolumeRule.Name {
			if r != PodVolumeRule { // builtin included: a copy is not it
				return nil, fmt.Errorf("kmsg rule %s: the name %s and the kind %s are the built-in rule's that makes a ReadonlyFilesystem line on a pod's volume a %s event; it cannot be replaced or copied (kmsg.disable = [%q] turns those events off)",
					r.Name, PodVolumeRule.Name, PodVolume, PodVolumeRule.Reason, PodVolumeRule.Name)
			}
			rs.podVolume = len(rs.rules)
			rs.rules = append(rs.rules, compiled{Rule: r, taskIdx: -1, pidIdx: -1})
			continue
		}
		switch r.Kind {
		case Perm:
			if r.Condition == "" {
				return nil, fmt.Errorf("kmsg rule %s: a rule of kind perm sets a condition: name it, condition = one of %s (or kind = \"temp\" for an event)", r.Name, strings.Join(kmsgConditions(), ", "))
			}
			d, ok := report.Lookup(r.Condition)
			if !ok || d.Source != report.SourceKmsg {
				return nil, fmt.Errorf("kmsg rule %s: condition %q is not a kernel-log condition (want one of %s)", r.Name, r.Condition, strings.Join(kmsgConditions(), ", "))
			}
			if !d.ValidReason(report.StatusTrue, report.Reason(r.Reason)) {
				return nil, fmt.Errorf("kmsg rule %s: reason %q is not a reason of %s (want %s)", r.Name, r.Reason, r.Condition, report.JoinReasons(d.ProblemReasons, ", "))
			}
		case Temp, DiskIOError:
			// A condition on an event's rule was dropped unseen: the rule
			// never set it, whatever its author meant.
			if r.Condition != "" {
				return nil, fmt.Errorf("kmsg rule %s: condition %q is for kind perm: a rule of kind %s emits its event reason (%q) and sets no condition", r.Name, r.Condition, r.Kind, r.Reason)
			}
			if e, ok := report.LookupEvent(r.Reason); !ok || e.Source != report.SourceKmsg {
				return nil, fmt.Errorf("kmsg rule %s: event reason %q is not a kernel-log event of the catalog (want one of %s)", r.Name, r.Reason, strings.Join(eventReasons(), ", "))
			}
		default:
			return nil, fmt.Errorf("kmsg rule %s: kind %q, want perm, temp or disk-io-error", r.Name, r.Kind)
		}
		// A rule without a pattern (the key left out, or misspelt in a
		// table the decoder would refuse, or "") and one whose pattern
		// needs no text (".*", "x*", "^") match every kernel record: a
		// perm rule would set its condition, held for the boot, on the
		// first record of a healthy node's log.
		if r.Pattern == "" {
			return nil, fmt.Errorf("kmsg rule %s: no pattern: a rule without one would match every kernel record", r.Name)
		}
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("kmsg rule %s: pattern: %v", r.Name, err)
		}
		if re.MatchString("") {
			return nil, fmt.Errorf("kmsg rule %s: pattern %q matches an empty message: a pattern must require some text of the lines it is for (one that requires none, as \".*\" or \"x*\", matches every kernel record)", r.Name, r.Pattern)
		}
		// A disk I/O error is judged by its device (ignore_devices, NVMe
		// over Fabrics, iSCSI): without the group every error would count,
		// for no device.
		var devIdx []int
		for i, n := range re.SubexpNames() {
			if n == "dev" {
				devIdx = append(devIdx, i)
			}
		}
		if r.Kind == DiskIOError && len(devIdx) == 0 {
			return nil, fmt.Errorf("kmsg rule %s: kind disk-io-error needs the device in a (?P<dev>...) group of its pattern", r.Name)
		}
		c := compiled{Rule: r, re: re, taskIdx: re.SubexpIndex("task"), pidIdx: re.SubexpIndex("pid"), devIdx: devIdx, anchors: anchorsOf(r.Pattern)}
		i := len(rs.rules)
		rs.rules = append(rs.rules, c)
		if minLenBytes(c.anchors) < 2 {
			rs.always = append(rs.always, i)
			continue
		}
		for ai, a := range c.anchors {
			k := uint16(a[0])<<8 | uint16(a[1])
			rs.bigram[k] = append(rs.bigram[k], anchorRef{rule: i, anchor: ai})
			rs.first[k/64] |= 1 << (k % 64)
		}
	}
	rs.words = (len(rs.rules) + 63) / 64
	words := rs.words
	rs.scratch.New = func() any { b := make([]uint64, words); return &b }
	return rs, nil
}

func kmsgConditions() []string {
	var out []string
	for _, c := range report.Conditions {
		if c.Source == report.SourceKmsg {
			out = append(out, c.Type)
		}
	}
	return out
}

func eventReasons() []string {
	var out []string
	for _, e := range report.Events {
		if e.Source == report.SourceKmsg {
			out = append(out, e.Reason)
		}
	}
	return out
}

// anchorsOf returns literals of which every match of pattern contains at
// least one (the most selective such set found in the parsed expression),
// or nil when there is none.
func anchorsOf(pattern string) [][]byte {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil
	}
	set := required(re.Simplify())
	var out [][]byte
	for _, l := range set {
		out = append(out, []byte(string(l)))
	}
	return out
}

func required(r *syntax.Regexp) [][]rune {
	switch r.Op {
	case syntax.OpLiteral:
		if r.Flags&syntax.FoldCase != 0 {
			return nil
		}
		return [][]rune{r.Rune}
	case syntax.OpCapture:
		return required(r.Sub[0])
	case syntax.OpPlus:
		return required(r.Sub[0])
	case syntax.OpRepeat:
		if r.Min >= 1 {
			return required(r.Sub[0])
		}
	case syntax.OpAlternate:
		var all [][]rune
		for _, b := range r.Sub {
			set := required(b)
			if set == nil {
				return nil
			}
			all = append(all, set...)
		}
		return all
	case syntax.OpConcat:
		var best [][]rune
		for _, c := range r.Sub {
			if set := required(c); set != nil && better(set, best) {
				best = set
			}
		}
		return best
	}
	return nil
}

// better prefers the set whose shortest literal is longer, then fewer literals.
func better(a, b [][]rune) bool {
	if b == nil {
		return true
	}
	ma, mb := minLen(a), minLen(b)
	if ma != mb {
		return ma > mb
	}
	return len(a) < len(b)
}

func minLen(set [][]rune) int {
	m := -1
	for _, l := range set {
		if m < 0 || len(l) < m {
			m = len(l)
		}
	}
	return m
}

type anchorRef struct{ rule, anchor int }

func minLenBytes(set [][]byte) int {
	if len(set) == 0 {
		return 0
	}
	m := len(set[0])
	for _, l := range set[1:] {
		m = min(m, len(l))
	}
	return m
}

// Match is one rule matching a message.
type Match struct {
	Rule *Rule
	// Task is the hung task's name and Pid its PID (KernelDeadlock), Dev
	// the device (disk I/O errors, a read-only filesystem's).
	Task, Pid, Dev string
}

// stackWords is the size of the candidate bitset Matches keeps on its
// stack: rule sets of up to 64*stackWords rules match without touching the
// pool.
const stackWords = 4

// Matches appends to dst every rule that matches msg (unescaped), in rule
// order. Rules restricted to critical tasks match only those. It is safe for
// concurrent use.
func (rs *RuleSet) Matches(dst []Match, msg []byte) []Match {
	// cand has bit ri set when rule ri is a candidate: its anchor occurs in
	// msg, or it has none.
	var small [stackWords]uint64
	var cand []uint64
	var pooled *[]uint64
	if rs.words <= len(small) {
		cand = small[:rs.words]
	} else {
		pooled = rs.scratch.Get().(*[]uint64)
		cand = *pooled
		clear(cand)
	}
	for i := 0; i+1 < len(msg); i++ {
		k := uint16(msg[i])<<8 | uint16(msg[i+1])
		if rs.first[k/64]&(1<<(k%64)) == 0 {
			continue
		}
		for _, ar := range rs.bigram[k] {
			ri := ar.rule
			if cand[ri/64]&(1<<(ri%64)) == 0 && bytes.HasPrefix(msg[i:], rs.rules[ri].anchors[ar.anchor]) {
				cand[ri/64] |= 1 << (ri % 64)
			}
		}
	}
	for _, ri := range rs.always {
		cand[ri/64] |= 1 << (ri % 64)
	}
	for w, word := range cand {
		for ; word != 0; word &= word - 1 {
			dst = rs.match(dst, w*64+bits.TrailingZeros64(word), msg)
		}
	}
	if pooled != nil {
		rs.scratch.Put(pooled)
	}
	return dst
}

// match appends the match of rule ri on msg, if any.
func (rs *RuleSet) match(dst []Match, ri int, msg []byte) []Match {
	r := &rs.rules[ri]
	if r.taskIdx < 0 && len(r.devIdx) == 0 {
		if r.re.Match(msg) {
			dst = append(dst, Match{Rule: &r.Rule})
		}
		return dst
	}
	sub := r.re.FindSubmatch(msg)
	if sub == nil {
		return dst
	}
	m := Match{Rule: &r.Rule}
	if r.taskIdx >= 0 {
		m.Task = string(sub[r.taskIdx])
		if !rs.critical(m.Task) {
			return dst
		}
		if r.pidIdx >= 0 {
			m.Pid = string(sub[r.pidIdx])
		}
	}
	for _, i := range r.devIdx {
		if len(sub[i]) > 0 {
			m.Dev = capDev(sub[i])
			break
		}
	}
	return append(dst, m)
}

// maxDevLen bounds, in bytes, the device name a dev group gives a match.
// A kernel's device names are at most 32 bytes; a custom rule whose group
// catches more (a rule bug) would otherwise keep whatever it caught in the
// I/O error window, 1,024 entries of it, and in the state file: 1,000-byte
// catches made the window alone 3.1 MB of the file's 4 MiB.
const maxDevLen = 64

// capDev returns dev as a string, cut at a character's start to end in "…"
// within maxDevLen bytes when it is longer. The cut name is the device
// everywhere after the match: ignore_devices, the window, the message.
func capDev(dev []byte) string {
	if len(dev) <= maxDevLen {
		return string(dev)
	}
	const ell = "…"
	n := maxDevLen - len(ell)
	for n > 0 && !utf8.RuneStart(dev[n]) {
		n--
	}
	return string(dev[:n]) + ell
}

func (rs *RuleSet) critical(task string) bool {
	for _, p := range rs.criticalTasks {
		if TaskMatch(p, task) {
			return true
		}
	}
	return false
}

// TaskMatch reports whether a task name matches a critical_tasks pattern:
// each * matches any run of characters (none included), every other
// character itself ("runc:*" matches "runc:[2:INIT]": brackets are not
// classes; "CPU */KVM" matches QEMU's vCPU thread "CPU 12/KVM").
func TaskMatch(pattern, name string) bool {
	lit, rest, star := strings.Cut(pattern, "*")
	if !star {
		return name == pattern
	}
	if !strings.HasPrefix(name, lit) {
		return false
	}
	name = name[len(lit):]
	for {
		lit, rest, star = strings.Cut(rest, "*")
		if !star {
			// The last literal ends the name.
			return len(name) >= len(lit) && strings.HasSuffix(name, lit)
		}
		// A literal between stars: its first occurrence leaves the most
		// name for the rest.
		i := strings.Index(name, lit)
		if i < 0 {
			return false
		}
		name = name[i+len(lit):]
	}
}

// Rules returns the compiled rules in order.
func (rs *RuleSet) Rules() []Rule {
	out := make([]Rule, len(rs.rules))
	for i, r := range rs.rules {
		out[i] = r.Rule
	}
	return out
}
