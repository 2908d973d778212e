package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
)

// The specification's values, written out here independently of
// default.toml, so a changed default fails this test. Where the spec names
// a thing but gives no figure or path (the units' and files' paths, the
// tunnel units' names, DiskWearHigh's "most"), the value pinned here is
// chosen by this project, and its comment says so.
func TestDefaultsAreTheSpecValues(t *testing.T) {
	c := Default()
	intervals := map[string]time.Duration{
		"KubeletUnhealthy":             10 * time.Second,
		"ContainerRuntimeUnhealthy":    10 * time.Second,
		"ServiceNotRecovering":         time.Minute,
		"KubeletHeartbeatFailed":       5 * time.Minute,
		"DisksFailure":                 5 * time.Minute,
		"DiskWearHigh":                 30 * time.Minute,
		"DiskTemperatureHigh":          5 * time.Minute,
		"DiskUsageHigh":                2 * time.Minute,
		"NodeServiceDown":              30 * time.Second,
		"NodeInfoStale":                time.Minute,
		"CertRenewalFailing":           time.Hour,
		"ProxyNotServing":              30 * time.Second,
		"ClockNotSynchronized":         time.Minute,
		"CNIUnhealthy":                 30 * time.Second,
		"TunnelDisconnected":           30 * time.Second,
		"GpuActivationFailed":          time.Minute,
		"APIServerSourceIPUnavailable": time.Minute,
	}
	for name, want := range intervals {
		com, ok := c.Checks.Common(name)
		if !ok {
			t.Errorf("no [checks.%s] table", name)
			continue
		}
		if com.Interval.Duration != want {
			t.Errorf("checks.%s.interval = %s, spec says %s", name, com.Interval, want)
		}
		if !com.Enabled {
			t.Errorf("checks.%s is disabled by default", name)
		}
	}
	k := c.Checks
	for _, tc := range []struct {
		key       string
		got, want any
	}{
		{"metrics.listen_address", c.Metrics.ListenAddress, ":20257"},
		{"status.socket", c.Status.Socket, "/run/autopilot-health/status.sock"},
		{"kubernetes.report_interval", c.Kubernetes.ReportInterval.Duration, 2 * time.Minute},
		{"kubernetes.kubeconfig", c.Kubernetes.Kubeconfig, "/etc/kubernetes/kubelet.conf"},
		{"state_dir", c.StateDir, "/var/lib/autopilot-health"},
		{"host_root", c.HostRoot, "/"},
		{"KubeletUnhealthy.healthz_url", k.KubeletUnhealthy.HealthzURL, "http://127.0.0.1:10248/healthz"},
		{"KubeletUnhealthy.unit", k.KubeletUnhealthy.Unit, "kubelet.service"},
		{"KubeletUnhealthy.restart_cooldown", k.KubeletUnhealthy.RestartCooldown.Duration, time.Minute},
		{"ContainerRuntimeUnhealthy.socket", k.ContainerRuntimeUnhealthy.Socket, "/run/containerd/containerd.sock"},
		{"ContainerRuntimeUnhealthy.unit", k.ContainerRuntimeUnhealthy.Unit, "containerd.service"},
		{"ContainerRuntimeUnhealthy.restart_cooldown", k.ContainerRuntimeUnhealthy.RestartCooldown.Duration, 2 * time.Minute},
		{"ServiceNotRecovering.restart_threshold", k.ServiceNotRecovering.RestartThreshold, 3},
		{"ServiceNotRecovering.controlplane_units", k.ServiceNotRecovering.ControlPlaneUnits, []string{"kubelet.service", "containerd.service"}},
		{"ServiceNotRecovering.worker_units", k.ServiceNotRecovering.WorkerUnits, []string{"kubelet.service", "containerd.service", "syself-proxy.service"}},
		{"KubeletHeartbeatFailed.unit", k.KubeletHeartbeatFailed.Unit, "kubelet.service"},
		{"KubeletHeartbeatFailed.journalctl", k.KubeletHeartbeatFailed.Journalctl, "/usr/bin/journalctl"},
		{"KubeletHeartbeatFailed.match", k.KubeletHeartbeatFailed.Match, []string{"Unable to update node status", "update node status exceeds retry count"}},
		{"KubeletHeartbeatFailed.max_entries", k.KubeletHeartbeatFailed.MaxEntries, 100000},
		{"DisksFailure.io_error_threshold", k.DisksFailure.IOErrorThreshold, 5},
		{"DisksFailure.io_error_window", k.DisksFailure.IOErrorWindow.Duration, 10 * time.Minute},
		{"NodeInfoStale.max_age", k.NodeInfoStale.MaxAge.Duration, 5 * time.Minute},
		{"CertRenewalFailing.renew_within", k.CertRenewalFailing.RenewWithin.Duration, 7 * 24 * time.Hour},
		{"ProxyNotServing.metrics_url", k.ProxyNotServing.MetricsURL, "http://127.0.0.1:9587/metrics"},
		{"ProxyNotServing.ready_metric", k.ProxyNotServing.ReadyMetric, "ready"},
		{"TunnelDisconnected.agent_unit", k.TunnelDisconnected.AgentUnit, "syself-tunnel-agent.service"},
		{"GpuActivationFailed.marker_path", k.GpuActivationFailed.MarkerPath, "/run/syself/gpu-activated"},
		{"GpuActivationFailed.cdi_spec_dirs", k.GpuActivationFailed.CDISpecDirs, []string{"/etc/cdi", "/var/run/cdi"}},
		{"GpuActivationFailed.cdi_kind", k.GpuActivationFailed.CDIKind, "nvidia.com/gpu"},
		{"ClockNotSynchronized.max_error", k.ClockNotSynchronized.MaxError.Duration, 5 * time.Second},
		{"kmsg.device", c.Kmsg.Device, "/dev/kmsg"},
		{"role (detected)", c.Role, ""},
		// Spec: "an operability unit is not active": the tunnel agent,
		// server, or source-IP helper. The unit names, and which role
		// runs which (the agent on a worker, the server and the helper on
		// the control plane), are chosen here: the spec gives neither.
		{"NodeServiceDown.controlplane_units", k.NodeServiceDown.ControlPlaneUnits, []string{"syself-tunnel-server.service", "syself-source-ip.service"}},
		{"NodeServiceDown.worker_units", k.NodeServiceDown.WorkerUnits, []string{"syself-tunnel-agent.service"}},
		// Spec: "`nodes.json` is older than 5 minutes": the file's name
		// is the spec's, its directory chosen here.
		{"NodeInfoStale.path", k.NodeInfoStale.Path, "/var/lib/syself/nodes.json"},
		// Spec: "used most of its rated write endurance": no figure; 80 %
		// is chosen here (README's "Configuration" gives it).
		{"DiskWearHigh.percentage_used_threshold", k.DiskWearHigh.PercentageUsedThreshold, 80},
		// Spec: "past its temperature threshold": the drive's own (0).
		{"DiskTemperatureHigh.threshold_celsius", k.DiskTemperatureHigh.ThresholdCelsius, 0},
		// Spec: "local cilium-agent health ... or its socket": the
		// socket's path is cilium's default, chosen here.
		{"CNIUnhealthy.socket", k.CNIUnhealthy.Socket, "/var/run/cilium/cilium.sock"},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.key, tc.got, tc.want)
		}
	}
	// Spec, KernelDeadlock: "This covers kubelet, containerd, the
	// container runtime (runc or crun), and a Kata pod's QEMU VM (qemu or
	// virtiofsd)". The list may hold more (containerd-shim*, runc:*, the
	// vCPU threads), not fewer.
	for _, task := range []string{"kubelet", "containerd", "runc", "crun", "qemu-system-*", "qemu-kvm", "virtiofsd"} {
		if !slices.Contains(c.Kmsg.CriticalTasks, task) {
			t.Errorf("kmsg.critical_tasks %v lacks the spec's %s", c.Kmsg.CriticalTasks, task)
		}
	}
}

// The spec's NodeTampered row says "a protected file under /var"; the
// default paths also protect the kubelet's kubeconfig, static pods,
// containerd, CNI and systemd units under /etc (README, "Tamper
// conditions", the table of paths). The catalog's trigger, which README's
// catalog, the man page and the alert's description print, says "by
// default under A and B": every default path lies under one of the
// directories it names (a top directory alone would let "/var/lib" pass
// for a path under /var/log), and each directory it names holds one.
func TestNodeTamperedTriggerNamesTheDefaultPathsTopDirectories(t *testing.T) {
	d, ok := report.Lookup("NodeTampered")
	if !ok {
		t.Fatal("NodeTampered is not in the catalog")
	}
	m := regexp.MustCompile(`by default under ([^:]+):`).FindStringSubmatch(d.Trigger)
	if m == nil {
		t.Fatalf("the catalog's trigger %q does not say where the default paths lie (\"by default under ...:\")", d.Trigger)
	}
	dirs := strings.FieldsFunc(strings.ReplaceAll(m[1], " and ", ","), func(r rune) bool { return r == ',' || r == ' ' })
	holds := map[string]bool{}
	for _, p := range Default().Checks.NodeTampered.Paths {
		under := false
		for _, dir := range dirs {
			if p == dir || strings.HasPrefix(p, dir+"/") {
				holds[dir], under = true, true
			}
		}
		if !under {
			t.Errorf("default protected path %s: the catalog's trigger %q names %v, none of which holds it", p, d.Trigger, dirs)
		}
	}
	for _, dir := range dirs {
		if !holds[dir] {
			t.Errorf("the catalog's trigger names %s, under which no default protected path lies", dir)
		}
	}
}

