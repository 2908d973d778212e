package config

import (
	"fmt"
	"github.com/syself/autopilot-health/internal/privileged"
	"net"
	"net/netip"
	"net/url"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/syself/autopilot-health/kmsg"
)

// knownKeys lists every key of the configuration as it is spelt (exactKeys),
// tables included, in order.
var knownKeys = sync.OnceValue(func() []string {
	var ks []string
	for k := range exactKeys() {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
})

type validator struct{ err *Error }

func (v *validator) fail(key, format string, args ...any) {
	v.failAt(key, "", format, args...)
}

// conflict fails one of two keys whose values conflict, at the one the
// file sets: a, with msgA, unless the file sets b and not a (then b, with
// msgB).
func (v *validator) conflict(lines keyIndex, a, msgA, b, msgB string) {
	if _, set := lines[a]; set || lines[b] == 0 {
		v.fail(a, "%s", msgA)
		return
	}
	v.fail(b, "%s", msgB)
}

// failAt fails key at the line of at (an element of key's list, key[i]),
// else at key's.
func (v *validator) failAt(key, at, format string, args ...any) {
	if v.err == nil {
		v.err = &Error{Key: key, Msg: fmt.Sprintf(format, args...), at: at}
	}
}

func (v *validator) oneOf(key, val string, allowed ...string) {
	if !slices.Contains(allowed, val) {
		v.fail(key, "must be one of %s, got %q", quoteList(allowed), val)
	}
}

func (v *validator) absPath(key, val string) {
	if val == "" || !filepath.IsAbs(val) {
		v.fail(key, "must be an absolute path, got %q", val)
	}
}

// socketPath requires an absolute path that fits a Unix socket address.
func (v *validator) socketPath(key, val string) {
	v.absPath(key, val)
	if len(val) > maxSocketPath {
		v.fail(key, "must be at most %d bytes (a Unix socket path), got %d", maxSocketPath, len(val))
	}
}

func (v *validator) absPaths(key string, vals []string) {
	for _, p := range vals {
		v.absPath(key, p)
	}
}

// globs requires absolute, clean paths whose globs (path.Match) are well
// formed; "/" alone is refused (a scan of the whole host). It returns the
// absolute, clean ones (whatever their glob syntax), for the checks that
// follow.
func (v *validator) globs(key string, vals []string) (clean []string) {
	for _, p := range vals {
		if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			v.fail(key, "must list absolute, clean paths other than /, got %q", p)
			continue
		}
		clean = append(clean, p)
		if _, err := path.Match(p, ""); err != nil {
			v.fail(key, "bad glob %q: %v", p, err)
		}
	}
	return clean
}

func (v *validator) percent(key string, val int) {
	if val < 1 || val > 100 {
		v.fail(key, "must be a percentage between 1 and 100, got %d", val)
	}
}

// overPercent bounds a threshold a condition is set over (DiskUsageHigh's:
// use over it, as the spec's catalog says): 1 to 99, since no use is over
// 100 % and a threshold of 100 would never set the condition.
func (v *validator) overPercent(key string, val int) {
	if val < 1 || val > 99 {
		v.fail(key, "must be a percentage between 1 and 99 (the condition is set when use is over it, and no use is over 100), got %d", val)
	}
}

func (v *validator) positive(key string, d Duration) {
	if d.Duration <= 0 {
		v.fail(key, "must be a positive duration, got %q", d.String())
	}
}

// Bounds of the durations that set how often the daemon works: a node must
// not write to the API server, probe or restart as fast as it can because of
// a typo ("1ms" for "1m"). default.toml states each range.
const (
	// The heartbeat rewrites the node's conditions, the report interval its
	// report annotations: API server writes from every node.
	minHeartbeatPeriod = 30 * time.Second
	maxHeartbeatPeriod = time.Hour
	minReportInterval  = 30 * time.Second
	maxReportInterval  = time.Hour
	minCheckInterval   = time.Second
	maxCheckInterval   = 24 * time.Hour
	minCheckTimeout    = 100 * time.Millisecond
	maxFirstRunSpread  = 5 * time.Minute
	minRestartCooldown = time.Second
	// NodeInfoStale's max_age: the file is read at the check's runs, not
	// when it is written, so below a second nearly every run finds it
	// older than max_age unless the sync loop rewrites it more than once
	// a second ("1ms", "1ns": typos of "1m").
	minNodeInfoMaxAge = time.Second
	// ClockNotSynchronized's max_error: adjtimex reports the estimated
	// error in whole microseconds, so a shorter max_error is max_error 0,
	// True at any estimated error at all.
	minClockMaxError = time.Microsecond
	// ServiceNotRecovering's restarts per run and repairs in a row.
	maxRestartThreshold = 100
)

