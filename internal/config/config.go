// Package config loads and validates the daemon's TOML configuration.
//
// The embedded default.toml is the one source of the defaults: Default()
// decodes it, `autopilot-health config default` prints it. Loading is strict:
// an unknown key, a wrong type or a bad value is an error that names the file,
// the line and the key.
package config

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/smallfile"
	"github.com/syself/autopilot-health/internal/textenc"
)

// DefaultPath is where the daemon looks for its configuration.
const DefaultPath = "/etc/autopilot-health/config.toml"

//go:embed default.toml
var defaultTOML []byte

// DefaultTOML returns the embedded default configuration, every key set to
// its default, with a comment.
func DefaultTOML() []byte { return bytes.Clone(defaultTOML) }

// Duration is a time.Duration written as a string ("10s", "2m").
type Duration struct{ time.Duration }

// durationShape matches what time.ParseDuration parses, whatever its
// size: an optional sign, then numbers each with a unit.
var durationShape = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil && durationShape.Match(b) {
		// time.ParseDuration says "invalid duration" of a number too
		// large for a time.Duration too: well-formed, out of range.
		return fmt.Errorf("duration %q is out of range: a duration is at most 2562047h (about 292 years)", string(b))
	}
	if err != nil {
		return fmt.Errorf("invalid duration %q (use a number with a unit, e.g. \"30s\", \"5m\", \"168h\")", string(b))
	}
	d.Duration = v
	return nil
}

// UnmarshalTOML implements toml.Unmarshaler: a duration is a string; a
// value of another type (an integer, a float, a boolean, a date or time,
// an array, a table) is refused in TOML's words, not as the text the
// decoder would make of it for UnmarshalText ("5", "1.500000", a local
// date as a UTC time).
func (d *Duration) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		return errors.New("wrong type: must be " + wantWords(reflect.TypeFor[Duration]()) + ", got " + valueWordsOf(v))
	}
	return d.UnmarshalText([]byte(s))
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Config is the daemon's whole configuration.
type Config struct {
	HostRoot string `toml:"host_root"`
	// KubeletRootDir is the kubelet's --root-dir: its pods' volumes are
	// mounted below <dir>/pods and staged by CSI drivers below
	// <dir>/plugins (PodVolumeDirs), and DiskUsageHigh's default
	// mount_points_exclude names them there (DeriveFromKubeletRootDir).
	KubeletRootDir string `toml:"kubelet_root_dir"`
	NodeName       string `toml:"node_name"`
	Role           string `toml:"role"`
	GPU            string `toml:"gpu"`
	StateDir       string `toml:"state_dir"`
	// ControlSocket is the daemon's control socket (tamper clear).
	ControlSocket string     `toml:"control_socket"`
	Log           Log        `toml:"log"`
	Metrics       Metrics    `toml:"metrics"`
	Status        Status     `toml:"status"`
	Kubernetes    Kubernetes `toml:"kubernetes"`
	Detect        Detect     `toml:"detect"`
	Runner        Runner     `toml:"runner"`
	Checks        Checks     `toml:"checks"`
	Kmsg          Kmsg       `toml:"kmsg"`

	// lines is the index of the file Parse read (nil for the defaults).
	lines keyIndex
	// notes: the file's values Parse took otherwise than as written
	// (Notes).
	notes []Note
}

// Note is a value the file sets that Parse took otherwise than as
// written, and why. The daemon logs each at its start, and at a reload
// that brings one it did not log before (daemon.LogConfigNotes): the
// operator reads in the journal what the checks use, not only the file.
type Note struct {
	File string
	Line int    // the line that sets Key
	Key  string // dotted, as Diff names it
	// Taken is the value in effect; Why says why it is not the file's.
	Taken, Why string
}

// Notes returns the values of the file Parse took otherwise than as
// written (none for the defaults).
func (c *Config) Notes() []Note { return c.notes }

// Line returns the line of the file this configuration was parsed from
// that sets key (a dotted key as Diff names it), or the closest table that
// holds it; 0 when the file has neither (or the configuration is the
// defaults).
func (c *Config) Line(key string) int { return c.lines.find(key) }

type Log struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

type Metrics struct {
	ListenAddress string `toml:"listen_address"`
}

type Status struct {
	Socket string `toml:"socket"`
}

type Kubernetes struct {
	Kubeconfig      string   `toml:"kubeconfig"`
	HeartbeatPeriod Duration `toml:"heartbeat_period"`
	ReportInterval  Duration `toml:"report_interval"`
}