// Every field of Config must appear in default.toml (so `config default`
// documents every key), and default.toml must decode with no leftovers.
func TestDefaultTOMLCoversEveryKey(t *testing.T) {
	var c Config
	md, err := toml.Decode(string(defaultTOML), &c)
	if err != nil {
		t.Fatal(err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("default.toml has keys Config lacks: %v", u)
	}
	var walk func(prefix []string, rt reflect.Type)
	walk = func(prefix []string, rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			if !f.IsExported() {
				continue // not a key (Config.lines)
			}
			if f.Anonymous {
				walk(prefix, f.Type)
				continue
			}
			key := append(append([]string(nil), prefix...), f.Tag.Get("toml"))
			if f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct {
				// An array of tables: documented as a commented example.
				if !strings.Contains(string(defaultTOML), "# [["+strings.Join(key, ".")+"]]") {
					t.Errorf("default.toml does not document [[%s]]", strings.Join(key, "."))
				}
				continue
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(Duration{}) {
				walk(key, f.Type)
				continue
			}
			if !md.IsDefined(key...) {
				t.Errorf("default.toml does not set %s", strings.Join(key, "."))
			}
		}
	}
	walk(nil, reflect.TypeOf(c))
	// Every key is preceded by a comment or sits in a commented table.
	if !strings.Contains(string(defaultTOML), "# Durations are strings") {
		t.Error("default.toml lost its header comment")
	}
}

func TestNoFileMeansDefaults(t *testing.T) {
	c, read, err := Load(filepath.Join(t.TempDir(), "absent.toml"), true)
	if err != nil || read {
		t.Fatalf("Load(absent, allowMissing) = read %v, err %v", read, err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Error("config from a missing file differs from the defaults")
	}
	if _, _, err := Load(filepath.Join(t.TempDir(), "absent.toml"), false); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(absent, explicit) error = %v, want not-exist", err)
	}
}

func TestOverrideKeepsOtherDefaults(t *testing.T) {
	c, err := Parse("x.toml", []byte("role = \"worker\"\n[checks.DiskUsageHigh]\nspace_percent = 80\n[checks.ServiceNotRecovering]\nworker_units = [\"kubelet.service\"]\n"), Default())
	if err != nil {
		t.Fatal(err)
	}
	if c.Role != "worker" || c.Checks.DiskUsageHigh.SpacePercent != 80 {
		t.Errorf("overrides not applied: role %q, space %d", c.Role, c.Checks.DiskUsageHigh.SpacePercent)
	}
	if c.Checks.DiskUsageHigh.InodesPercent != 90 || c.Checks.DiskUsageHigh.Interval.Duration != 2*time.Minute {
		t.Error("keys not in the file lost their defaults")
	}
	if got := c.Checks.ServiceNotRecovering.WorkerUnits; !reflect.DeepEqual(got, []string{"kubelet.service"}) {
		t.Errorf("a list in the file replaces the default list; got %v", got)
	}
	if d := Default().Checks.ServiceNotRecovering.WorkerUnits; len(d) != 3 {
		t.Errorf("decoding an override changed the defaults: %v", d)
	}
}

// An empty agent_unit is valid: it turns off the look at systemd (an agent
// that is not a systemd unit).
func TestTunnelAgentUnitMayBeEmpty(t *testing.T) {
	c, err := Parse("x.toml", []byte("[checks.TunnelDisconnected]\nagent_unit = \"\"\n"), Default())
	if err != nil || c.Checks.TunnelDisconnected.AgentUnit != "" {
		t.Errorf("agent_unit = \"\": %v, %q", err, c.Checks.TunnelDisconnected.AgentUnit)
	}
}

// Every Default() is its own: writing into every list, map and value of one
// (and of a config parsed over it) leaves the next Default() as it was.
// scribble finds the fields by reflection, so a field added later is
// covered without changing this test.
func TestDefaultsAreFreshEachCall(t *testing.T) {
	// A copy that shares nothing with any Default(), to compare with.
	want, err := json.Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if n := scribble(reflect.ValueOf(d)); n == 0 {
		t.Fatal("the defaults have no list or map entry to write into")
	}
	p, err := Parse("x.toml", []byte("[kmsg]\nenabled = false\n"), Default())
	if err != nil {
		t.Fatal(err)
	}
	scribble(reflect.ValueOf(p))
	got, err := json.Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("changing one Default() changed the next:\n got %s\nwant %s", got, want)
	}
}

// scribble overwrites every string, number and bool reachable from v,
// including the elements of slices, arrays and maps, and adds an entry to
// every slice (within its capacity, where an alias would show it) and map.
// It returns how many slice, array and map entries it wrote into.
func scribble(v reflect.Value) int {
	n := 0
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			n += scribble(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				n += scribble(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Len() < v.Cap() {
			v.SetLen(v.Len() + 1)
		}
		fallthrough
	case reflect.Array:
		for i := range v.Len() {
			n += 1 + scribble(v.Index(i))
		}
	case reflect.Map:
		if v.IsNil() {
			break
		}
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			n += 1 + scribble(e)
			v.SetMapIndex(k, e)
		}
		if k := reflect.New(v.Type().Key()).Elem(); !v.MapIndex(k).IsValid() {
			v.SetMapIndex(k, reflect.New(v.Type().Elem()).Elem())
		}
	case reflect.String:
		v.SetString(v.String() + "-scribbled")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 1)
	}
	return n
}