// between requires lo <= d <= hi.
func (v *validator) between(key string, d Duration, lo, hi time.Duration) {
	if d.Duration < lo || d.Duration > hi {
		v.fail(key, "must be between %s and %s, got %q", ShortDuration(lo), ShortDuration(hi), d.String())
	}
}

// atLeast requires d >= lo.
func (v *validator) atLeast(key string, d Duration, lo time.Duration) {
	if d.Duration < lo {
		v.fail(key, "must be at least %s, got %q", ShortDuration(lo), d.String())
	}
}

// atLeastWhy requires d >= lo, saying why.
func (v *validator) atLeastWhy(key string, d Duration, lo time.Duration, why string) {
	if d.Duration < lo {
		v.fail(key, "must be at least %s (%s), got %q", ShortDuration(lo), why, d.String())
	}
}

// ShortDuration writes a duration as default.toml does: "1m", "1h", not
// "1m0s", "1h0m0s".
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// words requires every entry to be non-empty and without whitespace.
func (v *validator) words(key string, vals []string, what string) {
	for _, w := range vals {
		if w == "" || strings.IndexFunc(w, unicode.IsSpace) >= 0 {
			v.fail(key, "must list %s, each non-empty and without whitespace, got %q", what, w)
		}
	}
}

// taskNames requires every entry to be a task name pattern as the kernel
// prints names: inner spaces are part of a name (QEMU's "CPU 0/KVM"), but
// not leading or trailing whitespace, control characters, or a comma (two
// names written as one string: "kubelet, containerd").
func (v *validator) taskNames(key string, vals []string) {
	for _, w := range vals {
		bad := w == "" || strings.TrimSpace(w) != w || strings.ContainsRune(w, ',') ||
			strings.IndexFunc(w, unicode.IsControl) >= 0
		if bad {
			v.fail(key, "must list task names (a * matches any run of characters), one per string: non-empty, no comma, no control character, no whitespace at either end, got %q", w)
		}
	}
}

// addresses requires every entry to be an IP address or a CIDR prefix.
func (v *validator) addresses(key string, vals []string) {
	for _, a := range vals {
		if _, err := ParseAddressOrPrefix(a); err != nil {
			v.fail(key, "must list IP addresses or CIDR prefixes such as \"10.0.0.5\" or \"10.0.0.0/24\", got %q", a)
		}
	}
}

func (v *validator) httpURL(key, val string) {
	u, err := url.Parse(val)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.fail(key, "must be an http:// or https:// URL, got %q", val)
	}
}

// units requires systemd unit names, each listed once: a unit listed
// twice would be read and reported twice (named twice in the condition's
// message).
func (v *validator) units(key string, vals []string) {
	for _, u := range vals {
		if !validUnitName(u) {
			v.fail(key, "must list systemd unit names such as \"kubelet.service\", got %q", u)
		}
	}
	v.once(key, vals, "unit", nil)
}

// once requires each entry of a list once, for the lists a check reads
// entry by entry into what it says: a repeat would be named twice in a
// message or a report, or read twice. what names an entry ("unit");
// norm, if not nil, is what makes two entries the same (filepath.Clean:
// "/etc/cdi/" is "/etc/cdi"), and the repeat is named as norm writes it,
// at its own line in a multi-line list (keyLines), else at the list's.
// Lists that are only matched against (exclude, tolerate, ignore_devices,
// critical_tasks, ...) do not call it: a repeat there changes nothing.
func (v *validator) once(key string, vals []string, what string, norm func(string) string) {
	if norm == nil {
		norm = func(s string) string { return s }
	}
	seen := make(map[string]bool, len(vals))
	for i, s := range vals {
		n := norm(s)
		if seen[n] {
			v.failAt(key, fmt.Sprintf("%s[%d]", key, i), "must list each %s once, got %q twice", what, n)
			return
		}
		seen[n] = true
	}
}