type Detect struct {
	KubeletClientCert    string   `toml:"kubelet_client_cert"`
	ControlPlaneManifest string   `toml:"controlplane_manifest"`
	Interval             Duration `toml:"interval"`
}

type Runner struct {
	FirstRunSpread Duration `toml:"first_run_spread"`
}

type Kmsg struct {
	Enabled       bool       `toml:"enabled"`
	Device        string     `toml:"device"`
	KernelOnly    bool       `toml:"kernel_only"`
	FromBootStart bool       `toml:"from_boot_start"`
	CriticalTasks []string   `toml:"critical_tasks"`
	IgnoreDevices []string   `toml:"ignore_devices"`
	Disable       []string   `toml:"disable"`
	Rules         []KmsgRule `toml:"rules"`
}

// KmsgRule adds a kernel log rule, or replaces the built-in one of the same name.
type KmsgRule struct {
	Name      string `toml:"name"`
	Kind      string `toml:"kind"`
	Condition string `toml:"condition"`
	Reason    string `toml:"reason"`
	Pattern   string `toml:"pattern"`
}

// Common holds the keys every check has.
type Common struct {
	Enabled  bool     `toml:"enabled"`
	Interval Duration `toml:"interval"`
	Timeout  Duration `toml:"timeout"`
}

// Checks holds one table per check, named by the condition it sets.
type Checks struct {
	KubeletUnhealthy             KubeletUnhealthy             `toml:"KubeletUnhealthy"`
	ContainerRuntimeUnhealthy    ContainerRuntimeUnhealthy    `toml:"ContainerRuntimeUnhealthy"`
	ServiceNotRecovering         ServiceNotRecovering         `toml:"ServiceNotRecovering"`
	KubeletHeartbeatFailed       KubeletHeartbeatFailed       `toml:"KubeletHeartbeatFailed"`
	DisksFailure                 DisksFailure                 `toml:"DisksFailure"`
	DiskWearHigh                 DiskWearHigh                 `toml:"DiskWearHigh"`
	DiskTemperatureHigh          DiskTemperatureHigh          `toml:"DiskTemperatureHigh"`
	DiskUsageHigh                DiskUsageHigh                `toml:"DiskUsageHigh"`
	NodeServiceDown              NodeServiceDown              `toml:"NodeServiceDown"`
	NodeInfoStale                NodeInfoStale                `toml:"NodeInfoStale"`
	CertRenewalFailing           CertRenewalFailing           `toml:"CertRenewalFailing"`
	ProxyNotServing              ProxyNotServing              `toml:"ProxyNotServing"`
	ClockNotSynchronized         ClockNotSynchronized         `toml:"ClockNotSynchronized"`
	CNIUnhealthy                 CNIUnhealthy                 `toml:"CNIUnhealthy"`
	TunnelDisconnected           TunnelDisconnected           `toml:"TunnelDisconnected"`
	GpuActivationFailed          GpuActivationFailed          `toml:"GpuActivationFailed"`
	APIServerSourceIPUnavailable APIServerSourceIPUnavailable `toml:"APIServerSourceIPUnavailable"`
	SealedOSTampered             SealedOSTampered             `toml:"SealedOSTampered"`
	NodeTampered                 NodeTampered                 `toml:"NodeTampered"`
}

type KubeletUnhealthy struct {
	Common
	HealthzURL      string   `toml:"healthz_url"`
	Unit            string   `toml:"unit"`
	RestartCooldown Duration `toml:"restart_cooldown"`
}

type ContainerRuntimeUnhealthy struct {
	Common
	Socket          string   `toml:"socket"`
	Unit            string   `toml:"unit"`
	RestartCooldown Duration `toml:"restart_cooldown"`
}

type ServiceNotRecovering struct {
	Common
	ControlPlaneUnits []string `toml:"controlplane_units"`
	WorkerUnits       []string `toml:"worker_units"`
	RestartThreshold  int      `toml:"restart_threshold"`
}

type KubeletHeartbeatFailed struct {
	Common
	Unit       string   `toml:"unit"`
	Journalctl string   `toml:"journalctl"`
	Match      []string `toml:"match"`
	MaxEntries int      `toml:"max_entries"`
}

type DisksFailure struct {
	Common
	IOErrorThreshold int      `toml:"io_error_threshold"`
	IOErrorWindow    Duration `toml:"io_error_window"`
}