// Each bad file and its exact error: file, line, key and the problem.
func TestBadConfigs(t *testing.T) {
	want := map[string]string{
		"bad-duration.toml": `:3: key checks.KubeletUnhealthy.interval: invalid duration "10 seconds" (use a number with a unit, e.g. "30s", "5m", "168h")`,
		"bad-regex.toml":    ":2: key checks.DiskUsageHigh.mount_points_exclude: invalid regular expression: error parsing regexp: missing closing ): `^/(dev`",
		"bad-role.toml":     `:1: key role: must be one of "", "controlplane", "worker", got "boss"`,
		// gpu takes "auto" too, so a string: its boolean is told to be
		// quoted (before, "must be a string, got a boolean" alone).
		"gpu-boolean.toml":     `:2: key gpu: wrong type: must be a string, "auto", "true" or "false", got a boolean: quote it, gpu = "true" or gpu = "false"`,
		"duplicate-key.toml":   `:2: key host_root: Key 'host_root' has already been defined (first at line 1: a key or table is defined once)`,
		"duplicate-table.toml": `:4: key checks.KubeletUnhealthy: Key 'checks.KubeletUnhealthy' has already been defined (first at line 1: a key or table is defined once)`,
		"listen-address.toml":  `:2: key metrics.listen_address: must be host:port or :port, got "20257"`,
		// An IPv6 address without its brackets: said how to write one
		// (before, "host:port or :port" alone).
		"listen-address-ipv6-unbracketed.toml": `:2: key metrics.listen_address: must be host:port or :port, an IPv6 address in brackets ("[::1]:20257", "[::]:20257" for every address), got "::1:20257"`,
		"log-level.toml":                       `:2: key log.level: must be one of "debug", "info", "warn", "error", got "verbose"`,
		"negative-interval.toml":               `:2: key checks.ClockNotSynchronized.interval: must be between 1s and 24h, got "-1m0s"`,
		"node-name.toml":                       `:1: key node_name: must be a DNS subdomain (lower-case letters, digits, '-' and '.'), got "Node_1"`,
		// Of the right characters but too long: said so, not "lower-case
		// letters, digits" of a name that has only those (253 loads).
		"node-name-too-long.toml": `:1: key node_name: must be a DNS subdomain of at most 253 characters, got one of 254 ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"...)`,
		"percent-range.toml":      `:2: key checks.DiskUsageHigh.space_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 120`,
		"relative-path.toml":      `:1: key state_dir: must be an absolute path, got "var/lib/autopilot-health"`,
		// The kubelet's --root-dir: its pods' volumes are looked for
		// below it as the mount table writes them, a clean path.
		"kubelet-root-dir-relative.toml": `:2: key kubelet_root_dir: must be an absolute path other than / (the kubelet's --root-dir, such as "/data/kubelet"), got "data/kubelet"`,
		"kubelet-root-dir-root.toml":     `:1: key kubelet_root_dir: must be an absolute path other than / (the kubelet's --root-dir, such as "/data/kubelet"), got "/"`,
		// The daemon writes, moves aside and removes files of its own
		// names there: never in a directory the system shares.
		"state-dir-root.toml":         `:1: key state_dir: must be a directory of the daemon's own (it writes state.json and tamper.json there, moves aside a state.json it cannot read and removes their temp files), not /, which the system and other programs share, got "/"`,
		"state-dir-root-unclean.toml": `:1: key state_dir: must be a directory of the daemon's own (it writes state.json and tamper.json there, moves aside a state.json it cannot read and removes their temp files), not /, which the system and other programs share, got "/./"`,
		"state-dir-shared.toml":       `:2: key state_dir: must be a directory of the daemon's own (it writes state.json and tamper.json there, moves aside a state.json it cannot read and removes their temp files), not /var/lib, which the system and other programs share, got "/var/lib/"`,
		"status-socket.toml":          `:2: key status.socket: must be an absolute path, got "run/autopilot-health/status.sock"`,
		"lvm-command.toml":            `:2: key checks.DiskUsageHigh.lvm_command: must be an absolute path, got "lvm"`,
		"lvm-timeout.toml":            `:2: key checks.DiskUsageHigh.lvm_timeout: must be between 1s and 5m, got "10m0s"`,
		// The check waits two thirds of its timeout for the two reports.
		"lvm-timeout-over-wait.toml":  `:2: key checks.DiskUsageHigh.lvm_timeout: must be at most a third of the check's timeout (30s): its two LVM reports are waited for two thirds of it, got 20s`,
		"timeout-under-lvm-wait.toml": `:2: key checks.DiskUsageHigh.timeout: must be at least three times lvm_timeout (10s): the two LVM reports are waited for two thirds of it, got 20s`,
		"thin-pool-percent.toml":      `:2: key checks.DiskUsageHigh.thin_pool_metadata_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 0`,
		// DiskUsageHigh is set over its thresholds: one of 100 would
		// never be exceeded, and the condition never set.
		"over-threshold-space_percent.toml":              `:3: key checks.DiskUsageHigh.space_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 100`,
		"over-threshold-inodes_percent.toml":             `:3: key checks.DiskUsageHigh.inodes_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 100`,
		"over-threshold-volume_group_percent.toml":       `:3: key checks.DiskUsageHigh.volume_group_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 100`,
		"over-threshold-thin_pool_data_percent.toml":     `:3: key checks.DiskUsageHigh.thin_pool_data_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 100`,
		"over-threshold-thin_pool_metadata_percent.toml": `:3: key checks.DiskUsageHigh.thin_pool_metadata_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 100`,
		"syntax.toml": `:1: key kubernetes: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		// An unclosed header at its own line, named itself (the decoder
		// said the next line, and the table before it).
		"syntax-header-after-table.toml": `:3: key metrics: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		"syntax-array-header.toml":       `:3: key kmsg.rules: syntax error: expected end of table array name delimiter ']', but got '\n' instead`,
		"timeout-over-interval.toml":     `:3: key checks.NodeInfoStale.timeout: must not be longer than interval (10s), got 1m0s`,
		// Values that fix a check's answer whatever the host does (before,
		// both loaded: "1ns" is True at every run).
		"node-info-max-age.toml": `:2: key checks.NodeInfoStale.max_age: must be at least 1s (the file is read at the check's runs, not when it is written: a shorter max_age finds it older at nearly every run unless the sync loop rewrites it more than once a second), got "1ns"`,
		"clock-max-error.toml":   `:2: key checks.ClockNotSynchronized.max_error: must be at least 1µs (adjtimex reports the estimated error in whole microseconds: a shorter max_error is 0, True at any estimated error at all), got "999ns"`,
		"agent-unit.toml":        `:2: key checks.TunnelDisconnected.agent_unit: must list systemd unit names such as "kubelet.service", got "syself tunnel agent"`,
		"unit-name.toml":         `:2: key checks.ServiceNotRecovering.worker_units: must list systemd unit names such as "kubelet.service", got "containerd"`,
		"unknown-key.toml":       `:2: key checks.ClockNotSynchronized.max_eror: unknown key (did you mean checks.ClockNotSynchronized.max_error?)`,
		"unknown-table.toml":     `:2: key checks.DiskUsageHig: unknown key (did you mean checks.DiskUsageHigh?)`,
		// A top-level key after a table header is that table's in TOML.
		"top-level-key-after-table.toml": `:3: key log.node_name: unknown key (node_name is a top-level key: in TOML a key after a [table] header belongs to that table; put it above the first header)`,
		"key-of-another-table.toml":      `:2: key checks.KubeletUnhealthy.lvm_timeout: unknown key (lvm_timeout is a key of [checks.DiskUsageHigh])`,
		// A check's name cut short or ended otherwise, too far for a near
		// spelling, is the one check it begins as (before, "unknown key"
		// alone); a beginning two checks share suggests neither.
		"check-name-cut-short.toml":       `:1: key checks.DiskUsage: unknown key (did you mean checks.DiskUsageHigh?)`,
		"check-name-ended-otherwise.toml": `:2: key checks.ClockNotSynced: unknown key (did you mean checks.ClockNotSynchronized?)`,
		"check-name-prefix-of-two.toml":   `:1: key checks.Kubelet: unknown key`,
		// A kernel log condition or event is no check: said how it is
		// turned off (before, "unknown key" alone).
		"kmsg-condition-as-check.toml": `:1: key checks.ReadonlyFilesystem: unknown key (ReadonlyFilesystem is the kernel log monitor's rule of that name, not a check: kmsg.disable = ["ReadonlyFilesystem"] turns it off; autopilot-health kmsg rules lists them)`,
		"kmsg-event-as-check.toml":     `:3: key checks.TaskHung: unknown key (TaskHung is the kernel log monitor's rule of that name, not a check: kmsg.disable = ["TaskHung"] turns it off; autopilot-health kmsg rules lists them)`,
		// A key of several tables under a table not one of them names
		// them, as one of a single table does (before, "unknown key"
		// alone: restart_cooldown, listed in the README beside
		// runner.first_run_spread, is a key of two checks' tables).
		"key-of-two-tables-under-runner.toml":  `:3: key runner.restart_cooldown: unknown key (restart_cooldown is a key of [checks.ContainerRuntimeUnhealthy] and [checks.KubeletUnhealthy])`,
		"key-of-two-other-tables.toml":         `:3: key checks.DiskUsageHigh.restart_cooldown: unknown key (restart_cooldown is a key of [checks.ContainerRuntimeUnhealthy] and [checks.KubeletUnhealthy])`,
		"key-of-two-tables-at-top-level.toml":  `:1: key restart_cooldown: unknown key (restart_cooldown is a key of [checks.ContainerRuntimeUnhealthy] and [checks.KubeletUnhealthy]: write it below its table's header)`,
		"key-of-every-check-under-runner.toml": `:2: key runner.interval: unknown key (interval is a key of 20 tables, such as [checks.APIServerSourceIPUnavailable])`,
		// The shipped file comments out every line, table headers too: a
		// key uncommented without its header is a top-level key to TOML.
		"table-header-commented-out.toml": `:2: key listen_address: unknown key (listen_address is a key of [metrics], whose header above it, at line 1, is commented out: uncomment the header too)`,
		// A table's key above every header.
		"table-key-at-top-level.toml": `:1: key listen_address: unknown key (listen_address is a key of [metrics]: write it below a [metrics] header)`,
		// The default file's last table is [kmsg]: a key appended to it
		// is kmsg's, and its name, known elsewhere, says more than the
		// nearest spelling (kmsg.rules).
		"top-level-key-after-kmsg.toml": `:3: key kmsg.role: unknown key (role is a top-level key: in TOML a key after a [table] header belongs to that table; put it above the first header)`,
		// A file saved with a byte order mark (an editor on Windows):
		// the decoder skips it, and so do the lines.
		"bom-unknown-key.toml": `:2: key runner.first_run_sprd: unknown key (did you mean runner.first_run_spread?)`,
		// UTF-16's byte order mark is no UTF-8 (TOML's only encoding):
		// refused at line 1, before a UTF-8 text too (the decoder skipped
		// it there and the file loaded, its errors without their line), and
		// a file in UTF-16 says what to do (before: "files cannot contain
		// NULL bytes; probably using UTF-16").
		"utf16.toml":   `:1: the file is UTF-16 (its byte order mark, 0xff 0xfe): TOML files are UTF-8; convert it first, e.g. iconv -f UTF-16 -t UTF-8 {file} > {file}.new && mv {file}.new {file}`,
		"utf16be.toml": `:1: the file is UTF-16 (its byte order mark, 0xfe 0xff): TOML files are UTF-8; convert it first, e.g. iconv -f UTF-16 -t UTF-8 {file} > {file}.new && mv {file}.new {file}`,
		// UTF-16's mark before text with no NUL byte (UTF-16 has one in
		// each ASCII character, and keys are ASCII) is not UTF-16: the
		// advice to convert it from UTF-16 made it CJK characters.
		"utf16-bom-before-utf8.toml":   `:1: the file starts with UTF-16's byte order mark (0xff 0xfe) but is not UTF-16 (no NUL byte): TOML files are UTF-8; remove the mark's two bytes, e.g. tail -c +3 {file} > {file}.new && mv {file}.new {file}`,
		"utf16be-bom-before-utf8.toml": `:1: the file starts with UTF-16's byte order mark (0xfe 0xff) but is not UTF-16 (no NUL byte): TOML files are UTF-8; remove the mark's two bytes, e.g. tail -c +3 {file} > {file}.new && mv {file}.new {file}`,
		// UTF-32's marks: little-endian's starts with UTF-16's (it was
		// called UTF-16, and converting it from UTF-16 left NUL bytes);
		// big-endian's was the decoder's "probably using UTF-16".
		"utf32.toml":   `:1: the file is UTF-32 (its byte order mark, 0xff 0xfe 0x00 0x00): TOML files are UTF-8; convert it first, e.g. iconv -f UTF-32 -t UTF-8 {file} > {file}.new && mv {file}.new {file}`,
		"utf32be.toml": `:1: the file is UTF-32 (its byte order mark, 0x00 0x00 0xfe 0xff): TOML files are UTF-8; convert it first, e.g. iconv -f UTF-32 -t UTF-8 {file} > {file}.new && mv {file}.new {file}`,
		// The decoder matches keys without regard to case; the daemon's
		// are spelt one way.
		"case-table.toml":           `:1: key checks.diskusagehigh: unknown key: keys are case-sensitive (did you mean checks.DiskUsageHigh?)`,
		"case-key.toml":             `:2: key checks.DiskUsageHigh.SPACE_PERCENT: unknown key: keys are case-sensitive (did you mean checks.DiskUsageHigh.space_percent?)`,
		"case-duplicate-table.toml": `:4: key checks.diskusagehigh: unknown key: keys are case-sensitive (did you mean checks.DiskUsageHigh?)`,
		"listen-port.toml":          `:2: key metrics.listen_address: must be host:port or :port with a port from 1 to 65535, got "127.0.0.1:99999"`,
		// A port is a decimal number: a service name would be looked up
		// in /etc/services (":http" bound port 80), a sign dropped, and
		// no port at all was refused as port 0.
		"listen-port-service-name.toml": `:2: key metrics.listen_address: must have a port that is a decimal number from 1 to 65535 such as ":20257" (a service name such as "http" is not looked up), got ":http"`,
		"listen-port-signed.toml":       `:2: key metrics.listen_address: must have a port that is a decimal number from 1 to 65535 such as ":20257" (a service name such as "http" is not looked up), got "127.0.0.1:+80"`,
		"listen-port-empty.toml":        `:2: key metrics.listen_address: must name a port after the colon, a decimal number from 1 to 65535 such as ":20257", got ":"`,
		// A host is an IP address or a host name: a space in it is no
		// host net.Listen can find ("lookup 0.0.0.0 : no such host"), and
		// the daemon ran on without /metrics, retrying for ever.
		"listen-host-space.toml":         `:2: key metrics.listen_address: must have a host that is an IP address or a host name (letters, digits, '-', '.', '_'), or none (":20257", every address), got "0.0.0.0 :20257"`,
		"listen-host-leading-space.toml": `:2: key metrics.listen_address: must have a host that is an IP address or a host name (letters, digits, '-', '.', '_'), or none (":20257", every address), got " :20257"`,
		// Port 0 is one the kernel picks at each start: Prometheus,
		// which scrapes a fixed <node IP>:port, could never find it.
		"listen-port-zero.toml":          `:2: key metrics.listen_address: must not be port 0 (a port the kernel picks at each start, which Prometheus cannot find): give the port it scrapes, such as ":20257", got ":0"`,
		"listen-port-zero-loopback.toml": `:2: key metrics.listen_address: must not be port 0 (a port the kernel picks at each start, which Prometheus cannot find): give the port it scrapes, such as ":20257", got "127.0.0.1:0"`,
		"control-socket-long.toml":       `:2: key control_socket: must be at most 107 bytes (a Unix socket path), got 135`,
		"kmsg-rule-first-of-two.toml":    `:1: key kmsg.rules[0]: kmsg rule A: event reason "DiskExploded" is not a kernel-log event of the catalog (want one of TaskHung, Ext4Error, Ext4Warning, IOError, BlockIOError, NvmeError, AtaError, NvidiaXidError, MemoryReadError, UnregisterNetDevice, CperHardwareErrorCorrected, CperHardwareErrorRecoverable, PodVolumeReadOnly)`,
		"kmsg-rule-second-of-two.toml":   ":7: key kmsg.rules[1]: kmsg rule B: pattern: error parsing regexp: missing closing ): `^b(`",
		"url.toml":                       `:2: key checks.ProxyNotServing.metrics_url: must be an http:// or https:// URL, got "127.0.0.1:9587/metrics"`,
		"tamper-proc.toml":               `:2: key checks.NodeTampered.paths: scan pattern "/proc/kmsg": under /proc, which the helper does not scan`,
		"wrong-type.toml":                `:2: key checks.DiskUsageHigh.space_percent: wrong type: must be an integer, got a string`,
		"kmsg-disable.toml":              `:2: key kmsg.disable: unknown rule "Nope": autopilot-health kmsg rules lists the rules (their names are case-sensitive)`,
		"kmsg-rule-pattern.toml":         ":1: key kmsg.rules[0]: kmsg rule ReadonlyFilesystem: pattern: error parsing regexp: missing closing ): `Remounting filesystem read-only (`",
		"heartbeat-period.toml":          `:2: key kubernetes.heartbeat_period: must be between 30s and 1h, got "1ms"`,
		"detect-interval.toml":           `:3: key detect.interval: must be between 10s and 1h, got "1s"`,
		"report-interval.toml":           `:2: key kubernetes.report_interval: must be between 30s and 1h, got "1ms"`,
		"report-interval-ceiling.toml":   `:3: key kubernetes.report_interval: must be between 30s and 1h, got "1h30m0s"`,
		"check-interval.toml":            `:2: key checks.ProxyNotServing.interval: must be between 1s and 24h, got "1ms"`,
		"check-interval-ceiling.toml":    `:2: key checks.CertRenewalFailing.interval: must be between 1s and 24h, got "168h0m0s"`,
		"check-timeout.toml":             `:3: key checks.KubeletUnhealthy.timeout: must be between 100ms and interval (10s), got "1ms"`,
		"first-run-spread.toml":          `:2: key runner.first_run_spread: must be between 0s and 5m, got "10m0s"`,
		"restart-cooldown.toml":          `:2: key checks.ContainerRuntimeUnhealthy.restart_cooldown: must be at least 1s, got "0s"`,
		"restart-threshold.toml":         `:2: key checks.ServiceNotRecovering.restart_threshold: must be between 1 and 100, got 1000`,
		"io-error-threshold.toml":        `:2: key checks.DisksFailure.io_error_threshold: must be between 1 and 1000, got 100000000`,
		"journalctl-path.toml":           `:2: key checks.KubeletHeartbeatFailed.journalctl: must be an absolute path, got "journalctl"`,
		"heartbeat-match-none.toml":      `:2: key checks.KubeletHeartbeatFailed.match: must list at least one string`,
		"heartbeat-match-empty.toml":     `:2: key checks.KubeletHeartbeatFailed.match: entries must not be empty`,
		"heartbeat-max-entries.toml":     `:2: key checks.KubeletHeartbeatFailed.max_entries: must be between 100 and 10000000, got 0`,
		"io-error-window.toml":           `:3: key checks.DisksFailure.io_error_window: must be between 1s and 24h, got "8760h0m0s"`,
		"critical-tasks-none.toml":       `:2: key kmsg.critical_tasks: must list at least one task: with none, KernelDeadlock can never be set (to turn it off, use kmsg.disable = ["KernelDeadlock"])`,
		"critical-tasks-empty.toml":      `:2: key kmsg.critical_tasks: must list task names (a * matches any run of characters), one per string: non-empty, no comma, no control character, no whitespace at either end, got ""`,
		"critical-tasks-space.toml":      `:3: key kmsg.critical_tasks: must list task names (a * matches any run of characters), one per string: non-empty, no comma, no control character, no whitespace at either end, got "kubelet, containerd"`,
		"critical-tasks-padded.toml":     `:3: key kmsg.critical_tasks: must list task names (a * matches any run of characters), one per string: non-empty, no comma, no control character, no whitespace at either end, got "kubelet "`,
		"ignore-devices-empty.toml":      `:2: key kmsg.ignore_devices: must list block device name prefixes, each non-empty and without whitespace, got ""`,
		"cdi-kind.toml":                  `:2: key checks.GpuActivationFailed.cdi_kind: must be a CDI kind <vendor>/<class> such as "nvidia.com/gpu", got "nvidia.com"`,
		"cdi-spec-dirs-none.toml":        `:2: key checks.GpuActivationFailed.cdi_spec_dirs: must list at least one directory: with none, no GPU can ever be named in a CDI spec`,
		"proxy-addresses.toml":           `:2: key checks.APIServerSourceIPUnavailable.proxy_addresses: must list IP addresses or CIDR prefixes such as "10.0.0.5" or "10.0.0.0/24", got "10.0.0.0/33"`,
		"tamper-max-wait.toml":           `:2: key checks.NodeTampered.baseline_max_wait: must be between 1m and 24h, got "30s"`,
		"tamper-gate-relative.toml":      `:2: key checks.NodeTampered.baseline_after: must list absolute, clean paths other than /, got "etc/cni/*.conflist"`,
		"tamper-tolerate-glob.toml":      `:2: key checks.NodeTampered.tolerate_gpu: bad glob "/etc/containerd/[conf.d": syntax error in pattern`,
		"audit-max-read.toml":            `:2: key checks.APIServerSourceIPUnavailable.max_read_bytes: must be between 1048576 (1 MiB) and 1073741824 (1 GiB), got 4096`,
		"excluded-users.toml":            `:2: key checks.APIServerSourceIPUnavailable.excluded_user_prefixes: must list user name prefixes, each non-empty and without whitespace, got ""`,
		// A dotted key defines its tables: the timeout's error (a key the
		// file does not set) is at the line that names its table, as
		// under a table header.
		"timeout-over-dotted-interval.toml":   `:1: key checks.KubeletUnhealthy.timeout: must not be longer than interval (2s), got 5s`,
		"timeout-over-interval-in-table.toml": `:1: key checks.KubeletUnhealthy.timeout: must not be longer than interval (2s), got 5s`,
		// A rule written inline: at its element's line, not its table's.
		"kmsg-rule-inline.toml":        ":3: key kmsg.rules[0]: kmsg rule X: pattern: error parsing regexp: missing closing ): `(`",
		"kmsg-rule-inline-second.toml": ":4: key kmsg.rules[1]: kmsg rule B: pattern: error parsing regexp: missing closing ): `^b(`",
		// A key of an inline rule the daemon does not know: at its own
		// line, as in a [[kmsg.rules]] table, not at the array's.
		"kmsg-rule-inline-unknown-key.toml": `:4: key kmsg.rules.severity: unknown key`,
		"kmsg-rule-inline-case-key.toml":    `:4: key kmsg.rules.Pattern: unknown key: keys are case-sensitive (did you mean kmsg.rules.pattern?)`,
		// An inline table over several lines (TOML 1.1, which the decoder
		// reads): each key at its own line, not the line of the table's {.
		"kmsg-rule-multiline-inline-unknown-key.toml": `:8: key kmsg.rules.severity: unknown key`,
		"multiline-inline-table-unknown-key.toml":     `:4: key checks.DiskUsageHigh.space_percnt: unknown key (did you mean checks.DiskUsageHigh.space_percent?)`,
		"multiline-inline-table-bad-value.toml":       `:4: key checks.NodeInfoStale.max_age: must be at least 1s (the file is read at the check's runs, not when it is written: a shorter max_age finds it older at nearly every run unless the sync loop rewrites it more than once a second), got "0s"`,
		// A key that TOML must quote (a dot or a space in it) at its own
		// line, named as the decoder names it.
		"quoted-table-name.toml":            `:4: key "checks.DiskUsageHigh": unknown key (did you mean checks.DiskUsageHigh?)`,
		"quoted-key.toml":                   `:3: key checks.DiskUsageHigh."space percent": unknown key (did you mean checks.DiskUsageHigh.space_percent?)`,
		"quoted-case-table.toml":            ":4: key checks.\"Dis\u212aUsageHigh\": unknown key: keys are case-sensitive (did you mean checks.DiskUsageHigh?)",
		"quoted-case-table-wrong-type.toml": ":5: key checks.\"Dis\u212aUsageHigh\".space_percent: wrong type: must be an integer, got a string",
		// Two rules of one name: at the second (the one a built-in's name
		// would otherwise drop unseen).
		"kmsg-rule-duplicate.toml":         `:6: key kmsg.rules[1]: kmsg rule A: defined twice (first as kmsg.rules[0])`,
		"kmsg-rule-duplicate-builtin.toml": `:6: key kmsg.rules[1]: kmsg rule ReadonlyFilesystem: defined twice (first as kmsg.rules[0])`,
		// A rule without a pattern, or one that needs no text, would
		// match every kernel record: a perm rule's condition True for
		// the boot on a healthy node's first line.
		"kmsg-rule-no-pattern.toml":    `:5: key kmsg.rules[0]: kmsg rule MyReadOnly: no pattern: a rule without one would match every kernel record`,
		"kmsg-rule-matches-empty.toml": `:7: key kmsg.rules[1]: kmsg rule B: pattern "(mydrv: I/O error)*" matches an empty message: a pattern must require some text of the lines it is for (one that requires none, as ".*" or "x*", matches every kernel record)`,
		// A rule kmsg.disable names that is none: at its entry's line,
		// with the nearest name and where the names are listed (before,
		// "unknown rule" alone, at the list's line, of a name in another
		// case too).
		"kmsg-disable-other-case.toml": `:4: key kmsg.disable: unknown rule "readonlyfilesystem" (did you mean "ReadonlyFilesystem"?): autopilot-health kmsg rules lists the rules (their names are case-sensitive)`,
		"kmsg-disable-misspelt.toml":   `:2: key kmsg.disable: unknown rule "KernelDeadlok" (did you mean "KernelDeadlock"?): autopilot-health kmsg rules lists the rules (their names are case-sensitive)`,
		// A condition on a rule that emits an event was dropped unseen.
		"kmsg-rule-temp-condition.toml": `:1: key kmsg.rules[0]: kmsg rule MyReadOnly: condition "ReadonlyFilesystem" is for kind perm: a rule of kind temp emits its event reason ("Ext4Error") and sets no condition`,
		"kmsg-rule-reason.toml":         `:4: key kmsg.rules[0]: kmsg rule MyIO: event reason "DiskExploded" is not a kernel-log event of the catalog (want one of TaskHung, Ext4Error, Ext4Warning, IOError, BlockIOError, NvmeError, AtaError, NvidiaXidError, MemoryReadError, UnregisterNetDevice, CperHardwareErrorCorrected, CperHardwareErrorRecoverable, PodVolumeReadOnly)`,
		// PodVolumeReadOnly is a built-in rule's name (ReadonlyFilesystem's
		// lines on a pod's volume): kmsg.disable turns it off, no rule
		// takes it, and its kind is no other rule's.
		"kmsg-rule-podvolume-name.toml": `:4: key kmsg.rules[0]: kmsg rule PodVolumeReadOnly: the name PodVolumeReadOnly and the kind pod-volume are the built-in rule's that makes a ReadonlyFilesystem line on a pod's volume a PodVolumeReadOnly event; it cannot be replaced or copied (kmsg.disable = ["PodVolumeReadOnly"] turns those events off)`,
		"kmsg-rule-podvolume-copy.toml": `:2: key kmsg.rules[0]: kmsg rule PodVolumeReadOnly: the name PodVolumeReadOnly and the kind pod-volume are the built-in rule's that makes a ReadonlyFilesystem line on a pod's volume a PodVolumeReadOnly event; it cannot be replaced or copied (kmsg.disable = ["PodVolumeReadOnly"] turns those events off)`,
		"kmsg-rule-podvolume-kind.toml": `:1: key kmsg.rules[0]: kmsg rule MyVolumes: the name PodVolumeReadOnly and the kind pod-volume are the built-in rule's that makes a ReadonlyFilesystem line on a pod's volume a PodVolumeReadOnly event; it cannot be replaced or copied (kmsg.disable = ["PodVolumeReadOnly"] turns those events off)`,
		// One path for both sockets: the control socket, bound first,
		// would answer `autopilot-health status`. At the key the file sets.
		"status-socket-is-control.toml": `:2: key status.socket: must not be the control socket, control_socket = "/run/autopilot-health/control.sock"`,
		"control-socket-is-status.toml": `:2: key control_socket: must not be the status socket, status.socket = "/run/autopilot-health/status.sock"`,
		// Names systemd refuses to load: no unit type, a control character.
		"unit-name-dot.toml":     `:2: key checks.NodeServiceDown.worker_units: must list systemd unit names such as "kubelet.service", got "."`,
		"unit-name-control.toml": `:3: key checks.KubeletUnhealthy.unit: must list systemd unit names such as "kubelet.service", got "kubelet.service\n"`,
		// The same unit twice would be reported twice in the condition's message.
		"unit-listed-twice.toml":        `:5: key checks.ServiceNotRecovering.worker_units: must list each unit once, got "kubelet.service" twice`,
		"unit-listed-twice-inline.toml": `:2: key checks.NodeServiceDown.controlplane_units: must list each unit once, got "syself-tunnel-server.service" twice`,
		// Each list that a check names or reads entry by entry: a repeat
		// would be named, reported or read twice.
		"certificate-listed-twice.toml":    `:5: key checks.CertRenewalFailing.certificates: must list each certificate once, got "/var/lib/kubelet/pki/kubelet-client-current.pem" twice`,
		"cdi-spec-dir-listed-twice.toml":   `:2: key checks.GpuActivationFailed.cdi_spec_dirs: must list each directory once, got "/etc/cdi" twice`,
		"protected-path-listed-twice.toml": `:2: key checks.NodeTampered.paths: must list each path once, got "/etc/kubernetes" twice`,
		"match-listed-twice.toml":          `:2: key checks.KubeletHeartbeatFailed.match: must list each string once, got "Unable to update node status" twice`,
		"user-prefix-listed-twice.toml":    `:2: key checks.APIServerSourceIPUnavailable.excluded_user_prefixes: must list each prefix once, got "system:" twice`,
		// A multi-line string in a list: the keys after it at their lines
		// (the line scanner took the string's end for a line of the list,
		// and named no line).
		"multiline-string-in-list-then-table.toml": `:5: key checks.DiskUsageHigh.space_percent: must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got 120`,
		// A duration of the right shape that a Go duration cannot hold.
		"duration-out-of-range.toml": `:3: key checks.KubeletUnhealthy.interval: duration "2562048h" is out of range: a duration is at most 2562047h (about 292 years)`,
		// A table defined by dotted keys and by a [header] is defined
		// twice (TOML 1.0, "Tables"), whichever comes first: named whole
		// at its second definition, as a second header is (before, the
		// file loaded, the two merged).
		"table-dotted-then-header.toml":          `:4: key log: Key 'log' has already been defined (by the dotted key at line 2: a table is defined once, by its [header] or by dotted keys)`,
		"table-dotted-in-table-then-header.toml": `:4: key checks.DiskUsageHigh: Key 'checks.DiskUsageHigh' has already been defined (by the dotted key at line 2: a table is defined once, by its [header] or by dotted keys)`,
		"table-header-then-dotted.toml":          `:5: key checks.DiskUsageHigh: Key 'checks.DiskUsageHigh' has already been defined (by the [checks.DiskUsageHigh] header at line 1: a table is defined once, by its [header] or by dotted keys)`,
	}
	files, _ := filepath.Glob("testdata/bad/*.toml")
	if len(files) != len(want) {
		t.Errorf("%d files in testdata/bad, %d expectations", len(files), len(want))
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			_, _, err := Load(f, false)
			if err == nil {
				t.Fatal("loaded without error")
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			// {file}: the file's own path, in the commands a message
			// suggests.
			w := f + strings.ReplaceAll(want[name], "{file}", f)
			if got := err.Error(); got != w {
				t.Errorf("error\n got: %s\nwant: %s", got, w)
			}
		})
	}
}