// unitTypes are the suffixes of systemd's unit types.
var unitTypes = []string{"service", "mount", "swap", "socket", "target", "device", "automount", "timer", "path", "slice", "scope"}

// validUnitName says whether systemd would load a unit of this name, as
// its unit_name_is_valid(name, UNIT_NAME_PLAIN|UNIT_NAME_INSTANCE) does:
// at most 255 bytes, a prefix of letters, digits and ":-_.\\" (an "@"
// too, not first, with an instance after it: a template, "getty@.service",
// is never loaded), a dot and a unit type.
func validUnitName(name string) bool {
	dot := strings.LastIndexByte(name, '.')
	if len(name) > 255 || dot <= 0 || !slices.Contains(unitTypes, name[dot+1:]) {
		return false
	}
	prefix := name[:dot]
	at := strings.IndexByte(prefix, '@')
	if at == 0 || (at > 0 && at == len(prefix)-1) {
		return false
	}
	for _, r := range prefix {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(":-_.\\@", r)
		if !ok {
			return false
		}
	}
	return true
}

func (v *validator) regex(key, val string) {
	if _, err := regexp.Compile(val); err != nil {
		v.fail(key, "invalid regular expression: %v", err)
	}
}

func (v *validator) common(name string, c Common) {
	key := "checks." + name
	v.between(key+".interval", c.Interval, minCheckInterval, maxCheckInterval)
	if c.Timeout.Duration < minCheckTimeout {
		v.fail(key+".timeout", "must be between %s and interval (%s), got %q", ShortDuration(minCheckTimeout), c.Interval, c.Timeout.String())
	}
	if c.Timeout.Duration > c.Interval.Duration {
		v.fail(key+".timeout", "must not be longer than interval (%s), got %s", c.Interval, c.Timeout)
	}
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}

