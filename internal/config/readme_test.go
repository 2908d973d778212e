package config

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// readme is README.md, the promise of what the configuration holds.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readmeCode is every code span of README (the text between backticks).
func readmeCode(t *testing.T) []string {
	var spans []string
	for _, m := range regexp.MustCompile("`([^`\n]+)`").FindAllStringSubmatch(readme(t), -1) {
		spans = append(spans, m[1])
	}
	return spans
}

// TestREADMENamesEveryKey: every key of Config is named in README, as a code
// span that is the key (`checks.DiskUsageHigh.space_percent`), its last part
// (`space_percent`), either with a value (`space_percent = 80`), or its
// table's header (`[metrics]`, `[[kmsg.rules]]`); and every code span of
// README that names a key of a table of Config (`metrics.listen_address`,
// `[log]`, `kmsg.critical_tasks = [...]`) names one Config has. README is
// the promise of what an operator may write: a key that only `config
// default` shows, or one README shows that the parser refuses, is a broken
// one.
func TestREADMENamesEveryKey(t *testing.T) {
	spans := readmeCode(t)
	named := map[string]bool{}
	for _, s := range spans {
		s = strings.TrimSpace(s)
		if k, _, ok := strings.Cut(s, " = "); ok {
			s = k
		}
		s = strings.TrimSuffix(strings.TrimPrefix(s, "[["), "]]")
		s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		named[s] = true
	}
	var keys []string
	for k := range exactKeys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		leaf := k[strings.LastIndexByte(k, '.')+1:]
		// A table is named by a key of it too (`[checks.<Condition>]`).
		table := slices.ContainsFunc(keys, func(o string) bool { return strings.HasPrefix(o, k+".") })
		if !named[k] && !named[leaf] && !(table && slices.ContainsFunc(spans, func(s string) bool { return strings.HasPrefix(strings.TrimLeft(s, "["), k+".") })) {
			t.Errorf("README does not name the key %s (as `%s` or `%s`)", k, k, leaf)
		}
	}

	// The reverse: a code span shaped as a key of one of Config's tables.
	var tables []string
	for k := range exactKeys() {
		if !strings.Contains(k, ".") && slices.ContainsFunc(keys, func(o string) bool { return strings.HasPrefix(o, k+".") }) {
			tables = append(tables, k)
		}
	}
	sort.Strings(tables)
	keyShape := regexp.MustCompile(`^\[{0,2}((?:` + strings.Join(tables, "|") + `)(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\]{0,2}(?: = .*)?$`)
	// Code spans of README shaped as keys that are not: the wrong
	// spellings its errors are shown for, and other things' names.
	notKeys := map[string]string{
		"log.node_name":             "the error for a top-level key written after [log]",
		"checks.diskusagehigh":      "the error for a table spelt in another case",
		"kubernetes.calls":          "a metric's label, not a key",
		"status.conditions":         "the Node's field, not a key",
		"kmsg.PodGatedTasks":        "a Go identifier of the kmsg package",
		"checks.DiskUsage":          "the error for a check's name cut short",
		"checks.ClockNotSynced":     "the error for a check's name ended otherwise",
		"checks.Kubelet":            "the error for a beginning two checks share",
		"checks.ReadonlyFilesystem": "the error for a kernel log rule written as a check",
	}
	seen := map[string]bool{}
	for _, s := range spans {
		m := keyShape.FindStringSubmatch(strings.TrimSpace(s))
		if m == nil {
			continue
		}
		k := m[1]
		if _, ok := notKeys[k]; ok {
			seen[k] = true
			continue
		}
		if !exactKeys()[k] {
			t.Errorf("README shows `%s`, but %s is no key of the configuration", s, k)
		}
	}
	for k, why := range notKeys {
		if !seen[k] {
			t.Errorf("README no longer shows `%s` (%s): drop it from notKeys", k, why)
		}
	}
}

// TestREADMEListsTheRestartKeys: the keys README says a reload cannot
// change ("Reloading the configuration") are RestartKeys, no more, no fewer.
func TestREADMEListsTheRestartKeys(t *testing.T) {
	text := readme(t)
	const from, to = "These keys are the node's identity and where the daemon keeps and serves its state:", "Everything else ("
	i := strings.Index(text, from)
	j := strings.Index(text[max(i, 0):], to)
	if i < 0 || j < 0 {
		t.Fatalf("README lacks the list of the keys that need a restart (%q ... %q)", from, to)
	}
	var listed []string
	for _, m := range regexp.MustCompile("`\\[?([a-z_.]+)\\]?`").FindAllStringSubmatch(text[i+len(from):i+j], -1) {
		listed = append(listed, m[1])
	}
	want := slices.Clone(RestartKeys)
	slices.Sort(listed)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("README lists the keys that need a restart as %v, RestartKeys is %v", listed, want)
	}
}