// A table of the printed default defined again below it (overrides
// appended to config default's output) is refused at the second header,
// naming the first's line: before, "has already been defined." alone,
// the first some 300 lines above.
func TestDefinedTwiceNamesTheFirstLine(t *testing.T) {
	first := bytes.Count(defaultTOML[:bytes.Index(defaultTOML, []byte("\n[checks.DiskUsageHigh]\n"))+1], []byte("\n")) + 1
	data := append(append([]byte(nil), defaultTOML...), "\n[checks.DiskUsageHigh]\nspace_percent = 80\n"...)
	second := bytes.Count(data, []byte("\n")) - 1
	_, err := Parse("config.toml", data, nil)
	want := fmt.Sprintf("config.toml:%d: key checks.DiskUsageHigh: Key 'checks.DiskUsageHigh' has already been defined (first at line %d: a key or table is defined once)", second, first)
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}

// A duration too large for time.Duration is out of range; one of the wrong
// shape wants a unit. time.ParseDuration says "invalid duration" of both.
func TestDurationOutOfRangeOrMalformed(t *testing.T) {
	for s, outOfRange := range map[string]bool{
		"2562048h": true, "-2562048h": true, "+99999999999999999999ns": true, "2562047h47m17s": true, "1.5h2562047h": true,
		"10 seconds": false, "1d": false, "5": false, "": false, ".": false, "h": false, "1h ": false, "--1h": false,
	} {
		var d Duration
		err := d.UnmarshalText([]byte(s))
		if err == nil {
			t.Errorf("%q: parsed as %s", s, d)
			continue
		}
		if got := strings.Contains(err.Error(), "out of range"); got != outOfRange {
			t.Errorf("%q: %v (out of range: want %v)", s, err, outOfRange)
		}
	}
	var d Duration
	if err := d.UnmarshalText([]byte("2562047h")); err != nil || d.Duration != 2562047*time.Hour {
		t.Errorf("2562047h: %v, %v", d, err)
	}
}