// validate checks every value; the first problem found is returned with its key.
func (c *Config) validate() *Error {
	v := &validator{}
	v.absPath("host_root", c.HostRoot)
	if !validKubeletRootDir(c.KubeletRootDir) {
		v.fail("kubelet_root_dir", "must be an absolute path other than / (the kubelet's --root-dir, such as \"/data/kubelet\"), got %q", c.KubeletRootDir)
	}
	switch {
	case len(c.NodeName) > 253:
		v.fail("node_name", "must be a DNS subdomain of at most 253 characters, got one of %d (%.40q...)", len(c.NodeName), c.NodeName)
	case c.NodeName != "" && !validNodeName(c.NodeName):
		v.fail("node_name", "must be a DNS subdomain (lower-case letters, digits, '-' and '.'), got %q", c.NodeName)
	}
	v.oneOf("role", c.Role, "", "controlplane", "worker")
	v.oneOf("gpu", c.GPU, "auto", "true", "false")
	v.absPath("state_dir", c.StateDir)
	if d := filepath.Clean(c.StateDir); filepath.IsAbs(c.StateDir) && sharedDirs[d] {
		v.fail("state_dir", "must be a directory of the daemon's own (it writes state.json and tamper.json there, moves aside a state.json it cannot read and removes their temp files), not %s, which the system and other programs share, got %q", d, c.StateDir)
	}
	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "auto", "journal", "text", "json")
	// The port is a decimal number, not one net.LookupPort would find:
	// it reads a service name from /etc/services (":http" bound port 80),
	// drops a sign, and takes no port at all for port 0.
	// The host is none, an IP address or a host name: net.Listen looks
	// anything else up as a name it never finds ("0.0.0.0 :20257"), and
	// the daemon would run on without /metrics, retrying for ever.
	if host, port, err := net.SplitHostPort(c.Metrics.ListenAddress); err != nil && strings.Count(c.Metrics.ListenAddress, ":") > 1 && !strings.HasPrefix(c.Metrics.ListenAddress, "[") {
		// "::1:20257": its port cannot be told from the address.
		v.fail("metrics.listen_address", "must be host:port or :port, an IPv6 address in brackets (\"[::1]:20257\", \"[::]:20257\" for every address), got %q", c.Metrics.ListenAddress)
	} else if err != nil {
		v.fail("metrics.listen_address", "must be host:port or :port, got %q", c.Metrics.ListenAddress)
	} else if !listenHost(host) {
		v.fail("metrics.listen_address", "must have a host that is an IP address or a host name (letters, digits, '-', '.', '_'), or none (\":20257\", every address), got %q", c.Metrics.ListenAddress)
	} else if port == "" {
		v.fail("metrics.listen_address", "must name a port after the colon, a decimal number from 1 to 65535 such as \":20257\", got %q", c.Metrics.ListenAddress)
	} else if strings.Trim(port, "0123456789") != "" {
		v.fail("metrics.listen_address", "must have a port that is a decimal number from 1 to 65535 such as \":20257\" (a service name such as \"http\" is not looked up), got %q", c.Metrics.ListenAddress)
	} else if n, err := strconv.Atoi(port); err != nil || n > 65535 {
		v.fail("metrics.listen_address", "must be host:port or :port with a port from 1 to 65535, got %q", c.Metrics.ListenAddress)
	} else if n == 0 {
		// The kernel would pick a port at each start: the cluster's
		// Prometheus scrapes <node IP>:<port> at a port it is told.
		v.fail("metrics.listen_address", "must not be port 0 (a port the kernel picks at each start, which Prometheus cannot find): give the port it scrapes, such as \":20257\", got %q", c.Metrics.ListenAddress)
	}
	if c.Status.Socket != "" {
		v.socketPath("status.socket", c.Status.Socket)
	}
	if c.Kubernetes.Kubeconfig != "" {
		v.absPath("kubernetes.kubeconfig", c.Kubernetes.Kubeconfig)
	}
	v.between("kubernetes.heartbeat_period", c.Kubernetes.HeartbeatPeriod, minHeartbeatPeriod, maxHeartbeatPeriod)
	v.between("kubernetes.report_interval", c.Kubernetes.ReportInterval, minReportInterval, maxReportInterval)
	v.absPath("detect.kubelet_client_cert", c.Detect.KubeletClientCert)
	v.absPath("detect.controlplane_manifest", c.Detect.ControlPlaneManifest)
	v.between("detect.interval", c.Detect.Interval, 10*time.Second, time.Hour)
	v.between("runner.first_run_spread", c.Runner.FirstRunSpread, 0, maxFirstRunSpread)

	k := &c.Checks
	for _, name := range k.Names() {
		com, _ := k.Common(name)
		v.common(name, com)
	}
	v.httpURL("checks.KubeletUnhealthy.healthz_url", k.KubeletUnhealthy.HealthzURL)
	v.units("checks.KubeletUnhealthy.unit", []string{k.KubeletUnhealthy.Unit})
	v.atLeast("checks.KubeletUnhealthy.restart_cooldown", k.KubeletUnhealthy.RestartCooldown, minRestartCooldown)
	v.absPath("checks.ContainerRuntimeUnhealthy.socket", k.ContainerRuntimeUnhealthy.Socket)
	v.units("checks.ContainerRuntimeUnhealthy.unit", []string{k.ContainerRuntimeUnhealthy.Unit})
	v.atLeast("checks.ContainerRuntimeUnhealthy.restart_cooldown", k.ContainerRuntimeUnhealthy.RestartCooldown, minRestartCooldown)
	v.units("checks.ServiceNotRecovering.controlplane_units", k.ServiceNotRecovering.ControlPlaneUnits)
	v.units("checks.ServiceNotRecovering.worker_units", k.ServiceNotRecovering.WorkerUnits)
	// Counted per run (a minute by default), and of the daemon's own
	// repairs one per restart_cooldown: past 100 neither part could ever
	// say a unit is not recovering in time to matter.
	if t := k.ServiceNotRecovering.RestartThreshold; t < 1 || t > maxRestartThreshold {
		v.fail("checks.ServiceNotRecovering.restart_threshold", "must be between 1 and %d, got %d", maxRestartThreshold, t)
	}
	v.units("checks.KubeletHeartbeatFailed.unit", []string{k.KubeletHeartbeatFailed.Unit})
	v.absPath("checks.KubeletHeartbeatFailed.journalctl", k.KubeletHeartbeatFailed.Journalctl)
	if len(k.KubeletHeartbeatFailed.Match) == 0 {
		v.fail("checks.KubeletHeartbeatFailed.match", "must list at least one string")
	}
	for _, m := range k.KubeletHeartbeatFailed.Match {
		if strings.TrimSpace(m) == "" {
			v.fail("checks.KubeletHeartbeatFailed.match", "entries must not be empty")
			break
		}
	}
	v.once("checks.KubeletHeartbeatFailed.match", k.KubeletHeartbeatFailed.Match, "string", nil)
	if n := k.KubeletHeartbeatFailed.MaxEntries; n < 100 || n > 10_000_000 {
		v.fail("checks.KubeletHeartbeatFailed.max_entries", "must be between 100 and 10000000, got %d", n)
	}
	// The window keeps one entry per error up to the threshold (in memory
	// and in the state file): both are bounded.
	if t := k.DisksFailure.IOErrorThreshold; t < 1 || t > 1000 {
		v.fail("checks.DisksFailure.io_error_threshold", "must be between 1 and 1000, got %d", t)
	}
	v.between("checks.DisksFailure.io_error_window", k.DisksFailure.IOErrorWindow, time.Second, 24*time.Hour)
	v.percent("checks.DiskWearHigh.percentage_used_threshold", k.DiskWearHigh.PercentageUsedThreshold)
	if t := k.DiskTemperatureHigh.ThresholdCelsius; t < 0 || t > 150 {
		v.fail("checks.DiskTemperatureHigh.threshold_celsius", "must be between 0 (the drive's own threshold) and 150, got %d", t)
	}
	v.overPercent("checks.DiskUsageHigh.space_percent", k.DiskUsageHigh.SpacePercent)
	v.overPercent("checks.DiskUsageHigh.inodes_percent", k.DiskUsageHigh.InodesPercent)
	v.overPercent("checks.DiskUsageHigh.volume_group_percent", k.DiskUsageHigh.VolumeGroupPercent)
	v.overPercent("checks.DiskUsageHigh.thin_pool_data_percent", k.DiskUsageHigh.ThinPoolDataPct)
	v.overPercent("checks.DiskUsageHigh.thin_pool_metadata_percent", k.DiskUsageHigh.ThinPoolMetaPct)
	if k.DiskUsageHigh.LVMCommand != "" {
		v.absPath("checks.DiskUsageHigh.lvm_command", k.DiskUsageHigh.LVMCommand)
	}
	v.between("checks.DiskUsageHigh.lvm_timeout", k.DiskUsageHigh.LVMTimeout, time.Second, 5*time.Minute)
	// The check waits two thirds of its timeout for LVM's two reports,
	// lvm_timeout each: a longer lvm_timeout makes an lvm that is slow but
	// answers "not checked" at every run. Named at the key the file sets.
	// Without an LVM part (lvm_command = "") no lvm runs, and the
	// check's timeout is bounded as any check's.
	if t, l := k.DiskUsageHigh.Timeout.Duration, k.DiskUsageHigh.LVMTimeout.Duration; k.DiskUsageHigh.LVMCommand != "" && t > 0 && 3*l > t {
		v.conflict(c.lines,
			"checks.DiskUsageHigh.lvm_timeout", fmt.Sprintf("must be at most a third of the check's timeout (%s): its two LVM reports are waited for two thirds of it, got %s", t, l),
			"checks.DiskUsageHigh.timeout", fmt.Sprintf("must be at least three times lvm_timeout (%s): the two LVM reports are waited for two thirds of it, got %s", l, t))
	}
	v.regex("checks.DiskUsageHigh.mount_points_exclude", k.DiskUsageHigh.MountPointsExclude)
	v.regex("checks.DiskUsageHigh.fs_types_exclude", k.DiskUsageHigh.FSTypesExclude)
	v.units("checks.NodeServiceDown.controlplane_units", k.NodeServiceDown.ControlPlaneUnits)
	v.units("checks.NodeServiceDown.worker_units", k.NodeServiceDown.WorkerUnits)
	v.absPath("checks.NodeInfoStale.path", k.NodeInfoStale.Path)
	v.atLeastWhy("checks.NodeInfoStale.max_age", k.NodeInfoStale.MaxAge, minNodeInfoMaxAge,
		"the file is read at the check's runs, not when it is written: a shorter max_age finds it older at nearly every run unless the sync loop rewrites it more than once a second")
	v.positive("checks.CertRenewalFailing.renew_within", k.CertRenewalFailing.RenewWithin)
	v.absPaths("checks.CertRenewalFailing.certificates", k.CertRenewalFailing.Certificates)
	v.once("checks.CertRenewalFailing.certificates", k.CertRenewalFailing.Certificates, "certificate", filepath.Clean)
	v.httpURL("checks.ProxyNotServing.metrics_url", k.ProxyNotServing.MetricsURL)
	if k.ProxyNotServing.ReadyMetric == "" {
		v.fail("checks.ProxyNotServing.ready_metric", "must not be empty")
	}
	v.atLeastWhy("checks.ClockNotSynchronized.max_error", k.ClockNotSynchronized.MaxError, minClockMaxError,
		"adjtimex reports the estimated error in whole microseconds: a shorter max_error is 0, True at any estimated error at all")
	v.absPath("checks.CNIUnhealthy.socket", k.CNIUnhealthy.Socket)
	v.httpURL("checks.TunnelDisconnected.metrics_url", k.TunnelDisconnected.MetricsURL)
	if k.TunnelDisconnected.ConnectionsMetric == "" {
		v.fail("checks.TunnelDisconnected.connections_metric", "must not be empty")
	}
	if k.TunnelDisconnected.AgentUnit != "" {
		v.units("checks.TunnelDisconnected.agent_unit", []string{k.TunnelDisconnected.AgentUnit})
	}
	v.absPath("checks.GpuActivationFailed.marker_path", k.GpuActivationFailed.MarkerPath)
	v.absPaths("checks.GpuActivationFailed.cdi_spec_dirs", k.GpuActivationFailed.CDISpecDirs)
	v.once("checks.GpuActivationFailed.cdi_spec_dirs", k.GpuActivationFailed.CDISpecDirs, "directory", filepath.Clean)
	if len(k.GpuActivationFailed.CDISpecDirs) == 0 {
		v.fail("checks.GpuActivationFailed.cdi_spec_dirs", "must list at least one directory: with none, no GPU can ever be named in a CDI spec")
	}
	if vendor, class := cdiparser.ParseQualifier(k.GpuActivationFailed.CDIKind); vendor == "" ||
		cdiparser.ValidateVendorName(vendor) != nil || cdiparser.ValidateClassName(class) != nil {
		v.fail("checks.GpuActivationFailed.cdi_kind", "must be a CDI kind <vendor>/<class> such as \"nvidia.com/gpu\", got %q", k.GpuActivationFailed.CDIKind)
	}
	v.absPath("checks.APIServerSourceIPUnavailable.audit_log", k.APIServerSourceIPUnavailable.AuditLog)
	v.words("checks.APIServerSourceIPUnavailable.excluded_user_prefixes", k.APIServerSourceIPUnavailable.ExcludedUserPrefixes, "user name prefixes")
	v.once("checks.APIServerSourceIPUnavailable.excluded_user_prefixes", k.APIServerSourceIPUnavailable.ExcludedUserPrefixes, "prefix", nil)
	v.addresses("checks.APIServerSourceIPUnavailable.proxy_addresses", k.APIServerSourceIPUnavailable.ProxyAddresses)
	if n := k.APIServerSourceIPUnavailable.MaxReadBytes; n < MinAuditReadBytes || n > MaxAuditReadBytes {
		v.fail("checks.APIServerSourceIPUnavailable.max_read_bytes", "must be between %d (1 MiB) and %d (1 GiB), got %d", MinAuditReadBytes, MaxAuditReadBytes, n)
	}
	v.socketPath("control_socket", c.ControlSocket)
	// Two sockets, never one path: the control socket is bound first, and
	// the status socket's bind would find it answering ("another daemon
	// answers on it"): no status, and `autopilot-health status` asking
	// the control socket. Named at the key the file sets.
	if c.Status.Socket != "" && filepath.Clean(c.Status.Socket) == filepath.Clean(c.ControlSocket) {
		v.conflict(c.lines,
			"status.socket", fmt.Sprintf("must not be the control socket, control_socket = %q", c.ControlSocket),
			"control_socket", fmt.Sprintf("must not be the status socket, status.socket = %q", c.Status.Socket))
	}
	v.absPath("checks.SealedOSTampered.recorded_hashes", k.SealedOSTampered.RecordedHashes)
	v.absPath("checks.SealedOSTampered.dm_control", k.SealedOSTampered.DMControl)
	protected := v.globs("checks.NodeTampered.paths", k.NodeTampered.Paths)
	v.once("checks.NodeTampered.paths", k.NodeTampered.Paths, "path", nil)
	if len(k.NodeTampered.Paths) == 0 {
		v.fail("checks.NodeTampered.paths", "must list at least one path (to turn the check off, set enabled = false)")
	}
	v.globs("checks.NodeTampered.exclude", k.NodeTampered.Exclude)
	// What the privileged helper scans (internal/privileged): files, not
	// /proc, /sys or /dev. (Exclusions are only matched, never read.)
	for _, pat := range protected {
		if err := privileged.ScanPatternsAllowed([]string{pat}); err != nil {
			v.fail("checks.NodeTampered.paths", "%v", err)
		}
	}
	v.globs("checks.NodeTampered.tolerate", k.NodeTampered.Tolerate)
	v.globs("checks.NodeTampered.tolerate_gpu", k.NodeTampered.TolerateGPU)
	v.globs("checks.NodeTampered.baseline_after", k.NodeTampered.BaselineAfter)
	v.between("checks.NodeTampered.settle", k.NodeTampered.Settle, 0, time.Hour)
	v.between("checks.NodeTampered.baseline_max_wait", k.NodeTampered.BaselineMaxWait, time.Minute, 24*time.Hour)
	if k.NodeTampered.BaselineMaxWait.Duration < k.NodeTampered.Settle.Duration {
		v.fail("checks.NodeTampered.baseline_max_wait", "must not be shorter than settle (%s), got %q", k.NodeTampered.Settle.String(), k.NodeTampered.BaselineMaxWait.String())
	}
	v.absPath("kmsg.device", c.Kmsg.Device)
	v.taskNames("kmsg.critical_tasks", c.Kmsg.CriticalTasks)
	if len(c.Kmsg.CriticalTasks) == 0 {
		v.fail("kmsg.critical_tasks", `must list at least one task: with none, KernelDeadlock can never be set (to turn it off, use kmsg.disable = ["KernelDeadlock"])`)
	}
	v.words("kmsg.ignore_devices", c.Kmsg.IgnoreDevices, "block device name prefixes")
	v.kmsgRules(c)
	return v.err
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func validNodeName(s string) bool { return len(s) <= 253 && nodeNameRE.MatchString(s) }