type DiskWearHigh struct {
	Common
	PercentageUsedThreshold int `toml:"percentage_used_threshold"`
}

type DiskTemperatureHigh struct {
	Common
	ThresholdCelsius int `toml:"threshold_celsius"`
}

type DiskUsageHigh struct {
	Common
	SpacePercent       int `toml:"space_percent"`
	InodesPercent      int `toml:"inodes_percent"`
	VolumeGroupPercent int `toml:"volume_group_percent"`
	ThinPoolDataPct    int `toml:"thin_pool_data_percent"`
	ThinPoolMetaPct    int `toml:"thin_pool_metadata_percent"`
	// LVMCommand is the lvm binary; "" turns the LVM part off.
	LVMCommand         string   `toml:"lvm_command"`
	LVMTimeout         Duration `toml:"lvm_timeout"`
	MountPointsExclude string   `toml:"mount_points_exclude"`
	FSTypesExclude     string   `toml:"fs_types_exclude"`
}

type NodeServiceDown struct {
	Common
	ControlPlaneUnits []string `toml:"controlplane_units"`
	WorkerUnits       []string `toml:"worker_units"`
}

type NodeInfoStale struct {
	Common
	Path   string   `toml:"path"`
	MaxAge Duration `toml:"max_age"`
}

type CertRenewalFailing struct {
	Common
	RenewWithin  Duration `toml:"renew_within"`
	Certificates []string `toml:"certificates"`
}

type ProxyNotServing struct {
	Common
	MetricsURL  string `toml:"metrics_url"`
	ReadyMetric string `toml:"ready_metric"`
}

type ClockNotSynchronized struct {
	Common
	MaxError Duration `toml:"max_error"`
}

type CNIUnhealthy struct {
	Common
	Socket string `toml:"socket"`
}

type TunnelDisconnected struct {
	Common
	MetricsURL        string `toml:"metrics_url"`
	ConnectionsMetric string `toml:"connections_metric"`
	AgentUnit         string `toml:"agent_unit"`
}

type GpuActivationFailed struct {
	Common
	MarkerPath  string   `toml:"marker_path"`
	CDISpecDirs []string `toml:"cdi_spec_dirs"`
	CDIKind     string   `toml:"cdi_kind"`
}

// Bounds of checks.APIServerSourceIPUnavailable.max_read_bytes.
const (
	MinAuditReadBytes = 1 << 20
	MaxAuditReadBytes = 1 << 30
)

// ParseAddressOrPrefix parses an IP address ("10.0.0.5", a prefix of one
// address) or a CIDR prefix ("10.0.0.0/24"), as proxy_addresses lists them.
func ParseAddressOrPrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q: an address with a zone", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

type APIServerSourceIPUnavailable struct {
	Common
	AuditLog             string   `toml:"audit_log"`
	ExcludedUserPrefixes []string `toml:"excluded_user_prefixes"`
	ProxyAddresses       []string `toml:"proxy_addresses"`
	MaxReadBytes         int64    `toml:"max_read_bytes"`
}

type SealedOSTampered struct {
	Common
	RecordedHashes string `toml:"recorded_hashes"`
	DMControl      string `toml:"dm_control"`
}

type NodeTampered struct {
	Common
	Paths   []string `toml:"paths"`
	Exclude []string `toml:"exclude"`
	// Tolerate (on every node) and TolerateGPU (on GPU nodes): globs of
	// protected paths whose changes are reported (tamper report,
	// "tolerated") but do not set the condition: known writers.
	Tolerate      []string `toml:"tolerate"`
	TolerateGPU   []string `toml:"tolerate_gpu"`
	BaselineAfter []string `toml:"baseline_after"`
	Settle        Duration `toml:"settle"`
	// BaselineMaxWait: the baseline is taken this long after the first
	// run of the boot even when baseline_after is not met or the files
	// keep changing (the message says so).
	BaselineMaxWait Duration `toml:"baseline_max_wait"`
}

// Default returns the embedded defaults, decoded afresh on every call: a
// change to one Config (a list appended to or overwritten) can never reach
// another, whatever fields the Config gains. Decoding default.toml takes
// under a millisecond (0.6 ms measured); Default is called once per Load.
func Default() *Config {
	validDefaults()
	c := &Config{}
	if _, err := toml.NewDecoder(bytes.NewReader(defaultTOML)).Decode(c); err != nil {
		panic("config: embedded default.toml is invalid: " + err.Error())
	}
	return c
}