// host_root is compared with "/" (the privileged helper, LVM, journalctl's
// --root): a root written another way ("//", "/./", "/srv/") is cleaned
// when the file is read.
func TestHostRootIsCleaned(t *testing.T) {
	for in, want := range map[string]string{"//": "/", "/./": "/", "/srv/../": "/", "///": "/", "/srv/": "/srv", "/srv//fixture/.": "/srv/fixture", "/": "/"} {
		c, err := Parse("x.toml", []byte(fmt.Sprintf("host_root = %q\n", in)), Default())
		if err != nil {
			t.Errorf("host_root = %q: %v", in, err)
			continue
		}
		if c.HostRoot != want {
			t.Errorf("host_root = %q: HostRoot %q, want %q", in, c.HostRoot, want)
		}
		if want == "/" {
			if got := c.HostPath("/etc/kubernetes"); got != "/etc/kubernetes" {
				t.Errorf("host_root = %q: HostPath = %q", in, got)
			}
			if d := Diff(Default(), c); len(d) != 0 {
				t.Errorf("host_root = %q differs from the default / in %v", in, d)
			}
		}
	}
}

// Unit names are what systemd loads (unit_name_is_valid with a plain name
// or an instance): a unit type after the last dot, letters, digits and
// ":-_.\\@" before it, at most 255 bytes; a template is never loaded.
func TestUnitNames(t *testing.T) {
	for name, valid := range map[string]bool{
		"kubelet.service": true, "getty@tty1.service": true, "systemd-fsck@dev-disk-by\\x2dlabel-root.service": true,
		"-.mount": true, "var-lib-kubelet.mount": true, "system-getty.slice": true, "a:b_c.d.timer": true,
		strings.Repeat("k", 247) + ".service": true, strings.Repeat("k", 248) + ".service": false,
		".": false, "kubelet": false, "kubelet.": false, ".service": false, "kubelet.servic": false,
		"kubelet.service\n": false, "kube\tlet.service": false, "kube let.service": false, "kube/let.service": false,
		"getty@.service": false, "@tty1.service": false, "kübelet.service": false, "": false,
	} {
		if got := validUnitName(name); got != valid {
			t.Errorf("validUnitName(%q) = %v, want %v", name, got, valid)
		}
	}
	// Every unit key takes them.
	src := "[checks.KubeletUnhealthy]\nunit = \"getty@tty1.service\"\n[checks.ServiceNotRecovering]\nworker_units = [\"-.mount\", \"kubelet.service\"]\n" +
		"[checks.NodeServiceDown]\ncontrolplane_units = [\"systemd-fsck@dev-disk-by\\\\x2dlabel-root.service\"]\n"
	if _, err := Parse("units.toml", []byte(src), Default()); err != nil {
		t.Errorf("%v\n%s", err, src)
	}
}