// Names returns the condition type of every check table, in file order.
func (k *Checks) Names() []string {
	rt := reflect.TypeOf(*k)
	names := make([]string, rt.NumField())
	for i := range rt.NumField() {
		names[i] = rt.Field(i).Tag.Get("toml")
	}
	return names
}

// Common returns the common keys of the check for a condition type.
func (k *Checks) Common(condType string) (Common, bool) {
	rv := reflect.ValueOf(k).Elem()
	for i, name := range k.Names() {
		if name == condType {
			return rv.Field(i).FieldByName("Common").Interface().(Common), true
		}
	}
	return Common{}, false
}

// kmsgRules builds and compiles the kernel log rules as the daemon will.
// The built-in set alone is the same every time: it is compiled once.
func (v *validator) kmsgRules(c *Config) {
	if len(c.Kmsg.Disable) == 0 && len(c.Kmsg.Rules) == 0 {
		if err := builtinRulesCompile(); err != nil {
			v.fail("kmsg.rules", "%v", err)
		}
		return
	}
	custom := make([]kmsg.Rule, len(c.Kmsg.Rules))
	first := map[string]int{}
	for i, r := range c.Kmsg.Rules {
		custom[i] = kmsg.Rule{Name: r.Name, Kind: kmsg.Kind(r.Kind), Condition: r.Condition, Reason: r.Reason, Pattern: r.Pattern}
		// Each rule alone first, so that the error names its own
		// [[kmsg.rules]] table and line; a rule kmsg.disable turns off is
		// never compiled (BuildRules drops it), so it is not checked.
		if slices.Contains(c.Kmsg.Disable, r.Name) {
			continue
		}
		// A second rule of a name, at its own line: BuildRules would
		// take the first of a built-in's name and drop the second unseen.
		if j, dup := first[r.Name]; dup && r.Name != "" {
			v.fail(fmt.Sprintf("kmsg.rules[%d]", i), "kmsg rule %s: defined twice (first as kmsg.rules[%d])", r.Name, j)
			return
		}
		first[r.Name] = i
		if _, err := kmsg.Compile(custom[i:i+1], c.Kmsg.CriticalTasks); err != nil {
			v.fail(fmt.Sprintf("kmsg.rules[%d]", i), "%v", err)
			return
		}
	}
	for i, d := range c.Kmsg.Disable {
		names := make([]string, 0, len(kmsg.DefaultRules)+len(custom))
		for _, r := range kmsg.DefaultRules {
			names = append(names, r.Name)
		}
		for _, r := range custom {
			names = append(names, r.Name)
		}
		if !slices.Contains(names, d) {
			// Named as a key is, with the nearest name (before,
			// "unknown rule" alone, also of a name in another case).
			v.failAt("kmsg.disable", fmt.Sprintf("kmsg.disable[%d]", i), "unknown rule %q%s: autopilot-health kmsg rules lists the rules (their names are case-sensitive)", d, nearestName(d, names))
			return
		}
	}
	rules, err := kmsg.BuildRules(c.Kmsg.Disable, custom)
	if err != nil {
		v.fail("kmsg.disable", "%v", err)
		return
	}
	if _, err := kmsg.Compile(rules, c.Kmsg.CriticalTasks); err != nil {
		v.fail("kmsg.rules", "%v", err)
	}
}