// validDefaults validates the embedded defaults once, the first time they
// are used.
var validDefaults = sync.OnceFunc(func() {
	if _, err := Parse("(defaults)", defaultTOML, nil); err != nil {
		panic("config: embedded default.toml is invalid: " + err.Error())
	}
})

// Load reads the file at path over the defaults. A missing file is not an
// error when allowMissing is set (the daemon's default path); the returned
// bool says whether a file was read.
func Load(path string, allowMissing bool) (*Config, bool, error) {
	c, fromFile, _, err := LoadDigest(path, allowMissing)
	return c, fromFile, err
}

// LoadDigest is Load, with the digest of what it read (FileDigest's).
func LoadDigest(path string, allowMissing bool) (*Config, bool, string, error) {
	b, err := readFile(path)
	digest := digestOf(b, err)
	if errors.Is(err, os.ErrNotExist) && allowMissing {
		return Default(), false, digest, nil
	}
	if err != nil {
		return nil, false, digest, fmt.Errorf("config: %w", err)
	}
	// The defaults are decoded only for a file within the bounds: a
	// refused one costs its scan alone.
	c, err := parse(path, b, Default, fileLimits)
	return c, true, digest, err
}

// FileDigest identifies what the file at path holds now: the SHA-256 of its
// content, "absent", or why it cannot be read. Two reads of an unchanged
// file give the same digest.
func FileDigest(path string) string {
	b, err := readFile(path)
	return digestOf(b, err)
}

// maxFileSize bounds what readFile reads: a configuration is a few KB.
const maxFileSize = 1 << 20

// readFile reads the configuration file at path. A FIFO, a socket or a
// directory is refused without blocking: a FIFO would block the open until
// a writer came (the start, or a reload and the reload watcher, for ever).
// A device is read (--config /dev/null is the defaults), at most
// maxFileSize bytes of it, and one that has nothing to read (a terminal)
// is given up after readWait.
func readFile(path string) ([]byte, error) {
	b, err := smallfile.Read(path, smallfile.Limits{Max: maxFileSize, DeviceWait: readWait})
	var notRegular *smallfile.NotRegularError
	var tooLarge *smallfile.TooLargeError
	var nothing *smallfile.NothingToReadError
	switch {
	case errors.As(err, &notRegular):
		return nil, &kindError{fmt.Sprintf("%s is %s, not a regular file", path, notRegular.Kind)}
	case errors.As(err, &nothing):
		return nil, &kindError{fmt.Sprintf("%s had nothing to read for %s: not a configuration file", path, nothing.Wait)}
	case errors.As(err, &tooLarge):
		size := "its size not known: stat gave less than was read"
		switch {
		case tooLarge.Device:
			size = "a device"
		case tooLarge.Size >= 0:
			size = fmt.Sprintf("%d bytes", tooLarge.Size)
		}
		return nil, &kindError{fmt.Sprintf("%s is larger than 1 MiB, the most read (%s); a configuration is a few KB", path, size)}
	}
	return b, err
}

// ReadFile reads a configuration file as Load does: a FIFO, a socket or a
// directory is refused at once, a device that has nothing to read is given
// up after a second, and at most 1 MiB is read (status and reload read the
// socket keys of a file that does not load with it).
func ReadFile(path string) ([]byte, error) { return readFile(path) }

// readWait bounds how long readFile waits for a device to have something.
const readWait = time.Second

// AbsentDigest is FileDigest's digest of a file that does not exist.
const AbsentDigest = "absent"