func TestKeyLines(t *testing.T) {
	src := `top = 1 # comment [x]
[a]
b = "has # hash"
list = [
  "x",   # [not a table]
  "y",
]
"quoted.key" = 2
after = 3
[a.c]
s = """
d = 4
"""
e = 5
[[arr]]
f = 6
`
	idx := keyLines([]byte(src))
	for key, line := range map[string]int{"top": 1, "a": 2, "a.b": 3, "a.list": 4, `a."quoted.key"`: 8, "a.after": 9, "a.c": 10, "a.c.s": 11, "a.c.e": 14, "arr": 15, "arr.f": 16} {
		if idx[key] != line {
			t.Errorf("line of %s = %d, want %d", key, idx[key], line)
		}
	}
	if _, ok := idx["a.c.d"]; ok {
		t.Error("a line inside a multi-line string was taken for a key")
	}
	if got := idx.find("a.c.zzz"); got != 10 {
		t.Errorf("find falls back to the parent table: got %d, want 10", got)
	}

	// A dotted key defines its parent tables at the first line that
	// names them; an inline table in an array is an element at its own
	// line; an element the index does not know falls back to its array,
	// not to the array's table.
	idx = keyLines([]byte(`x.y.z = 1
x.y.w = 2
[t]
u.v = 3
rules = [ { a = "[{" }, # {
  {b = [1, {c = 2}]},
  3, {d = 4} ]
list = ["{", 2]
after = 5
`))
	for key, line := range map[string]int{"x": 1, "x.y": 1, "x.y.z": 1, "x.y.w": 2, "t": 3, "t.u": 4, "t.u.v": 4,
		"t.rules": 5, "t.rules[0]": 5, "t.rules[1]": 6, "t.rules[2]": 7, "t.list": 8, "t.after": 9,
		// The keys of an inline element, at its line: under the element,
		// and under the array at the first element that has the key.
		"t.rules[0].a": 5, "t.rules.a": 5, "t.rules[1].b": 6, "t.rules.b": 6, "t.rules[2].d": 7, "t.rules.d": 7} {
		if idx[key] != line {
			t.Errorf("line of %s = %d, want %d", key, idx[key], line)
		}
	}
	for _, k := range []string{"t.rules[3]", "t.list[0]", "t.x.c", "t.rules.c", "t.rules[1].c", "t.rules.3"} {
		if _, ok := idx[k]; ok {
			t.Errorf("%s indexed", k)
		}
	}
	if got := idx.find("t.list[0]"); got != 8 {
		t.Errorf("find of an element falls back to its array: got %d, want 8", got)
	}
	if got := idx.find("x.y.q"); got != 1 {
		t.Errorf("find of a key under a dotted key's table: got %d, want 1", got)
	}

	// A plain element of a multi-line array is at its own line, unless it
	// is on the array's line: a repeated entry is named where it is.
	idx = keyLines([]byte(`units = ["a", # "b",
  "b", 'c,]', # d
  # "e"
  [1, 2], "f"]
one = ["x", "y"]
`))
	for key, line := range map[string]int{"units": 1, "units[1]": 2, "units[2]": 2, "units[3]": 4, "units[4]": 4, "one": 5} {
		if idx[key] != line {
			t.Errorf("line of %s = %d, want %d", key, idx[key], line)
		}
	}
	for _, k := range []string{"units[0]", "units[5]", "one[0]", "one[1]"} {
		if _, ok := idx[k]; ok {
			t.Errorf("%s indexed", k)
		}
	}

	// An inline table over several lines (TOML 1.1, which the decoder
	// reads): each key at its own line, at any depth, dotted keys
	// defining their tables; in an array, under the element and the
	// array's name; in an array of tables' element, under the array's
	// name too. A one-line inline table's keys are at its line.
	idx = keyLines([]byte(`checks = {
  A = { x = 1 },
  B = {
    y.z = "{[",   # }]
    w = [ { v = 1,
            u = 2 },
    ],
  },
}
after = 1
[[arr]]
t = {
  s = 1 }
`))
	for key, line := range map[string]int{"checks": 1, "checks.A": 2, "checks.A.x": 2, "checks.B": 3, "checks.B.y": 4, "checks.B.y.z": 4,
		"checks.B.w": 5, "checks.B.w[0]": 5, "checks.B.w[0].v": 5, "checks.B.w.v": 5, "checks.B.w[0].u": 6, "checks.B.w.u": 6,
		"after": 10, "arr[0].t": 12, "arr.t": 12, "arr[0].t.s": 13, "arr.t.s": 13} {
		if idx[key] != line {
			t.Errorf("line of %s = %d, want %d", key, idx[key], line)
		}
	}
}

// keyLines reads a value nested deeper than any key of the configuration
// (a file of brackets, up to the 1 MiB read) at a cost linear in its
// depth: a key built for each level of it would allocate the square of the
// depth (gigabytes for a 100 KB file, and minutes of a start or a reload).
func TestKeyLinesOfADeepValueIsLinear(t *testing.T) {
	const depth = 20000
	for _, open := range []string{"[", "{a = ", "[{a = "} {
		close := strings.NewReplacer("[", "]", "{a = ", "}").Replace(open)
		src := []byte("x = " + strings.Repeat(open, depth) + "1" + strings.Repeat(close, depth) + "\ny = 2\n")
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		idx := keyLines(src)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 32<<20 {
			t.Errorf("%q %d deep: keyLines allocated %d MiB", open, depth, n>>20)
		}
		if idx["y"] != 2 {
			t.Errorf("%q %d deep: the key after it at line %d, want 2", open, depth, idx["y"])
		}
	}
}

// fuzzSeeds are FuzzParse's seeds. Small: the fuzzer minimizes every new
// interesting input, which on the whole 7 KiB default file takes minutes per
// input.
var fuzzSeeds = []string{
	"host_root = \"/\"\nrole = \"worker\"\n",
	"[checks.DiskUsageHigh]\nenabled = true\ninterval = \"2m\"\nspace_percent = 90\nmount_points_exclude = \"^/(dev|proc)($|/)\"\n",
	"[checks.ServiceNotRecovering]\nworker_units = [\"kubelet.service\", \"containerd.service\"]\n",
	"[kmsg]\ndisable = [\"NvmeError\"]\n[[kmsg.rules]]\nname = \"X\"\nkind = \"temp\"\nreason = \"IOError\"\npattern = \"^x\"\n",
	"[metrics]\nlisten_address = \":20257\"\n[kubernetes]\nheartbeat_period = \"5m\"\n",
	// Nested values, dotted keys and strings for the bounds' scan.
	"kmsg = { rules = [ { name = \"X\", kind = \"temp\", reason = \"IOError\", pattern = '''[{\"x''' } ] }\n",
	"checks.NodeTampered.paths = [\"/etc\", \"\"\"\n[[\"\"\"] # {{\n[\"checks\".'DiskUsageHigh']\nenabled = false\n",
}

