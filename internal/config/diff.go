package config

import (
	"reflect"
	"slices"
	"strings"
)

// RestartKeys are the keys (a table name stands for every key in it) that
// a running daemon cannot change: a reload whose file changes one of them is
// refused as a whole (`systemctl restart autopilot-health` applies it). They
// name the node, its identity and where the daemon keeps and serves its
// state: the listeners, the state and the kernel log reader are opened once.
// Every other key is applied by a reload.
var RestartKeys = []string{
	"host_root", "kubelet_root_dir", "node_name", "role", "gpu", "state_dir", "control_socket",
	"log", "metrics", "status", "kubernetes", "detect",
	"kmsg.enabled", "kmsg.device", "kmsg.from_boot_start",
}

// NeedsRestart reports whether key (a leaf key as Diff names it) is one of
// RestartKeys or lies in one of its tables.
func NeedsRestart(key string) bool {
	return slices.ContainsFunc(RestartKeys, func(k string) bool { return key == k || strings.HasPrefix(key, k+".") })
}

// Diff lists the keys whose values differ between a and b, in the order of
// the Config struct, as dotted keys like default.toml's
// ("checks.DiskUsageHigh.space_percent", "metrics.listen_address"). A list
// (kmsg.rules, a list of paths) is one key.
func Diff(a, b *Config) []string {
	var out []string
	diffValue("", reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem(), &out)
	return out
}

var durationType = reflect.TypeFor[Duration]()

func diffValue(prefix string, a, b reflect.Value, out *[]string) {
	if a.Kind() != reflect.Struct || a.Type() == durationType {
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, prefix)
		}
		return
	}
	for i := range a.NumField() {
		f := a.Type().Field(i)
		key := prefix
		if !f.Anonymous {
			name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
			if name == "" || name == "-" {
				continue
			}
			if key != "" {
				key += "."
			}
			key += name
		}
		diffValue(key, a.Field(i), b.Field(i), out)
	}
}

// ChangedChecks lists the checks (condition types) one of whose keys
// differs between a and b.
func ChangedChecks(a, b *Config) []string {
	var out []string
	for _, k := range Diff(a, b) {
		rest, ok := strings.CutPrefix(k, "checks.")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, ".")
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// Section returns the whole table of the check for a condition type (its
// common and its own keys): the runner restarts a check when it differs.
func (k *Checks) Section(condType string) (any, bool) {
	rv := reflect.ValueOf(k).Elem()
	for i, name := range k.Names() {
		if name == condType {
			return rv.Field(i).Interface(), true
		}
	}
	return nil, false
}