func digestOf(b []byte, err error) string {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return AbsentDigest
	case err != nil:
		return "unreadable: " + err.Error()
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Parse decodes data over base (nil: an empty Config) and validates the
// result. The decoder writes into base (a list in data may reuse the
// array of base's list), so pass a base of its own: Default() is one.
// Errors are *Error values naming file, line and key.
// A file over a bound of its shape (MaxNesting, MaxKeyParts, MaxKeyBytes)
// is refused before it is decoded.
func Parse(file string, data []byte, base *Config) (*Config, error) {
	return parse(file, data, func() *Config { return base }, fileLimits)
}

// foreignByteOrderMark says why a file that starts with UTF-16's or
// UTF-32's byte order mark is refused, and what to do; "" for any other
// file (UTF-8's mark is skipped), the mark told by textenc.ForeignMark.
//
// The commands it suggests write a new file and move it over the old one:
// one redirected into the file it reads empties it first, and an empty
// file is a valid configuration (the defaults).
func foreignByteOrderMark(file string, data []byte) string {
	if file == "" {
		file = "FILE"
	}
	m, ok := textenc.ForeignMark(data)
	switch {
	case !ok:
		return ""
	case m.NotUTF16:
		return fmt.Sprintf("the file starts with UTF-16's byte order mark (%[1]s) but is not UTF-16 (no NUL byte): TOML files are UTF-8; remove the mark's two bytes, e.g. tail -c +3 %[2]s > %[2]s.new && mv %[2]s.new %[2]s", m.Bytes, file)
	}
	return fmt.Sprintf("the file is %[1]s (its byte order mark, %[2]s): TOML files are UTF-8; convert it first, e.g. iconv -f %[1]s -t UTF-8 %[3]s > %[3]s.new && mv %[3]s.new %[3]s", m.Encoding, m.Bytes, file)
}

// parse is Parse under the bounds lim, over the configuration base returns
// (called once the file is within the bounds).
func parse(file string, data []byte, base func() *Config, lim limits) (*Config, error) {
	// UTF-16's and UTF-32's byte order marks: TOML is UTF-8 alone. The
	// decoder skips UTF-16's mark and reads on as UTF-8 (where the scan,
	// which finds the keys' lines, does not: the errors of such a file
	// named no line), and says of a file in UTF-16 or UTF-32 only that it
	// holds NUL bytes.
	if msg := foreignByteOrderMark(file, data); msg != "" {
		return nil, &Error{File: file, Line: 1, Msg: msg}
	}
	// One scan: the bounds, and the index of the keys' lines.
	lines, berr, stmt := scanFile(file, data, lim)
	if berr != nil {
		// A syntax error before the statement over a bound is what the
		// decoder would have stopped at: the file's first mistake, at
		// its line (the rest may read as over a bound only because of
		// it). What comes before is within the bounds: cheap to decode.
		if serr := syntaxError(file, data[:stmt], lines); serr != nil {
			return nil, serr
		}
		return nil, berr
	}
	c := base()
	if c == nil {
		c = &Config{}
	}
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(c)
	if err != nil {
		return nil, decodeError(file, data, lines, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		k := und[0].String()
		line := lines.find(k)
		if header, at := commentedTableAbove(data, line, k); header != "" {
			return nil, &Error{File: file, Line: line, Key: k, Msg: fmt.Sprintf("unknown key (%s is a key of %s, whose header above it, at line %d, is commented out: uncomment the header too)", k, header, at)}
		}
		return nil, &Error{File: file, Line: line, Key: k, Msg: "unknown key" + suggest(k)}
	}
	if k := misspeltKey(md.Keys()); k != "" {
		return nil, &Error{File: file, Line: lines.find(k), Key: k, Msg: "unknown key: keys are case-sensitive" + suggest(k)}
	}
	// host_root is compared with "/" (the privileged helper, LVM,
	// journalctl's --root, a reload's diff): "//" or "/./" must be "/".
	if filepath.IsAbs(c.HostRoot) {
		c.HostRoot = filepath.Clean(c.HostRoot)
	}
	// kubelet_root_dir the same way: "/data/kubelet/" is the operator's
	// "/data/kubelet", not a reason to refuse to start a fleet's nodes.
	if filepath.IsAbs(c.KubeletRootDir) {
		c.KubeletRootDir = filepath.Clean(c.KubeletRootDir)
	}
	// The index first: a conflict of two keys is named at the one the
	// file sets.
	c.lines = lines
	c.notes = nil // base's, if it was parsed from a file
	c.deriveFromKubeletRootDir(md)
	for i := range c.notes {
		c.notes[i].File, c.notes[i].Line = file, lines.find(c.notes[i].Key)
	}
	if verr := c.validate(); verr != nil {
		verr.File = file
		verr.Line = lines.find(cmp.Or(verr.at, verr.Key))
		return nil, verr
	}
	return c, nil
}

// syntaxError is the decoder's refusal of data as TOML (a syntax error, a
// key defined twice), nil if it reads.
// lines indexes data (or more).
func syntaxError(file string, data []byte, lines keyIndex) error {
	var doc map[string]any
	_, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&doc)
	if err == nil {
		return nil
	}
	return decodeError(file, data, lines, err)
}

// HostPath resolves an absolute host path under HostRoot, its symbolic
// links resolved as the host resolves them (hostio.InRoot). With host_root
// "/" it is p, with no system call.
func (c *Config) HostPath(p string) string {
	return hostio.InRoot(c.HostRoot, p)
}
