package config

import (
	"regexp"
	"testing"
)

// goTypeWords are the Go spellings the decoder's errors use for a value's
// type; an operator writes TOML, whose words are integer, float, string,
// boolean, date-time, array and table.
var goTypeWords = regexp.MustCompile(`int64|float64|map\[|\[\]|\bany\b|interface|config\.[A-Z]|\bslice\b|primitive|time\.Time|destination`)

// A value of the wrong type is named in TOML's words: what the key takes
// and what the file gives, at the key's line.
func TestWrongTypeInTOMLWords(t *testing.T) {
	for in, want := range map[string]string{
		"role = 5\n": `c.toml:1: key role: wrong type: must be a string, got an integer`,
		"[checks.DiskUsageHigh]\nspace_percent = \"x\"\n":                     `c.toml:2: key checks.DiskUsageHigh.space_percent: wrong type: must be an integer, got a string`,
		"[checks.DiskUsageHigh]\nspace_percent = 1.5\n":                       `c.toml:2: key checks.DiskUsageHigh.space_percent: wrong type: must be an integer, got a float`,
		"[checks.APIServerSourceIPUnavailable]\nmax_read_bytes = { a = 1 }\n": `c.toml:2: key checks.APIServerSourceIPUnavailable.max_read_bytes: wrong type: must be an integer, got a table`,
		"[checks.APIServerSourceIPUnavailable]\nmax_read_bytes = [1]\n":       `c.toml:2: key checks.APIServerSourceIPUnavailable.max_read_bytes: wrong type: must be an integer, got an array`,
		"[log]\nlevel = 2026-01-01\n":                                         `c.toml:2: key log.level: wrong type: must be a string, got a date or time`,
		"[log]\nlevel = true\n":                                               `c.toml:2: key log.level: wrong type: must be a string, got a boolean`,
		"[kmsg]\nenabled = \"yes\"\n":                                         `c.toml:2: key kmsg.enabled: wrong type: must be a boolean, got a string`,
		"[kmsg]\ncritical_tasks = \"kubelet\"\n":                              `c.toml:2: key kmsg.critical_tasks: wrong type: must be an array of strings, got a string`,
		"[kmsg]\ncritical_tasks = [\"kubelet\", 1]\n":                         `c.toml:2: key kmsg.critical_tasks: wrong type: each entry must be a string, got an integer`,
		"[kmsg]\nrules = 5\n":                                                 `c.toml:2: key kmsg.rules: wrong type: must be an array of tables, got an integer`,
		"[kmsg]\nrules = [1]\n":                                               `c.toml:2: key kmsg.rules: wrong type: each entry must be a table, got an integer`,
		// An entry that is an array, not the list: kmsg.rules is an
		// array of tables, not "a table".
		"[kmsg]\nrules = [[{ name = \"x\" }]]\n":        `c.toml:2: key kmsg.rules: wrong type: each entry must be a table, got an array`,
		"[kmsg]\nrules = [{ name = \"x\" }, [\"y\"]]\n": `c.toml:2: key kmsg.rules: wrong type: each entry must be a table, got an array`,
		"log = 5\n":                                         `c.toml:1: key log: wrong type: must be a table, got an integer`,
		"[[log]]\nlevel = \"info\"\n":                       `c.toml:1: key log: wrong type: must be a table, got an array of tables`,
		"[checks]\nKubeletUnhealthy = \"on\"\n":             `c.toml:2: key checks.KubeletUnhealthy: wrong type: must be a table, got a string`,
		"[checks.KubeletUnhealthy]\ninterval = { a = 1 }\n": `c.toml:2: key checks.KubeletUnhealthy.interval: wrong type: must be a duration string such as "30s", got a table`,
		"[checks.KubeletUnhealthy]\ninterval = [\"1s\"]\n":  `c.toml:2: key checks.KubeletUnhealthy.interval: wrong type: must be a duration string such as "30s", got an array`,
		// A duration given another value than a string: named in TOML's
		// words, not as the text the decoder made of it ("5", "1.500000",
		// a local date written as a UTC time).
		"[checks.DiskUsageHigh]\ninterval = 5\n":                    `c.toml:2: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got an integer`,
		"[checks.DiskUsageHigh]\ninterval = 1.5\n":                  `c.toml:2: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got a float`,
		"[checks.DiskUsageHigh]\ninterval = true\n":                 `c.toml:2: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got a boolean`,
		"[checks.DiskUsageHigh]\ninterval = 1979-05-27T00:00:00Z\n": `c.toml:2: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got a date or time`,
		"[checks.DiskUsageHigh]\ninterval = 1979-05-27\n":           `c.toml:2: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got a date or time`,
		"[checks.DiskUsageHigh]\ninterval = 07:32:00\n":             `c.toml:2: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got a date or time`,
		"checks = { DiskUsageHigh = { interval = 5 } }\n":           `c.toml:1: key checks.DiskUsageHigh.interval: wrong type: must be a duration string such as "30s", got an integer`,
		// A key of an array of tables' entry, and of a table written inline.
		"[[kmsg.rules]]\nname = 5\n":                              `c.toml:2: key kmsg.rules.name: wrong type: must be a string, got an integer`,
		"checks = { NodeTampered = { paths = [\"/etc\", 2] } }\n": `c.toml:1: key checks.NodeTampered.paths: wrong type: each entry must be a string, got an integer`,
		// Too large for any TOML integer: named as TOML bounds it.
		"[checks.DiskUsageHigh]\nspace_percent = 99999999999999999999\n":     `c.toml:2: key checks.DiskUsageHigh.space_percent: 99999999999999999999 is out of range: a TOML integer is from -9223372036854775808 to 9223372036854775807`,
		"[checks.DiskUsageHigh]\nspace_percent = -99999999999999999999999\n": `c.toml:2: key checks.DiskUsageHigh.space_percent: -99999999999999999999999 is out of range: a TOML integer is from -9223372036854775808 to 9223372036854775807`,
		// A table spelt in another case (which the decoder matches) is
		// looked up as the decoder does.
		"[checks.diskusagehigh]\nspace_percent = \"x\"\n": `c.toml:2: key checks.diskusagehigh.space_percent: wrong type: must be an integer, got a string`,
	} {
		_, err := Parse("c.toml", []byte(in), Default())
		if err == nil {
			t.Errorf("%q: loaded", in)
			continue
		}
		if got := err.Error(); got != want {
			t.Errorf("%q:\n got: %s\nwant: %s", in, got, want)
		}
		if m := goTypeWords.FindString(err.Error()); m != "" {
			t.Errorf("%q: the error speaks Go (%q): %v", in, m, err)
		}
	}
}