func FuzzParse(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add([]byte(seed))
	}
	files, _ := filepath.Glob("testdata/bad/*.toml")
	for _, p := range files {
		b, _ := os.ReadFile(p)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		boundsProperty(t, data)
		c, err := Parse("fuzz.toml", data, Default())
		if err == nil && c == nil {
			t.Fatal("nil config without error")
		}
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			if !strings.HasPrefix(err.Error(), "fuzz.toml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		// What a reload compares: a file against itself differs in
		// nothing, and every key that differs from the defaults is one
		// the file names (or a list it sets).
		again, err := Parse("fuzz.toml", data, Default())
		if err != nil {
			t.Fatalf("the same file parsed twice: %v", err)
		}
		if d := Diff(c, again); len(d) != 0 {
			t.Fatalf("a file differs from itself in %v", d)
		}
		for _, k := range Diff(Default(), c) {
			if keyLines(data).find(k) == 0 {
				t.Fatalf("Diff names %s, which the file does not set", k)
			}
		}
	})
}

// The bounds are inclusive: a file with every bounded key at its floor, then
// one with every key at its ceiling, is valid.
func TestBoundsAreInclusive(t *testing.T) {
	for _, src := range []string{
		"[kubernetes]\nheartbeat_period = \"30s\"\nreport_interval = \"30s\"\n[runner]\nfirst_run_spread = \"0s\"\n" +
			"[checks.KubeletUnhealthy]\ninterval = \"1s\"\ntimeout = \"100ms\"\nrestart_cooldown = \"1s\"\n" +
			"[checks.ContainerRuntimeUnhealthy]\nrestart_cooldown = \"1s\"\n" +
			"[checks.ServiceNotRecovering]\nrestart_threshold = 1\n" +
			"[checks.APIServerSourceIPUnavailable]\nmax_read_bytes = 1048576\n" +
			"[checks.NodeTampered]\nbaseline_max_wait = \"1m\"\n" +
			// The shortest values that leave a check's answer to the
			// host: a file rewritten within a second, an estimated error
			// over 1 µs, and a certificate that expired ("only once it
			// has expired": legitimate).
			"[checks.NodeInfoStale]\nmax_age = \"1s\"\n" +
			"[checks.ClockNotSynchronized]\nmax_error = \"1us\"\n" +
			"[checks.CertRenewalFailing]\nrenew_within = \"1ns\"\n",
		"[kubernetes]\nheartbeat_period = \"1h\"\nreport_interval = \"1h\"\n[runner]\nfirst_run_spread = \"5m\"\n" +
			"[checks.KubeletUnhealthy]\ninterval = \"24h\"\ntimeout = \"24h\"\n" +
			"[checks.ServiceNotRecovering]\nrestart_threshold = 100\n" +
			"[checks.APIServerSourceIPUnavailable]\nmax_read_bytes = 1073741824\n" +
			"[kmsg]\ncritical_tasks = [\"kubelet\", \"qemu*\"]\nignore_devices = []\n" +
			"[checks.NodeTampered]\nbaseline_max_wait = \"24h\"\n",
	} {
		if _, err := Parse("bounds.toml", []byte(src), Default()); err != nil {
			t.Errorf("%v\n%s", err, src)
		}
	}
}

// lvm_timeout is bounded by the check's timeout only where there is an LVM
// part: with lvm_command = "" no lvm runs, and DiskUsageHigh's timeout is
// bounded as any check's (a config valid before the bound came in still
// loads).
func TestLVMTimeoutBoundsOnlyTheLVMPart(t *testing.T) {
	for _, src := range []string{
		"[checks.DiskUsageHigh]\nlvm_command = \"\"\ntimeout = \"20s\"\n",
		"[checks.DiskUsageHigh]\nlvm_command = \"\"\ninterval = \"10s\"\ntimeout = \"5s\"\n",
		"[checks.DiskUsageHigh]\nlvm_command = \"\"\nlvm_timeout = \"1m\"\n",
	} {
		if _, err := Parse("nolvm.toml", []byte(src), Default()); err != nil {
			t.Errorf("%v\n%s", err, src)
		}
	}
	// With LVM, the bound holds (TestBadConfigs: lvm-timeout-over-wait.toml,
	// timeout-under-lvm-wait.toml).
	if _, err := Parse("lvm.toml", []byte("[checks.DiskUsageHigh]\ntimeout = \"20s\"\n"), Default()); err == nil {
		t.Error("timeout 20s with lvm_timeout 10s and lvm_command set: loaded")
	}
}

// default.toml states the allowed range of every bounded key, next to it.
func TestDefaultTOMLStatesTheBounds(t *testing.T) {
	for _, want := range []string{
		"# Allowed: 30s to 1h (every node writes to the API server this often).\nheartbeat_period",
		"# Allowed: 30s to 1h.\nreport_interval",
		"# Allowed: 0s to 5m.\nfirst_run_spread",
		"Allowed: interval 1s\n# to 24h; timeout 100ms up to the check's interval.",
		"Allowed: 1s or more.\nrestart_cooldown = \"1m\"",
		"# Allowed: 1s or more.\nrestart_cooldown = \"2m\"",
		"# One name per string: non-empty, no comma, no whitespace at either end.\ncritical_tasks",
		"# would match every device) and without whitespace.\nignore_devices",
		"Allowed: 1 MiB to 1 GiB.\nmax_read_bytes",
		"# Allowed: 1 to 100.\nrestart_threshold",
		"# Allowed: 1 to 99.\nspace_percent",
		"Allowed: 1m to 24h, not under\n# settle.\nbaseline_max_wait",
		"# Allowed: 1s or more (the file is read at the check's runs, not when it is\n# written: a shorter max_age finds it older at nearly every run).\nmax_age",
		"Allowed: 1us or more (adjtimex reports the estimated error in\n# whole microseconds).\nmax_error",
	} {
		if !strings.Contains(string(defaultTOML), want) {
			t.Errorf("default.toml lacks %q", want)
		}
	}
}

// Every condition that a check (not the kernel log monitor) evaluates has
// its [checks.<Condition>] table, with a positive interval and timeout by
// default: the runner would otherwise probe it without pause.
func TestEveryCheckedConditionHasATable(t *testing.T) {
	c := Default()
	tables := map[string]bool{}
	for _, d := range report.Conditions {
		if d.Source == report.SourceKmsg {
			continue
		}
		tables[d.Type] = true
		com, ok := c.Checks.Common(d.Type)
		if !ok {
			t.Errorf("%s (source %s) has no [checks.%s] table", d.Type, d.Source, d.Type)
			continue
		}
		if com.Interval.Duration <= 0 || com.Timeout.Duration <= 0 {
			t.Errorf("checks.%s: interval %s, timeout %s; want both positive", d.Type, com.Interval, com.Timeout)
		}
	}
	for _, name := range c.Checks.Names() {
		if !tables[name] {
			t.Errorf("[checks.%s] is not a check-sourced condition of the catalog", name)
		}
	}
}

// Custom kernel log rules without a literal anchor are candidates on every
// line; however many there are, the file validates and, compiled as the
// daemon compiles them, every one matches.
func TestManyUnanchoredKmsgRules(t *testing.T) {
	const n = 20
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "[[kmsg.rules]]\nname = \"Mine%02d\"\nkind = \"temp\"\nreason = \"IOError\"\npattern = '^[a-z]+ \\S+ \\d+$'\n", i)
	}
	c, err := Parse("many.toml", []byte(b.String()), Default())
	if err != nil {
		t.Fatal(err)
	}
	custom := make([]kmsg.Rule, len(c.Kmsg.Rules))
	for i, r := range c.Kmsg.Rules {
		custom[i] = kmsg.Rule{Name: r.Name, Kind: kmsg.Kind(r.Kind), Condition: r.Condition, Reason: r.Reason, Pattern: r.Pattern}
	}
	rules, err := kmsg.BuildRules(c.Kmsg.Disable, custom)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := kmsg.Compile(rules, c.Kmsg.CriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range rs.Matches(nil, []byte("mydrv sdq 42")) {
		got[m.Rule.Name] = true
	}
	for i := range n {
		if name := fmt.Sprintf("Mine%02d", i); !got[name] {
			t.Errorf("rule %s did not match", name)
		}
	}
	if len(got) != n {
		t.Errorf("%d rules matched, want %d", len(got), n)
	}
}

// A FIFO, a socket or a directory is refused at once with what it is (a
// FIFO blocked the start, a reload and the reload watcher until a writer
// came); a device or a file is read up to a bound (/dev/zero would be read
// without end) and a device with nothing to read for a second is given up
// (a terminal blocked); /dev/null is the defaults.
func TestLoadRefusesWhatIsNotAConfigFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("# comment\n"), maxFileSize/10+1), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cases := map[string]string{
		sock:        sock + " is a socket, not a regular file",
		fifo:        fifo + " is a FIFO, not a regular file",
		dir:         dir + " is a directory, not a regular file",
		"/dev/zero": "/dev/zero is larger than 1 MiB, the most read (a device)",
		big:         big + " is larger than 1 MiB, the most read (1048580 bytes)",
		// stat says 0 bytes, as of every file under /proc: not "(0 bytes)".
		"/proc/kallsyms": "/proc/kallsyms is larger than 1 MiB, the most read (its size not known: stat gave less than was read)",
	}
	// A terminal has nothing to read: given up after a second.
	if f, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0); err == nil {
		defer f.Close()
		cases["/dev/ptmx"] = "/dev/ptmx had nothing to read for 1s"
	}
	for path, want := range cases {
		done := make(chan error, 1)
		go func() { _, _, err := Load(path, false); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Load(%s) = %v, want an error with %q", path, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Load(%s) blocked", path)
		}
		if d := FileDigest(path); !strings.HasPrefix(d, "unreadable: ") || !strings.Contains(d, want) {
			t.Errorf("FileDigest(%s) = %q", path, d)
		}
	}
	if _, read, err := Load("/dev/null", false); err != nil || !read {
		t.Errorf("Load(/dev/null) = read %v, %v; want the defaults", read, err)
	}
}

