package config

import (
	"slices"
	"strings"
	"testing"
)

func TestDiffNamesTheChangedKeys(t *testing.T) {
	if d := Diff(Default(), Default()); len(d) != 0 {
		t.Errorf("the defaults differ from themselves: %v", d)
	}
	changed, err := Parse("x.toml", []byte(`
[metrics]
listen_address = ":9999"
[checks.DiskUsageHigh]
space_percent = 80      # its own key
interval = "1m"         # a common key (embedded)
[checks.NodeTampered]
paths = ["/etc/x"]      # a list
[kmsg]
disable = ["TaskHung"]
[[kmsg.rules]]
name = "X"
kind = "temp"
reason = "IOError"
pattern = 'x'
`), Default())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"metrics.listen_address", "checks.DiskUsageHigh.interval", "checks.DiskUsageHigh.space_percent",
		"checks.NodeTampered.paths", "kmsg.disable", "kmsg.rules"}
	if d := Diff(Default(), changed); !slices.Equal(d, want) {
		t.Errorf("Diff = %v, want %v", d, want)
	}
	for _, k := range want {
		if !slices.Contains(knownKeys(), k) && k != "kmsg.rules" {
			t.Errorf("Diff names %q, not a key of default.toml", k)
		}
	}
	if c := ChangedChecks(Default(), changed); !slices.Equal(c, []string{"DiskUsageHigh", "NodeTampered"}) {
		t.Errorf("ChangedChecks = %v", c)
	}
	// A value written as the default is no change.
	same, err := Parse("x.toml", []byte("[checks.DiskUsageHigh]\nspace_percent = 90\ninterval = \"2m\"\n"), Default())
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(Default(), same); len(d) != 0 {
		t.Errorf("the defaults written out differ: %v", d)
	}
}

// Every key of the configuration is either refused by a reload (needs a
// restart) or one the daemon applies in place: runner.*, checks.* and the
// kernel log rules. A key added later in a new table must be classified.
func TestEveryKeyIsReloadableOrNeedsARestart(t *testing.T) {
	applied := []string{"runner.", "checks.", "kmsg.kernel_only", "kmsg.critical_tasks", "kmsg.ignore_devices", "kmsg.disable", "kmsg.rules"}
	for _, k := range knownKeys() {
		inApplied := slices.ContainsFunc(applied, func(p string) bool { return strings.HasPrefix(k, p) || k+"." == p })
		isTable := slices.ContainsFunc(knownKeys(), func(o string) bool { return strings.HasPrefix(o, k+".") })
		switch {
		case isTable:
		case NeedsRestart(k) && inApplied:
			t.Errorf("%s both needs a restart and is applied by a reload", k)
		case !NeedsRestart(k) && !inApplied:
			t.Errorf("%s neither needs a restart nor is applied by a reload", k)
		}
	}
	for _, k := range []string{"metrics.listen_address", "node_name", "state_dir", "kmsg.device", "kubernetes.kubeconfig"} {
		if !NeedsRestart(k) {
			t.Errorf("%s does not need a restart", k)
		}
	}
	for _, k := range []string{"kmsg.rules", "kmsg.disable", "checks.DiskUsageHigh.space_percent", "runner.first_run_spread", "kmsg.enabledx"} {
		if NeedsRestart(k) {
			t.Errorf("%s needs a restart", k)
		}
	}
}