// nearestName is " (did you mean X?)" for the one of names that name is
// in another case, else nearest to by at most 3 edits, else begins as for
// at least 6 characters and half of it; "" for none.
func nearestName(name string, names []string) string {
	best, bestD := "", 4
	for _, n := range names {
		if strings.EqualFold(n, name) {
			return fmt.Sprintf(" (did you mean %q?)", n)
		}
		if d := editDistance(strings.ToLower(n), strings.ToLower(name)); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" {
		bestN, tie := 0, false
		for _, n := range names {
			k := 0
			for k < len(name) && k < len(n) && strings.ToLower(name[k:k+1]) == strings.ToLower(n[k:k+1]) {
				k++
			}
			switch {
			case k > bestN:
				best, bestN, tie = n, k, false
			case k == bestN:
				tie = true
			}
		}
		if tie || bestN < 6 || 2*bestN < len(name) {
			best = ""
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

var builtinRulesCompile = sync.OnceValue(func() error {
	_, err := kmsg.Compile(kmsg.DefaultRules, nil)
	return err
})

// sharedDirs are the directories of the filesystem hierarchy (FHS) that
// the system and other programs share: a state_dir there would have the
// daemon write its state files among theirs, move aside a state.json of
// another program as one it cannot read, and remove files of its temp
// names (and, under the shipped unit, whose ProtectSystem=strict leaves
// only the StateDirectory= writable, fail every save: a restart would
// then lose every condition).
var sharedDirs = map[string]bool{
	"/": true, "/bin": true, "/boot": true, "/dev": true, "/etc": true, "/home": true,
	"/lib": true, "/lib32": true, "/lib64": true, "/libx32": true, "/media": true, "/mnt": true,
	"/opt": true, "/proc": true, "/root": true, "/run": true, "/sbin": true, "/srv": true,
	"/sys": true, "/tmp": true, "/usr": true, "/usr/bin": true, "/usr/lib": true,
	"/usr/local": true, "/usr/sbin": true, "/usr/share": true, "/var": true, "/var/cache": true,
	"/var/lib": true, "/var/local": true, "/var/lock": true, "/var/log": true, "/var/mail": true,
	"/var/opt": true, "/var/run": true, "/var/spool": true, "/var/tmp": true,
}

// maxSocketPath is the longest Unix socket path (sun_path less its NUL).
const maxSocketPath = 107

// listenHost reports whether host, of metrics.listen_address, is one
// net.Listen can bind: none (every address), an IP address (with a zone),
// or a host name of letters, digits, '-', '.' and '_'.
func listenHost(host string) bool {
	if host == "" {
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") == ""
}