// A custom rule that kmsg.disable turns off is never compiled by the
// daemon: a pattern of it that does not compile does not refuse the file.
func TestDisabledCustomRuleIsNotChecked(t *testing.T) {
	toml := `[kmsg]
disable = ["B"]

[[kmsg.rules]]
name = "A"
kind = "temp"
reason = "IOError"
pattern = "^a"

[[kmsg.rules]]
name = "B"
kind = "temp"
reason = "IOError"
pattern = "^b("
`
	if _, err := Parse("f.toml", []byte(toml), Default()); err != nil {
		t.Errorf("a bad rule that kmsg.disable lists: %v", err)
	}
	if _, err := Parse("f.toml", []byte(strings.Replace(toml, `disable = ["B"]`, `disable = []`, 1)), Default()); err == nil || !strings.Contains(err.Error(), "f.toml:10: key kmsg.rules[1]") {
		t.Errorf("the same rule not disabled: %v", err)
	}
}

// default.toml's kernel log lists are the monitor's own defaults (which
// replay and a monitor built without a configuration use).
func TestDefaultKmsgListsAreTheMonitors(t *testing.T) {
	c := Default()
	if !slices.Equal(c.Kmsg.IgnoreDevices, kmsg.DefaultIgnoreDevices) {
		t.Errorf("default.toml ignore_devices = %q, kmsg.DefaultIgnoreDevices = %q", c.Kmsg.IgnoreDevices, kmsg.DefaultIgnoreDevices)
	}
	if !slices.Equal(c.Kmsg.CriticalTasks, kmsg.DefaultCriticalTasks) {
		t.Errorf("default.toml critical_tasks = %q, kmsg.DefaultCriticalTasks = %q", c.Kmsg.CriticalTasks, kmsg.DefaultCriticalTasks)
	}
}

// shippedText is the configuration file the packages ship
// (packaging/deb/build.sh, packaging/sysext/build.sh): the default file with
// every line that is not a comment commented out, table headers included.
func shippedText() []string {
	var out []string
	for l := range strings.Lines(string(DefaultTOML())) {
		l = strings.TrimSuffix(l, "\n")
		if l != "" && !strings.HasPrefix(l, "#") {
			l = "# " + l
		}
		out = append(out, l)
	}
	return out
}

// The shipped file says "uncomment what you change". An operator who
// uncomments a key's line and not its table's header (commented out too)
// has written a top-level key: the error must say which table it belongs
// to, not only that it is unknown (a key the file shows). Each key line of
// the shipped file, uncommented alone: a top-level key loads, a table's key
// is refused naming its table.
func TestUncommentingOneKeyOfTheShippedFile(t *testing.T) {
	header := regexp.MustCompile(`^\[([A-Za-z0-9_.]+)\]$`)
	keyLine := regexp.MustCompile(`^([a-z_]+) = (.*)$`)
	shipped := shippedText()
	table := ""
	checked := 0
	for i, l := range strings.Split(strings.TrimSuffix(string(DefaultTOML()), "\n"), "\n") {
		if m := header.FindStringSubmatch(l); m != nil {
			table = m[1]
			continue
		}
		m := keyLine.FindStringSubmatch(l)
		if m == nil || strings.HasSuffix(m[2], "[") || strings.HasSuffix(m[2], "{") {
			continue // not a key, or a value over several lines
		}
		edited := slices.Clone(shipped)
		edited[i] = l
		_, err := Parse("config.toml", []byte(strings.Join(edited, "\n")+"\n"), Default())
		checked++
		switch {
		case table == "" && err != nil:
			t.Errorf("top-level key %s uncommented: %v", m[1], err)
		case table == "":
		case err == nil:
			t.Errorf("%s.%s uncommented without its header loaded", table, m[1])
		case !strings.Contains(err.Error(), fmt.Sprintf("key %s: unknown key (%s is a key of [%s], whose header above it", m[1], m[1], table)) ||
			!strings.Contains(err.Error(), "is commented out: uncomment the header too)"):
			t.Errorf("%s.%s uncommented without its header: the error does not name [%s] and its commented header: %v", table, m[1], table, err)
		}
	}
	if checked < 50 {
		t.Fatalf("only %d key lines found in the default file", checked)
	}
}

// An error that only a change of the file (its content, its name, its
// kind, its mode) ends is the file's: run refuses it with exit 2, which
// its unit does not restart on. One that may pass with the file as it is
// (an I/O error reading it, no memory, no descriptor left) is not: run
// exits 1 and is started again, or the node stays without its daemon
// until someone edits a good file.
func TestFileFault(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	syntax := write("syntax.toml", "role = \n")
	invalid := write("invalid.toml", "role = \"master\"\n")
	plain := write("plain", "")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	big := write("big.toml", strings.Repeat("# comment\n", maxFileSize/10+1))
	for _, p := range []string{
		syntax, invalid,
		filepath.Join(dir, "missing.toml"),  // ENOENT, named with --config
		filepath.Join(plain, "config.toml"), // ENOTDIR
		loop,                                // ELOOP
		filepath.Join(dir, strings.Repeat("x", 300)), // ENAMETOOLONG
		dir, fifo, sock, big,
	} {
		_, _, _, err := LoadDigest(p, false)
		if err == nil || !FileFault(err) {
			t.Errorf("LoadDigest(%s) = %v: FileFault %v, want an error of the file", p, err, FileFault(err))
		}
	}
	// Root reads a file of mode 0000; the unit's root, without
	// CAP_DAC_OVERRIDE, does not: the error open gives it.
	for _, errno := range []syscall.Errno{syscall.EACCES, syscall.EPERM} {
		err := fmt.Errorf("config: %w", &os.PathError{Op: "open", Path: "/etc/autopilot-health/config.toml", Err: errno})
		if !FileFault(err) {
			t.Errorf("FileFault(%v) = false, want true: a chmod (which starts the path unit) ends it", err)
		}
	}
	// A real EIO: a read of /proc/self/mem at address 0, never mapped.
	if _, _, _, err := LoadDigest("/proc/self/mem", false); !errors.Is(err, syscall.EIO) || FileFault(err) {
		t.Errorf("LoadDigest(/proc/self/mem) = %v: FileFault %v, want EIO, not the file's", err, FileFault(err))
	}
	for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE, syscall.ESTALE, syscall.ETIMEDOUT, syscall.EAGAIN} {
		err := fmt.Errorf("config: %w", &os.PathError{Op: "read", Path: "/etc/autopilot-health/config.toml", Err: errno})
		if FileFault(err) {
			t.Errorf("FileFault(%v) = true, want false: it may pass with the file as it is", err)
		}
	}
	if FileFault(nil) {
		t.Error("FileFault(nil) = true")
	}
}

// The forms of metrics.listen_address that name a port and an address
// net.Listen binds load: IPv6 in brackets (a zone too), a host name, a
// port with leading zeros (decimal, the port 20257).
func TestListenAddressForms(t *testing.T) {
	for _, addr := range []string{":20257", "127.0.0.1:20257", "[::1]:20257", "[::]:20257", "[fe80::1%eth0]:20257", "localhost:20257", "node-1.example_int:20257", ":020257"} {
		if _, err := Parse("x.toml", []byte(fmt.Sprintf("[metrics]\nlisten_address = %q\n", addr)), Default()); err != nil {
			t.Errorf("%q: %v, want it loaded", addr, err)
		}
	}
}

// kmsg.disable names the pod volume events as any rule's lines:
// ["PodVolumeReadOnly"] loads (before, it was refused as an unknown rule,
// and an operator had no way to turn those events off), and the rules the
// daemon compiles from it make no such event; with it off, a custom rule of
// that name is not compiled, as any disabled custom rule.
func TestKmsgDisablePodVolumeReadOnly(t *testing.T) {
	for _, tc := range []struct {
		toml   string
		events bool
	}{
		{"", true},
		{"[kmsg]\ndisable = [\"PodVolumeReadOnly\"]\n", false},
		{"[kmsg]\ndisable = [\"NvmeError\", \"PodVolumeReadOnly\"]\n[[kmsg.rules]]\nname = \"PodVolumeReadOnly\"\nkind = \"temp\"\nreason = \"IOError\"\npattern = \"^x\"\n", false},
	} {
		c, err := Parse("f.toml", []byte(tc.toml), Default())
		if err != nil {
			t.Errorf("%q: %v", tc.toml, err)
			continue
		}
		custom := make([]kmsg.Rule, len(c.Kmsg.Rules))
		for i, r := range c.Kmsg.Rules {
			custom[i] = kmsg.Rule{Name: r.Name, Kind: kmsg.Kind(r.Kind), Condition: r.Condition, Reason: r.Reason, Pattern: r.Pattern}
		}
		rules, err := kmsg.BuildRules(c.Kmsg.Disable, custom)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := kmsg.Compile(rules, c.Kmsg.CriticalTasks)
		if err != nil {
			t.Fatal(err)
		}
		if rs.PodVolumeEvents() != tc.events {
			t.Errorf("%q: pod volume events %v, want %v", tc.toml, rs.PodVolumeEvents(), tc.events)
		}
	}
}
