package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syself/autopilot-health/checks"
	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/internal/privileged"
	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/kmsg"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube"
	"github.com/syself/autopilot-health/tamper"
)

var update = flag.Bool("update", false, "rewrite the README's generated catalog")

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// fakeHost builds a host root whose only filesystem is a real directory, so
// the disk check statfs()es something real.
func fakeHost(t *testing.T, extra string) string {
	root := t.TempDir()
	must := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must("proc/self/mountinfo", "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n")
	must("proc/sys/kernel/random/boot_id", "b00t\n")
	must("proc/sys/kernel/hostname", "node-1\n")
	cfg := filepath.Join(root, "config.toml")
	// The repair checks probe this machine's kubelet and systemd; off here.
	off := "[checks.KubeletUnhealthy]\nenabled = false\n[checks.ContainerRuntimeUnhealthy]\nenabled = false\n[checks.ServiceNotRecovering]\nenabled = false\n[checks.NodeServiceDown]\nenabled = false\n"
	must("config.toml", "host_root = \""+root+"\"\nstate_dir = \""+root+"/state\"\n"+extra+off)
	return cfg
}

func TestCheckJSONListsAllConditions(t *testing.T) {
	cfg := fakeHost(t, "[checks.DiskUsageHigh]\nspace_percent = 99\ninodes_percent = 99\n")
	code, out, stderr := run(t, "check", "--json", "--config", cfg)
	var res checkOutput
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s\n%s", err, out, stderr)
	}
	if res.Node != "node-1" || res.Role != report.RoleWorker || len(res.Conditions) != len(report.Conditions) {
		t.Fatalf("node %q role %q, %d conditions, the catalog %d", res.Node, res.Role, len(res.Conditions), len(report.Conditions))
	}
	byType := map[string]checkRow{}
	anyTrue := false
	for i, r := range res.Conditions {
		if r.Type != report.Conditions[i].Type {
			t.Errorf("row %d is %s, want catalog order (%s)", i, r.Type, report.Conditions[i].Type)
		}
		byType[r.Type] = r
		anyTrue = anyTrue || r.Status == report.StatusTrue
		if r.State == "not-implemented" && (r.Status != report.StatusUnknown || r.Reason != report.ReasonNotImplemented) {
			t.Errorf("%s is not implemented but says %s/%s", r.Type, r.Status, r.Reason)
		}
	}
	if d := byType["DiskUsageHigh"]; d.Status != report.StatusFalse || d.Message != "1 filesystem not over 99% space and 99% inodes" {
		t.Errorf("DiskUsageHigh = %+v", d)
	}
	// The report documents of the run, one per domain; storage carries the
	// filesystem DiskUsageHigh measured.
	if len(res.Report) != len(report.Domains) {
		t.Errorf("report has %d domains, want %d: %v", len(res.Report), len(report.Domains), res.Report)
	}
	var storage struct {
		SchemaVersion int `json:"schemaVersion"`
		Filesystems   []struct {
			MountPoint string `json:"mountPoint"`
		} `json:"filesystems"`
	}
	if err := json.Unmarshal(res.Report["storage"], &storage); err != nil || storage.SchemaVersion != report.SchemaVersion || len(storage.Filesystems) != 1 || storage.Filesystems[0].MountPoint != "/" {
		t.Errorf("report.storage = %s (%v)", res.Report["storage"], err)
	}
	if c := byType["ClockNotSynchronized"]; c.Status == report.StatusUnknown || c.State != "scheduled" {
		t.Errorf("ClockNotSynchronized = %+v", c)
	}
	if g := byType["GpuActivationFailed"]; g.Reason != report.ReasonNotApplicable || g.Message != "applies to GPU nodes only" {
		t.Errorf("GpuActivationFailed = %+v", g)
	}
	if k := byType["KubeletUnhealthy"]; k.Disposition != report.Repair {
		t.Errorf("KubeletUnhealthy disposition %s", k.Disposition)
	}
	if want := map[bool]int{true: 1, false: 0}[anyTrue]; code != want {
		t.Errorf("exit %d with a True condition = %v", code, anyTrue)
	}
}

func TestCheckExitCodes(t *testing.T) {
	// A threshold of 1% makes any real filesystem "full": exit 1.
	cfg := fakeHost(t, "[checks.DiskUsageHigh]\nspace_percent = 1\n")
	code, out, _ := run(t, "check", "--only", "DiskUsageHigh", "--config", cfg)
	if code != exitProblem || !strings.Contains(out, "DiskUsageHigh  True    FilesystemSpaceHigh  operability") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
	if !strings.Contains(out, "1 condition: 0 ok, 1 problem (DiskUsageHigh)") {
		t.Errorf("summary missing:\n%s", out)
	}
	cfg = fakeHost(t, "[checks.DiskUsageHigh]\nspace_percent = 99\ninodes_percent = 99\n")
	if code, out, _ := run(t, "check", "--only", "DiskUsageHigh,GpuActivationFailed", "--config", cfg); code != exitOK {
		t.Errorf("healthy: exit %d\n%s", code, out)
	}
	if code, _, errs := run(t, "check", "--only", "DiskFull", "--config", cfg); code != exitError || !strings.Contains(errs, `unknown condition "DiskFull"`) {
		t.Errorf("bad --only: exit %d, %s", code, errs)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("[checks.DiskUsageHigh]\nspace_percent = 0\n"), 0o644)
	if code, _, errs := run(t, "check", "--config", bad); code != exitError || !strings.Contains(errs, bad+":2: key checks.DiskUsageHigh.space_percent: must be a percentage") {
		t.Errorf("bad config: exit %d, %s", code, errs)
	}
	if code, _, errs := run(t, "check", "--config", "/nonexistent/x.toml"); code != exitError || !strings.Contains(errs, "no such file") {
		t.Errorf("missing explicit config: exit %d, %s", code, errs)
	}
}

func TestConfigCommands(t *testing.T) {
	code, out, _ := run(t, "config", "default")
	if code != 0 || !strings.Contains(out, "[checks.ClockNotSynchronized]") {
		t.Fatalf("config default: %d", code)
	}
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte(out), 0o644)
	if code, out, _ := run(t, "config", "validate", p); code != 0 || out != p+": valid\n" {
		t.Errorf("the printed default does not validate: %d %q", code, out)
	}
	os.WriteFile(p, []byte("[kmsg]\ndevise = \"/dev/kmsg\"\n"), 0o644)
	if code, _, errs := run(t, "config", "validate", p); code != exitError || errs != p+":2: key kmsg.devise: unknown key (did you mean kmsg.device?)\n" {
		t.Errorf("validate bad: %d %q", code, errs)
	}
	if code, _, _ := run(t, "config"); code != exitError {
		t.Errorf("config without subcommand: %d", code)
	}
	// Its keys are set, not commented out as the packages' conffile's are:
	// the help says so ("every key commented" read as commented out).
	if _, out, _ := run(t, "config", "default"); !strings.Contains(out, "\nhost_root = \"/\"\n") {
		t.Error("config default does not set host_root")
	}
	for _, args := range [][]string{{"config", "default", "--help"}, {"config", "--help"}, {"--help"}} {
		if _, out, _ := run(t, args...); !strings.Contains(out, "print the default configuration, every key set, with a comment") {
			t.Errorf("%v does not say config default sets every key: %s", args, out)
		}
	}
}

// TestConfigValidateAsTheUnitsRun: config validate --privileged-helper
// refuses what run --privileged-helper (the unit's ExecStart=) refuses, a
// host_root other than "/", with the same file:line: key: words and exit 2;
// without the flag the file is valid, as for run without it. The package's
// postinst validates so (TestDebianPackageRefusesWhatTheUnitRefuses).
func TestConfigValidateAsTheUnitsRun(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte("# edited\nhost_root = \"/host\"\n"), 0o644)
	want := p + `:2: key host_root: "/host": the privileged helper reads this host's own root only; run without --privileged-helper` + "\n"
	if code, _, errs := run(t, "config", "validate", "--privileged-helper=/run/autopilot-health-privileged/helper.sock", p); code != exitError || errs != want {
		t.Errorf("validate --privileged-helper of a host_root: exit %d, %q; want 2, %q", code, errs, want)
	}
	if code, _, errs := run(t, "run", "--config", p, "--privileged-helper=/nonexistent.sock"); code != exitError || errs != "autopilot-health: refusing to start: "+want {
		t.Errorf("run --privileged-helper of a host_root: exit %d, %q", code, errs)
	}
	if code, out, _ := run(t, "config", "validate", p); code != 0 || out != p+": valid\n" {
		t.Errorf("validate of a host_root without the flag: exit %d, %q", code, out)
	}
	os.WriteFile(p, []byte("host_root = \"/\"\n"), 0o644)
	if code, out, _ := run(t, "config", "validate", "--privileged-helper=/x.sock", p); code != 0 || out != p+": valid\n" {
		t.Errorf("validate --privileged-helper of host_root /: exit %d, %q", code, out)
	}
}

// config validate warns, on stderr with exit 0, of a kmsg.device that this
// host does not have or that is not the kernel log, naming file, line and
// key, and under --privileged-helper of one other than /dev/kmsg (the
// daemon opens it itself there, without devices): run starts on such a
// file, its kernel log monitor failing and retrying
// (TestDaemonWithAMissingKmsgDeviceRunsAndSaysSo). Before, it said the file
// was valid and nothing else. Not with kmsg.enabled = false, nor under a
// host_root that is no directory here (the file is another host's).
func TestConfigValidateWarnsOfTheKmsgDevice(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.toml")
	const outcome = ": run starts, and the kernel log monitor cannot read it: its conditions Unknown (CheckFailed) while it retries\n"
	missing := p + `:3: key kmsg.device: warning: /dev/nonexistent-kmsg does not exist on this host` + outcome
	underUnit := p + `:3: key kmsg.device: warning: "/dev/nonexistent-kmsg": under the unit (--privileged-helper) the daemon opens a kmsg.device other than /dev/kmsg itself, without devices (PrivateDevices=)` + outcome
	for _, tc := range []struct {
		file   string
		helper bool
		want   string
	}{
		{"# edited\n[kmsg]\ndevice = \"/dev/nonexistent-kmsg\"\n", false, missing},
		{"# edited\n[kmsg]\ndevice = \"/dev/nonexistent-kmsg\"\n", true, missing + underUnit},
		{"# edited\n[kmsg]\ndevice = \"/dev/null\"\n", false,
			p + `:3: key kmsg.device: warning: on this host, /dev/null is the character device 1:3, not the kernel log (/dev/kmsg is 1:11)` + outcome},
		{"[kmsg]\nenabled = false\ndevice = \"/dev/nonexistent-kmsg\"\n", true, ""},
		{"host_root = " + strconv.Quote(filepath.Join(dir, "absent")) + "\n[kmsg]\ndevice = \"/dev/nonexistent-kmsg\"\n", false, ""},
	} {
		os.WriteFile(p, []byte(tc.file), 0o644)
		args := []string{"config", "validate", p}
		if tc.helper {
			args = []string{"config", "validate", "--privileged-helper=/x.sock", p}
		}
		if code, out, errs := run(t, args...); code != exitOK || out != p+": valid\n" || errs != tc.want {
			t.Errorf("%v of\n%s: exit %d, stdout %q, stderr %q; want 0, valid, %q", args, tc.file, code, out, errs, tc.want)
		}
	}
	// The kernel log itself, where this host has it: no warning.
	if _, err := os.Stat("/dev/kmsg"); err == nil {
		os.WriteFile(p, []byte("[kmsg]\ndevice = \"/dev/kmsg\"\n"), 0o644)
		if code, _, errs := run(t, "config", "validate", "--privileged-helper=/x.sock", p); code != exitOK || errs != "" {
			t.Errorf("validate of /dev/kmsg: exit %d, stderr %q; want 0 and nothing", code, errs)
		}
	}
}

func TestUsageAndVersion(t *testing.T) {
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "autopilot-health ") {
		t.Errorf("version: %d %q", code, out)
	}
	if code, _, errs := run(t, "frobnicate"); code != exitError || !strings.Contains(errs, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %d %q", code, errs)
	}
	if code, _, _ := run(t, "run", "--bogus"); code != exitError {
		t.Errorf("run --bogus: %d", code)
	}
}

// A --help after a positional argument, where Go's flag package stops
// reading flags, is asked for all the same: usage on stdout, exit 0.
func TestHelpAfterAnArgument(t *testing.T) {
	for _, args := range [][]string{
		{"manifests", "alerts", "--help"},
		{"kmsg", "replay", "/dev/null", "-h"},
		{"check", "stray", "--help"},
		{"config", "validate", "/etc/autopilot-health/config.toml", "--help"},
		{"config", "default", "stray", "-h"},
		{"version", "stray", "--help"},
	} {
		code, out, errs := run(t, args...)
		if code != exitOK || errs != "" || !strings.HasPrefix(out, "Usage: autopilot-health "+args[0]) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// TestHelpGoesToStdout: a usage asked for with --help or -h is printed on
// stdout with exit 0 ("autopilot-health check --help | less" pages it, as
// GNU tools and the top-level help do); a bad flag prints its error and the
// usage on stderr with exit 2, and nothing on stdout.
func TestHelpGoesToStdout(t *testing.T) {
	for _, cmd := range [][]string{
		{"run"}, {"check"}, {"kmsg"}, {"kmsg", "replay"}, {"kmsg", "rules"}, {"status"}, {"reload"},
		{"tamper"}, {"tamper", "clear"}, {"tamper", "status"}, {"tamper", "layers"},
		{"catalog"}, {"config"}, {"config", "default"}, {"config", "validate"}, {"manifests"}, {"version"}, {"man"},
	} {
		name := strings.Join(cmd, " ")
		for _, h := range []string{"--help", "-h"} {
			code, out, errs := run(t, append(append([]string{}, cmd...), h)...)
			if code != exitOK || errs != "" || !strings.HasPrefix(out, "Usage: autopilot-health "+cmd[0]) && !strings.Contains(out, "\n  autopilot-health "+name) {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q", name, h, code, out, errs)
			}
		}
		if cmd[0] == "tamper" && len(cmd) == 1 || cmd[0] == "config" && len(cmd) == 1 || cmd[0] == "kmsg" && len(cmd) == 1 {
			continue // a stray word is a subcommand: TestStrayArgumentsAreRefused
		}
		code, out, errs := run(t, append(append([]string{}, cmd...), "--no-such-flag")...)
		if code != exitError || out != "" || !strings.Contains(errs, "flag provided but not defined: -no-such-flag\nUsage: autopilot-health "+name) {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", name, code, out, errs)
		}
	}
}

// TestStrayArgumentsAreRefused: a word or a flag a command does not take is
// bad usage, exit 2 with nothing on stdout, also where the command has no
// flags of its own: "config default --json | jq" must not get TOML and exit
// 0, nor "version --short" a line it did not ask for.
func TestStrayArgumentsAreRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"version", "extra"}, `autopilot-health version: unexpected argument "extra"`},
		{[]string{"--version", "--short"}, "flag provided but not defined: -short\nUsage: autopilot-health version"},
		{[]string{"config", "default", "extra"}, `autopilot-health config default: unexpected argument "extra"`},
		{[]string{"config", "default", "--json"}, "flag provided but not defined: -json\nUsage: autopilot-health config default"},
		{[]string{"config", "validate", "--json", "c.toml"}, "flag provided but not defined: -json\nUsage: autopilot-health config validate [--privileged-helper SOCKET] FILE"},
		{[]string{"config", "validate", "a.toml", "b.toml"}, `autopilot-health config validate: one FILE, got 2: "a.toml" "b.toml"`},
		{[]string{"manifests", "--list", "alerts"}, `autopilot-health manifests: unexpected argument "alerts": --list takes none`},
		{[]string{"tamper", "--bogus"}, `autopilot-health tamper: unknown command "--bogus"`},
		{[]string{"kmsg", "--bogus"}, "Usage: autopilot-health kmsg replay"},
		{[]string{"config", "--bogus"}, `autopilot-health config: unknown subcommand "--bogus"`},
	} {
		code, out, errs := run(t, c.args...)
		if code != exitError || out != "" || !strings.Contains(errs, c.err) {
			t.Errorf("%q: exit %d, stdout %.60q, stderr %q; want exit 2 and %q", c.args, code, out, errs, c.err)
		}
	}
}

// TestFlagAfterAnArgument: a flag written after an argument, where Go's flag
// package stops reading flags, is named as such (exit 2, the usage on
// stderr): not taken for a second FILE or KIND and answered with a bare
// usage or "one KIND at a time", nor read as a file. After "--" it is an
// argument.
func TestFlagAfterAnArgument(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"kmsg", "replay", "-", "--json"}, `autopilot-health kmsg replay: flag --json after the argument "-" is not read as a flag: flags go before any argument` + "\nUsage: autopilot-health kmsg replay"},
		{[]string{"kmsg", "replay", "/dev/null", "--config=/dev/null"}, `autopilot-health kmsg replay: flag --config=/dev/null after the argument "/dev/null" is not read as a flag`},
		{[]string{"manifests", "alerts", "--list"}, `autopilot-health manifests: flag --list after the argument "alerts" is not read as a flag`},
		{[]string{"check", "stray", "-json"}, `autopilot-health check: flag -json after the argument "stray" is not read as a flag`},
	} {
		code, out, errs := run(t, c.args...)
		if code != exitError || out != "" || !strings.Contains(errs, c.err) {
			t.Errorf("%q: exit %d, stdout %.60q, stderr %q; want exit 2 and %q", c.args, code, out, errs, c.err)
		}
	}
	// After "--", a word like a flag is an argument, and is not named as a flag.
	if code, _, errs := run(t, "manifests", "--", "alerts", "--list"); code != exitError || errs != "autopilot-health manifests: one KIND at a time, got 2\n" {
		t.Errorf("manifests -- alerts --list: exit %d, stderr %q", code, errs)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	os.WriteFile(filepath.Join(dir, "--json"), []byte("[    1.000000] hello\n"), 0o644)
	code, out, errs := run(t, "kmsg", "replay", "--config", "/dev/null", "--", "--json")
	if code != exitOK || !strings.Contains(errs, "1 lines read") {
		t.Errorf("kmsg replay -- --json: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte("role = \"master\"\n"), 0o644)
	code, _, errs := run(t, "run", "--config", p)
	if code != exitError || errs != "autopilot-health: refusing to start: "+p+":1: key role: must be one of \"\", \"controlplane\", \"worker\", got \"master\"\n" {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}

// A start that fails for a reason other than the file (another daemon
// holds the control socket) exits 1, which the unit restarts; only a
// refused file or flag exits 2, which it does not (RestartPreventExitStatus=2):
// exit 2 here would leave the node without its daemon once the other is gone.
func TestRunThatCannotStartExitsOne(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(heldSocketConfig(t, dir)), 0o644)
	code, _, errs := run(t, "run", "--config", cfg)
	if code != exitProblem || !strings.Contains(errs, "another daemon is listening") || !strings.Contains(errs, "could not start") {
		t.Errorf("exit %d, stderr %q; want 1, could not start: another daemon is listening", code, errs)
	}
}

// A file that cannot be read for a reason that may pass (an I/O error:
// here a real EIO, a read of /proc/self/mem at address 0) is not refused:
// exit 1, which the unit restarts in 5 s. Exit 2 left the node without its
// daemon until someone edited a file that was good all along.
//
// Before that exit the read is tried again in the process, backing off
// (about a minute in all): exit 1 is restarted 5 s later, and a file that
// keeps failing restarted the daemon 12 times a minute for ever.
func TestRunThatCannotReadTheFileExitsOne(t *testing.T) {
	var slept []time.Duration
	oldWaits, oldSleep := readRetryWaits, readRetrySleep
	readRetryWaits = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	readRetrySleep = func(d time.Duration) { slept = append(slept, d) }
	t.Cleanup(func() { readRetryWaits, readRetrySleep = oldWaits, oldSleep })
	code, out, errs := run(t, "run", "--config", "/proc/self/mem")
	want := "autopilot-health: cannot read the configuration file, trying again for 7s: config: read /proc/self/mem: input/output error\n" +
		"autopilot-health: could not start: cannot read the configuration file: config: read /proc/self/mem: input/output error\n"
	if code != exitProblem || out != "" || errs != want {
		t.Errorf("exit %d, stdout %q, stderr %q; want 1, %q", code, out, errs, want)
	}
	if !slices.Equal(slept, readRetryWaits) {
		t.Errorf("waited %v between reads, want %v", slept, readRetryWaits)
	}
	// The shipped waits add up to about a minute, within the unit's
	// TimeoutStartSec (3 min).
	if s := sumWaits(oldWaits); s < 45*time.Second || s > 90*time.Second {
		t.Errorf("the read is tried again for %s, want about a minute", s)
	}
}

// host_root with the helper is the file's: refused, exit 2, with its
// file:line: key, as config validate --privileged-helper says it.
func TestRunRefusesHostRootWithTheHelper(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(p, []byte("host_root = \"/host\"\n"), 0o644)
	code, _, errs := run(t, "run", "--config", p, "--privileged-helper", "/nonexistent/helper.sock")
	if code != exitError || !strings.Contains(errs, "refusing to start: "+p+":1: key host_root: \"/host\"") {
		t.Errorf("exit %d, stderr %q; want 2, refusing to start", code, errs)
	}
}

// A host_root that is no directory here (absent, a file) is the file's
// bad value: run refuses it, exit 2 (not restarted every 5 s for ever),
// and check refuses it, each naming file, line and key; before, "could
// not start: cannot read the boot id: open <root>/proc/...", exit 1. A
// directory, and a link to one, is no refusal: run goes on to its start.
// config validate checks the file alone and passes it.
func TestHostRootThatIsNoDirectoryIsRefused(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	for _, tc := range []struct{ root, why string }{
		{filepath.Join(dir, "absent"), "no such directory on this host"},
		{file, "not a directory on this host"},
	} {
		p := filepath.Join(dir, "c.toml")
		// Everything else the daemon's own below dir: a run that was not
		// refused binds nothing of the host's.
		os.WriteFile(p, fmt.Appendf(nil, "# a comment\nhost_root = %q\nstate_dir = %q\ncontrol_socket = %q\n[status]\nsocket = %q\n[metrics]\nlisten_address = \"127.0.0.1:1\"\n[kubernetes]\nkubeconfig = \"\"\n",
			tc.root, filepath.Join(dir, "state"), filepath.Join(dir, "c.sock"), filepath.Join(dir, "s.sock")), 0o644)
		want := p + ":2: key host_root: " + strconv.Quote(tc.root) + ": " + tc.why + ": every host path, /proc and /sys are read under it (\"/\" for this host's own root)\n"
		if code, _, errs := run(t, "run", "--config", p); code != exitError || errs != "autopilot-health: refusing to start: "+want {
			t.Errorf("run, host_root %s: exit %d, stderr %q; want 2, %q", tc.root, code, errs, want)
		}
		if code, _, errs := run(t, "check", "--config", p); code != exitError || errs != "autopilot-health check: "+want {
			t.Errorf("check, host_root %s: exit %d, stderr %q; want 2, %q", tc.root, code, errs, want)
		}
		if code, out, errs := run(t, "config", "validate", p); code != exitOK {
			t.Errorf("config validate, host_root %s: exit %d, stdout %q, stderr %q; want 0", tc.root, code, out, errs)
		}
	}
	// A link to a directory is one: not refused.
	link := filepath.Join(dir, "link")
	os.Symlink(t.TempDir(), link)
	p := filepath.Join(dir, "ok.toml")
	os.WriteFile(p, []byte("host_root = "+strconv.Quote(link)+"\n"), 0o644)
	if err := daemon.HostRootRefuses(mustLoad(t, p), p); err != nil {
		t.Errorf("host_root a link to a directory: %v", err)
	}
}

func mustLoad(t *testing.T, p string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(p, false)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

const (
	catalogBegin = "<!-- BEGIN CATALOG (generated by `make docs` from report/catalog.go) -->\n"
	catalogEnd   = "<!-- END CATALOG -->"
)

// The README's condition catalog is generated from report/catalog.go.
func TestREADMECatalog(t *testing.T) {
	p := "../../README.md"
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, catalogBegin), strings.Index(s, catalogEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the catalog markers")
	}
	want := s[:i+len(catalogBegin)] + CatalogMarkdown() + s[j:]
	if *update {
		if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if s != want {
		t.Error("README.md's catalog is out of date with report/catalog.go: run `make docs`")
	}
}

// systemd accepts the unit files: the daemon's, and its privileged
// helper's socket and service.
func TestUnitFileVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testenv.Skip(t, "systemd-analyze not installed (apt install systemd)")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "autopilot-health")
	helper := filepath.Join(tmp, "autopilot-health-privileged")
	for out, pkg := range map[string]string{bin: ".", helper: "../autopilot-health-privileged"} {
		if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, b)
		}
	}
	unit, err := os.ReadFile("../../units/autopilot-health.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "WatchdogSec=", "Restart=always", "Before=kubelet.service", "StateDirectory=autopilot-health",
		// The default configuration path, optional (a sysext image ships no
		// /etc file); the reload asks the daemon of the same file and waits
		// for the outcome.
		"ExecStart=/usr/bin/autopilot-health run --privileged-helper=/run/autopilot-health-privileged/helper.sock\n",
		"Wants=autopilot-health-privileged.socket\n",
		"ExecReload=/usr/bin/autopilot-health reload\n"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("unit lacks %s", want)
		}
	}
	if bytes.Contains(unit, []byte("ProtectClock=yes")) {
		t.Error("unit sandboxing would deny adjtimex")
	}
	socket, _ := os.ReadFile("../../units/autopilot-health-privileged.socket")
	if !bytes.Contains(socket, []byte("ListenStream="+privileged.DefaultSocket+"\n")) || !bytes.Contains(unit, []byte("="+privileged.DefaultSocket)) {
		t.Errorf("the socket unit and the daemon's unit do not name %s", privileged.DefaultSocket)
	}
	// Every file under units/, read from the directory: a unit added there
	// is verified without this list being edited (the .path unit was not).
	entries, err := os.ReadDir("../../units")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	for _, want := range []string{"autopilot-health.service", "autopilot-health-refused.service", "autopilot-health-privileged.socket",
		"autopilot-health-privileged.service", "autopilot-health.path"} {
		if !slices.Contains(names, want) {
			t.Errorf("units/ lacks %s (it has %v)", want, names)
		}
	}
	dir := t.TempDir()
	var paths []string
	for _, name := range names {
		b, err := os.ReadFile("../../units/" + name)
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/lib/autopilot-health/autopilot-health-privileged"), []byte(helper))
		b = bytes.ReplaceAll(b, []byte("/usr/bin/autopilot-health"), []byte(bin))
		p := filepath.Join(dir, name)
		os.WriteFile(p, b, 0o644)
		paths = append(paths, p)
	}
	out, err := exec.Command(sa, append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// unitExposureLimit is the highest exposure `systemd-analyze security` may
// give a shipped unit, in its --threshold unit (tenths: 20 is 2.0). The
// daemon's unit is rated 1.8 and its privileged helper's 1.6 on systemd
// 252; what remains is what each needs, named in a comment of the unit
// (README: "Under systemd").
const unitExposureLimit = 20

// securityAnalysis runs `systemd-analyze security --offline=yes` on a unit
// file with the threshold, and again for its JSON table: whether it passed
// the threshold, its summary line, and the settings it counts as exposures.
func securityAnalysis(t *testing.T, sa, unit string, threshold int) (pass bool, summary string, exposures []string) {
	t.Helper()
	out, err := exec.Command(sa, "security", "--offline=yes", fmt.Sprintf("--threshold=%d", threshold), unit).CombinedOutput()
	if bytes.Contains(out, []byte("unrecognized option")) {
		testenv.Skip(t, "this systemd-analyze has no --offline (systemd 250 or later has): "+strings.TrimSpace(string(out)))
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Overall exposure level") {
			summary = strings.TrimSpace(l)
		}
	}
	if summary == "" {
		t.Fatalf("systemd-analyze security printed no exposure level (exit %v):\n%s", err, out)
	}
	js, jerr := exec.Command(sa, "security", "--offline=yes", "--json=short", unit).Output()
	var rows []struct {
		Set  *bool  `json:"set"`
		Name string `json:"name"`
	}
	if jerr == nil {
		jerr = json.Unmarshal(js, &rows)
	}
	if jerr != nil {
		t.Fatalf("systemd-analyze security --json=short: %v\n%s", jerr, js)
	}
	for _, r := range rows {
		if r.Set != nil && !*r.Set {
			exposures = append(exposures, r.Name)
		}
	}
	return err == nil, summary, exposures
}

// securityPoints sums what systemd-analyze security shows with
// SYSTEMD_ANALYZE_DEBUG=1: each setting's weight × badness / range, rounded
// up, and the weights; the exposure is their ratio (rounded up, in tenths).
func securityPoints(t *testing.T, sa, unit string) (points, weights uint64) {
	t.Helper()
	cmd := exec.Command(sa, "security", "--offline=yes", "--json=short", unit)
	cmd.Env = append(os.Environ(), "SYSTEMD_ANALYZE_DEBUG=1")
	out, err := cmd.Output()
	var rows []struct {
		Weight  *json.Number `json:"weight"`
		Badness *json.Number `json:"badness"`
		Range   *json.Number `json:"range"`
	}
	if err == nil {
		err = json.Unmarshal(out, &rows)
	}
	if err != nil {
		t.Fatalf("systemd-analyze security --json=short (debug): %v\n%s", err, out)
	}
	for _, r := range rows {
		if r.Weight == nil || r.Badness == nil || r.Range == nil {
			t.Fatalf("systemd-analyze security --json=short lacks weight, badness or range (SYSTEMD_ANALYZE_DEBUG=1):\n%s", out)
		}
		w, e1 := strconv.ParseUint(r.Weight.String(), 10, 64)
		b, e2 := strconv.ParseUint(r.Badness.String(), 10, 64)
		rg, e3 := strconv.ParseUint(r.Range.String(), 10, 64)
		if e1 != nil || e2 != nil || e3 != nil || rg == 0 {
			t.Fatalf("systemd-analyze security: weight %v, badness %v, range %v", r.Weight, r.Badness, r.Range)
		}
		if b > rg {
			continue // UINT64_MAX: not applicable (root: SupplementaryGroups=, RemoveIPC=)
		}
		points += (b*w + rg - 1) / rg
		weights += w
	}
	return points, weights
}

// unjustified returns the exposures that no comment line of the unit names
// (the name as systemd-analyze prints it, e.g. "PrivateNetwork=").
func unjustified(unit []byte, exposures []string) []string {
	var comments []string
	for _, l := range strings.Split(string(unit), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			comments = append(comments, l)
		}
	}
	var missing []string
	for _, e := range exposures {
		found := false
		for _, c := range comments {
			if strings.Contains(c, e) {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, e)
		}
	}
	return missing
}

// The shipped units' sandboxes as systemd-analyze rates them: each at most
// unitExposureLimit (the 2.0), and every setting still counted as an
// exposure named in a comment saying what breaks without it. Both can
// fail: a unit without its tightest line is rated above the limit, and
// without UMask= (an exposure too small to cross it) it has an exposure no
// comment names. The points are README's ("Under systemd", Exposure).
func TestUnitSecurity(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testenv.Skip(t, "systemd-analyze not installed (apt install systemd)")
	}
	for _, u := range []struct {
		name             string
		points, weights  uint64
		summary, without string
	}{
		{"autopilot-health.service", 9765, 56160, "1.8", "CapabilityBoundingSet="},
		{"autopilot-health-privileged.service", 8710, 56160, "1.6", "CapabilityBoundingSet=CAP_SYSLOG CAP_SYS_ADMIN CAP_DAC_READ_SEARCH"},
	} {
		path := "../../units/" + u.name
		unit, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		pass, summary, exposures := securityAnalysis(t, sa, path, unitExposureLimit)
		t.Logf("%s; exposures: %s", summary, strings.Join(exposures, ", "))
		if !pass || !strings.Contains(summary, ": "+u.summary+" ") {
			t.Errorf("systemd-analyze security --offline=yes --threshold=%d %s: %s; README says %s", unitExposureLimit, path, summary, u.summary)
		}
		if len(exposures) == 0 {
			t.Errorf("%s: systemd-analyze security lists no exposure: its output changed, or the unit needs no root", u.name)
		}
		if m := unjustified(unit, exposures); len(m) > 0 {
			t.Errorf("%s: exposures no comment in the unit justifies: %s", u.name, strings.Join(m, ", "))
		}
		if points, weights := securityPoints(t, sa, path); points != u.points || weights != u.weights {
			t.Errorf("%s scores %d of %d points, the README says %d of %d", u.name, points, weights, u.points, u.weights)
		}
		without := func(line string) string {
			t.Helper()
			if !bytes.Contains(unit, []byte("\n"+line+"\n")) {
				t.Fatalf("%s has no line %q", u.name, line)
			}
			p := filepath.Join(t.TempDir(), u.name)
			if err := os.WriteFile(p, bytes.Replace(unit, []byte("\n"+line+"\n"), []byte("\n"), 1), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		if pass, summary, _ := securityAnalysis(t, sa, without(u.without), unitExposureLimit); pass {
			t.Errorf("%s without %s passes the threshold %d: %s", u.name, u.without, unitExposureLimit, summary)
		}
		p := without("UMask=0077")
		b, _ := os.ReadFile(p)
		_, _, exposures = securityAnalysis(t, sa, p, unitExposureLimit)
		if m := unjustified(b, exposures); len(m) != 1 || m[0] != "UMask=" {
			t.Errorf("%s without UMask=: unjustified exposures %q, want [UMask=]", u.name, m)
		}
	}
}

// firstWrite records how many input lines had been handed to the replay
// when its first output arrived.
type firstWrite struct {
	written *atomic.Int64
	at      atomic.Int64
	n       atomic.Int64
}

func (w *firstWrite) Write(p []byte) (int, error) {
	if w.n.Add(int64(len(p))) == int64(len(p)) {
		w.at.Store(w.written.Load())
	}
	return len(p), nil
}

// TestKmsgReplayTableStreams: the table of a replay is written while the
// input is read, not held whole until its end: a capture of millions of
// matching lines (a journal of a dying disk, 2 GB) would otherwise hold
// every row in memory (about 4 bytes per byte of input) and print nothing
// to "| head" until the whole file was read. The input comes through a
// pipe, which holds a bounded part of it, so the first row must be out
// while most of the input is still to be written.
func TestKmsgReplayTableStreams(t *testing.T) {
	const lines = 20000
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var written atomic.Int64
	go func() {
		defer w.Close()
		for i := range lines {
			if _, err := fmt.Fprintf(w, "[%d.000000] EXT4-fs error (device sda%d): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0\n", i, i%10); err != nil {
				return
			}
			written.Add(1)
		}
	}()
	out := &firstWrite{written: &written}
	var errb bytes.Buffer
	code := Main([]string{"kmsg", "replay", "--config", "/dev/null", fmt.Sprintf("/dev/fd/%d", r.Fd())}, out, &errb)
	if code != exitOK || !strings.Contains(errb.String(), fmt.Sprintf("%d lines read (dmesg), 0 skipped, %d actions", lines, lines)) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if at := out.at.Load(); at > lines/4 {
		t.Errorf("the first row was written when %d of %d lines had been read: the table is held until the end", at, lines)
	}
}

func TestKmsgReplayJSON(t *testing.T) {
	in := filepath.Join(t.TempDir(), "dmesg.txt")
	os.WriteFile(in, []byte(`[    4.244064] EXT4-fs (sda1): Remounting filesystem read-only
[    5.000000] random: crng init done
[    6.530965] node-1 kernel: INFO: task containerd:77 blocked for more than 120 seconds.
<4>[    7.100000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.
`), 0o644)
	code, out, errs := run(t, "kmsg", "replay", "--json", "--config", "/dev/null", in)
	want := `{"kind":"condition","type":"ReadonlyFilesystem","status":"True","reason":"FilesystemIsReadOnly","message":"EXT4-fs (sda1): Remounting filesystem read-only"}
{"kind":"condition","type":"KernelDeadlock","status":"True","reason":"CriticalTaskHung","message":"INFO: task containerd:77 blocked for more than 120 seconds."}
{"kind":"event","reason":"TaskHung","message":"INFO: task containerd:77 blocked for more than 120 seconds."}
{"kind":"condition","type":"GpuFallenOffBus","status":"True","reason":"GpuFellOffBus","message":"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."}
{"kind":"event","reason":"NvidiaXidError","message":"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."}
`
	if code != 0 || out != want {
		t.Errorf("exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errs, out, want)
	}
	if code, _, errs := run(t, "kmsg", "replay", "/nonexistent"); code != exitError || !strings.Contains(errs, "no such file") {
		t.Errorf("missing file: %d %q", code, errs)
	}
	if code, out, _ := run(t, "kmsg", "rules", "--config", "/dev/null"); code != 0 || !strings.Contains(out, "VerityCorruption") ||
		!regexp.MustCompile(`(?m)^PodVolumeReadOnly +pod-volume +PodVolumeReadOnly +\(none: a ReadonlyFilesystem line on a pod's volume\)$`).MatchString(out) {
		t.Errorf("kmsg rules: %d\n%s", code, out)
	}
}

// A replay is of another host's lines, or another time's: a hung task's
// PID is not looked up in this host's /proc (nor under host_root), so a
// PID that is a pod's process here does not change what the line did
// there.
func TestKmsgReplayDoesNotLookUpTasks(t *testing.T) {
	cfg := fakeHost(t, "")
	pid := filepath.Join(filepath.Dir(cfg), "proc", "77")
	os.MkdirAll(pid, 0o755)
	os.WriteFile(filepath.Join(pid, "cgroup"), []byte("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-1.scope\n"), 0o644)
	// In its container's PID namespace: a pod's own containerd.
	os.WriteFile(filepath.Join(pid, "status"), []byte("Name:\tcontainerd\nNSpid:\t77\t1\n"), 0o644)
	in := filepath.Join(t.TempDir(), "dmesg.txt")
	// Logged now, by this host's kernel time: a line the daemon would
	// look its task up for.
	line := fmt.Sprintf("[%12.6f] INFO: task containerd:77 blocked for more than 120 seconds.\n", float64(kmsg.MonotonicNow())/1e6)
	os.WriteFile(in, []byte(line), 0o644)
	code, out, errs := run(t, "kmsg", "replay", "--json", "--config", cfg, in)
	want := `{"kind":"condition","type":"KernelDeadlock","status":"True","reason":"CriticalTaskHung","message":"INFO: task containerd:77 blocked for more than 120 seconds."}
{"kind":"event","reason":"TaskHung","message":"INFO: task containerd:77 blocked for more than 120 seconds."}
`
	if code != 0 || out != want {
		t.Errorf("exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errs, out, want)
	}
}

// dmesg -T output (captured from the real dmesg) gives the hung kubelet's
// actions and names its form; a line in no known form is named, with
// --json too.
func TestKmsgReplayFormsSummary(t *testing.T) {
	code, out, errs := run(t, "kmsg", "replay", "--config", "/dev/null", "../../kmsg/testdata/replay/dmesg-T.txt")
	if code != 0 || !strings.Contains(out, "KernelDeadlock=True") || errs != "7 lines read (dmesg -T), 0 skipped, 4 actions\n" {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, errs, out)
	}
	in := filepath.Join(t.TempDir(), "shipper.txt")
	os.WriteFile(in, []byte("2026-12-02 19:07:04.278 node-1 kernel: INFO: task kubelet:1 blocked for more than 120 seconds.\n"), 0o644)
	code, out, errs = run(t, "kmsg", "replay", "--json", "--config", "/dev/null", in)
	if code != 0 || out != "" || errs != `1 lines in an unknown format, first: line 1: "2026-12-02 19:07:04.278 node-1 kernel: INFO: task kubelet:1 blocked for more than 120 seconds."`+"\n" {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, errs, out)
	}
}

// status prints what the daemon's socket answers, one screen: the problem
// with its evidence first, repairs, the kernel log reader, the reporting.
// Exit 1 while a condition is True; 2, saying so, when no daemon answers.
func TestStatusCommand(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	if code, _, errs := run(t, "status", "--socket", sock); code != exitError || !strings.Contains(errs, "the daemon is not running, or still starting: nothing answers on "+sock) {
		t.Errorf("no daemon: exit %d, %q", code, errs)
	}
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	st := daemon.StatusReport{
		Version: "v1", Node: "node-1", Role: "worker", PID: 42, Started: now.Add(-time.Hour), Now: now, Ready: true,
		Summary: "2 conditions: 1 ok, 1 problem (KubeletUnhealthy)",
		Conditions: []daemon.ConditionStatus{
			{Condition: report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: "FilesystemsBelowThreshold", Message: "/ 40% of space used", LastTransitionTime: now.Add(-time.Hour), LastUpdateTime: now.Add(-10 * time.Second)}, Source: "check"},
			{Condition: report.Condition{Type: "KubeletUnhealthy", Status: report.StatusTrue, Reason: "KubeletHealthzFailed", Message: "GET /healthz: HTTP 500", LastTransitionTime: now.Add(-5 * time.Minute), LastUpdateTime: now.Add(-time.Second)}, Source: "check",
				Evidence: map[string]any{"services.services": []any{map[string]any{"name": "kubelet.service", "activeState": "active", "restarts": 3}},
					// A name anyone chose: its C1 control (CSI) as a \u escape, not raw.
					"tamper.tamper": []any{map[string]any{"path": "/etc/cni/net.d/\u009b2J\x7f"}}}},
		},
		Repairs: map[string]checks.RepairStatus{"kubelet.service": {Repairs: 2, LastRepair: now.Add(-4 * time.Minute), LastReason: "GET /healthz: HTTP 500", LastResult: "done", Consecutive: 2}},
		Kmsg:    &daemon.KmsgStatus{Device: "/dev/kmsg", Reading: true, LastRecord: &daemon.KmsgRecord{Seq: 77, Usec: 9595061701, Time: now.Add(-2 * time.Second)}, Records: 1200, Lost: 3},
		Kubernetes: daemon.KubernetesStatus{State: "reporting", Detail: "to https://10.0.0.1:6443 as node node-1",
			Reporting: kube.Reporting{StatusPending: true, EventsQueued: 2, Calls: map[string]kube.CallStatus{
				"status": {LastSuccess: now.Add(-3 * time.Minute), LastError: "connection refused", LastErrorAt: now.Add(-time.Second), Failing: true}}}},
		Config: daemon.ConfigStatus{File: "/etc/autopilot-health/config.toml", Since: now.Add(-time.Hour), LastReload: &daemon.ReloadOutcome{
			At: now.Add(-time.Minute), Result: "refused", Error: "/etc/autopilot-health/config.toml:12: key checks.DiskUsageHigh.space_percnt: unknown key"}},
		Metrics: daemon.MetricsStatus{Address: ":20257", Error: "listen tcp :20257: bind: address already in use", FailingSince: now.Add(-time.Hour), Attempts: 64},
	}
	body, _ := json.Marshal(st)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != daemon.StatusPath {
			http.NotFound(w, r)
			return
		}
		w.Write(body)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	code, out, errs := run(t, "status", "--socket", sock)
	for _, want := range []string{
		"autopilot-health v1 on node node-1 (worker), pid 42, running since",
		"Status: 2 conditions: 1 ok, 1 problem (KubeletUnhealthy)",
		"KubeletUnhealthy=True (KubeletHealthzFailed) since",
		"  GET /healthz: HTTP 500",
		`  evidence services.services: [{"activeState":"active","name":"kubelet.service","restarts":3}]`,
		`  evidence tamper.tamper: [{"path":"/etc/cni/net.d/\u009b2J\u007f"}]`,
		"  kubelet.service: 2 repairs, last ",
		": restart done (GET /healthz: HTTP 500), 2 in a row",
		"Kernel log: reading /dev/kmsg, last record #77 at 9595.061701 s after boot",
		"; 1200 records, 3 lost, 0 reopens",
		"Metrics: NOT serving on :20257 since ",
		" ago), 64 failed binds, retrying with backoff: listen tcp :20257: bind: address already in use\n",
		"Configuration: /etc/autopilot-health/config.toml, in effect since ",
		"  last reload 2026-12-02 ",
		" REFUSED (running on the previous configuration): /etc/autopilot-health/config.toml:12: key checks.DiskUsageHigh.space_percnt: unknown key\n",
		"Kubernetes: reporting (to https://10.0.0.1:6443 as node node-1)",
		"pending: the conditions, 2 events",
		"  status: last error ",
		"FAILING: connection refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	// The problem first in the table.
	if strings.Index(out, "KubeletUnhealthy") > strings.Index(out, "DiskUsageHigh") {
		t.Error("the True condition is not listed first")
	}
	if code != exitProblem || errs != "" || t.Failed() {
		t.Errorf("exit %d, stderr %q, output:\n%s", code, errs, out)
	}
	// --json: the document, its C1 control and DEL as \u escapes also from
	// a daemon that wrote them raw (one started before an upgrade).
	code, out, _ = run(t, "status", "--json", "--socket", sock)
	if bad := rawControls(out); len(bad) > 0 || code != exitProblem || out != string(report.PrintableJSON(body)) {
		t.Errorf("--json: exit %d, raw %v, %s", code, bad, out)
	}
}

func TestTamperCommands(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\ncontrol_socket = %q\n[checks.SealedOSTampered]\ndm_control = %q\n",
		dir, filepath.Join(dir, "control.sock"), filepath.Join(dir, "control"))), 0o644)
	for _, tc := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"tamper", "clear", "--config", cfg}, exitError, "--reason is required"},
		{[]string{"tamper", "clear", "--config", cfg, "--reason", "x"}, exitError, "the daemon is not running, or still starting or stopping (no control socket at " + filepath.Join(dir, "control.sock")},
		{[]string{"tamper", "layers", "--config", cfg}, exitError, "no device-mapper control node"},
		{[]string{"tamper", "nope"}, exitError, `unknown command "nope"`},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr, tc.code, tc.stderr)
		}
	}
	code, stdout, _ := run(t, "tamper", "status", "--config", cfg)
	if code != exitOK || !strings.Contains(stdout, `"state": "none yet`) {
		t.Errorf("tamper status without a state: %d %s", code, stdout)
	}
	// With a state: the findings and the tolerated changes (known writers)
	// apart.
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := tamper.State{}
	st.AddFinding(tamper.Finding{Condition: tamper.CondNode, Path: "/etc/kubernetes/kubelet.conf", Kind: tamper.Modified, At: at, BootID: "b"})
	st.AddTolerated(tamper.Finding{Path: "/etc/containerd/config.toml", Kind: tamper.Modified, At: at, BootID: "b"})
	raw, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tamper.StatePath(dir), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ = run(t, "tamper", "status", "--config", cfg)
	var got struct {
		Findings, Tolerated []tamper.Finding
	}
	if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil ||
		len(got.Findings) != 1 || got.Findings[0].Path != "/etc/kubernetes/kubelet.conf" ||
		len(got.Tolerated) != 1 || got.Tolerated[0].Path != "/etc/containerd/config.toml" {
		t.Errorf("tamper status: %d %v %s", code, err, stdout)
	}
}

// tamper status reads tamper.json, which whoever can write state_dir can
// rewrite while the daemon runs (it keeps its state in memory and saves it
// only on a change): it also prints the daemon's own tamper conditions
// (status socket) and warns when the daemon holds a True whose findings
// the file no longer has, and says that the file's clear is not verified.
func TestTamperStatusAgainstTheDaemon(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "status.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\n[status]\nsocket = %q\n", dir, sock)), 0o644)
	// The file as an attacker left it: no finding, a clear.
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	forged := tamper.State{Cleared: &tamper.Clear{At: at, Reason: "INC-1 reviewed", By: "sudo user alice"}}
	raw, _ := forged.Marshal()
	if err := os.WriteFile(tamper.StatePath(dir), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// No daemon: said so.
	code, stdout, _ := run(t, "tamper", "status", "--config", cfg)
	if code != exitOK || !strings.Contains(stdout, `"daemon": "the daemon is not running`) {
		t.Errorf("without a daemon: %d %s", code, stdout)
	}
	st := daemon.StatusReport{Conditions: []daemon.ConditionStatus{
		{Condition: report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged, Message: "1 finding(s): /etc/kubernetes/kubelet.conf modified"}},
		{Condition: report.Condition{Type: "KubeletUnhealthy", Status: report.StatusTrue, Reason: "KubeletHealthzFailed"}},
	}}
	body, _ := json.Marshal(st)
	serveStatusBody(t, sock, body)
	code, stdout, _ = run(t, "tamper", "status", "--config", cfg)
	var got struct {
		Daemon  map[string]report.Condition
		Warning string
		Cleared *tamper.Clear
		Note    string
	}
	if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil {
		t.Fatalf("tamper status: %d %v %s", code, err, stdout)
	}
	if c := got.Daemon["NodeTampered"]; c.Status != report.StatusTrue || len(got.Daemon) != 1 {
		t.Errorf("daemon: %+v, want NodeTampered True alone", got.Daemon)
	}
	if !strings.Contains(got.Warning, "the daemon holds NodeTampered True, but tamper.json has no finding of it") {
		t.Errorf("warning %q", got.Warning)
	}
	if got.Cleared == nil || !strings.Contains(got.Note, "not verified") {
		t.Errorf("cleared %+v, note %q", got.Cleared, got.Note)
	}
}

// A tamper.json that does not parse (rewritten by hand: here a baseline
// whose digest does not match) is said, on stderr and in the output, and
// the running daemon's tamper conditions are printed all the same, with
// the warning that the file has no finding of the True it holds; exit 1
// (a problem found, the command ran). Before, the command exited 2 with
// the parse error alone, and the operator did not see the daemon's
// conditions, which are what counts.
func TestTamperStatusOfAFileThatDoesNotParse(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "status.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\n[status]\nsocket = %q\n", dir, sock)), 0o644)
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	good := tamper.State{Baseline: tamper.NewBaseline("b", at, tamper.Spec{Patterns: []string{"/etc/kubernetes/kubelet.conf"}},
		[]tamper.Entry{{Path: "/etc/kubernetes/kubelet.conf", Kind: tamper.KindFile, Mode: 0o600, Size: 3, SHA256: strings.Repeat("a", 64)}})}
	raw, err := good.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.Replace(string(raw), good.Baseline.Digest, "sha256:"+strings.Repeat("0", 64), 1)
	if forged == string(raw) {
		t.Fatal("the digest is not in the file")
	}
	if err := os.WriteFile(tamper.StatePath(dir), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	st := daemon.StatusReport{Conditions: []daemon.ConditionStatus{
		{Condition: report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged, Message: "1 finding(s): /etc/kubernetes/kubelet.conf modified"}},
		{Condition: report.Condition{Type: "SealedOSTampered", Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck}},
	}}
	body, _ := json.Marshal(st)
	serveStatusBody(t, sock, body)
	code, stdout, stderr := run(t, "tamper", "status", "--config", cfg)
	var got struct {
		State   string
		Daemon  map[string]report.Condition
		Warning string
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("tamper status: exit %d, stdout %q (%v), stderr %q; want the daemon's conditions", code, stdout, err, stderr)
	}
	if code != exitProblem || !strings.Contains(stderr, "digest") {
		t.Errorf("exit %d, stderr %q; want %d and the parse problem", code, stderr, exitProblem)
	}
	if !strings.HasPrefix(got.State, "unreadable: ") || !strings.Contains(got.State, "digest") {
		t.Errorf("state %q; want the parse problem", got.State)
	}
	if c := got.Daemon["NodeTampered"]; c.Status != report.StatusTrue || len(got.Daemon) != 2 {
		t.Errorf("daemon: %+v; want NodeTampered True and SealedOSTampered", got.Daemon)
	}
	if !strings.Contains(got.Warning, "the daemon holds NodeTampered True, but tamper.json has no finding of it") {
		t.Errorf("warning %q", got.Warning)
	}
}

// kmsg rules prints a table and takes no argument: `kmsg rules --json | jq`
// and `kmsg rules garbage` are bad usage (exit 2, nothing on stdout), not a
// table that exits 0.
func TestKmsgRulesRefusesJSONAndArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kmsg", "rules", "--config", "/dev/null", "--json"}, "flag provided but not defined: -json\nUsage: autopilot-health kmsg rules [--config FILE]"},
		{[]string{"kmsg", "rules", "--config", "/dev/null", "garbage"}, "autopilot-health kmsg rules: unexpected argument \"garbage\"\n"},
	} {
		code, out, errs := run(t, tc.args...)
		if code != exitError || out != "" || !strings.HasPrefix(errs, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", tc.args, code, out, errs, tc.want)
		}
	}
	if _, _, help := run(t, "kmsg", "rules", "--help"); strings.Contains(help, "-json") {
		t.Errorf("kmsg rules --help offers --json:\n%s", help)
	}
}

// A condition in --only that is not the catalog's is bad usage, and the
// error names what is valid: the condition a case slip meant, or else the
// catalog's conditions, so the operator does not have to run another
// command to find the spelling.
func TestCheckOnlyNamesTheValidConditions(t *testing.T) {
	code, out, errs := run(t, "check", "--only", "DiskUsageHigh,diskusagehigh", "--config", "/dev/null")
	if want := "autopilot-health check: --only: unknown condition \"diskusagehigh\": did you mean DiskUsageHigh?\n"; code != exitError || out != "" || errs != want {
		t.Errorf("case slip: exit %d, stdout %q, stderr %q; want %q", code, out, errs, want)
	}
	code, out, errs = run(t, "check", "--only", "DiskFull", "--config", "/dev/null")
	if code != exitError || out != "" || !strings.HasPrefix(errs, "autopilot-health check: --only: unknown condition \"DiskFull\"; the conditions are: ") {
		t.Errorf("unknown: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	for _, c := range report.Conditions {
		if !strings.Contains(errs, c.Type) {
			t.Errorf("the error does not name %s: %q", c.Type, errs)
		}
	}
}

// A clear the daemon applied but could not save (or whose re-evaluation
// did not come within its wait) exits 1, not 2: 2 says the command could
// not run, and a script that reads it so would take the clear for not
// applied. The conditions the daemon sent back are printed before the
// error.
func TestTamperClearAppliedButNotSavedExitsOne(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "control.sock")
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\ncontrol_socket = %q\n", dir, sock)), 0o644)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var req daemon.ControlRequest
		json.NewDecoder(c).Decode(&req)
		json.NewEncoder(c).Encode(daemon.ControlAnswer{
			Error:      "cleared, but not saved: open /var/lib/autopilot-health/tamper.json.tmp1: read-only file system",
			Conditions: []report.Condition{{Type: "NodeTampered", Status: report.StatusFalse, Reason: report.ReasonNodeIntact, Message: "baseline retaken"}},
		})
	}()
	code, stdout, stderr := run(t, "tamper", "clear", "--config", cfg, "--reason", "INC-3")
	if code != exitProblem || !strings.Contains(stdout, "NodeTampered\tFalse") || !strings.Contains(stderr, "cleared, but not saved") {
		t.Errorf("exit %d, stdout %q, stderr %q; want %d, the conditions, the error", code, stdout, stderr, exitProblem)
	}
}

// evil is a file name an attacker chose: an OSC that retitles the terminal
// (ESC ... BEL), a C1 CSI and a right-to-left override.
const evil = "/etc/cni/net.d/\x1b]0;pwn\x07\u009b2J\u202e.conflist"

// rawControls reports what in out a terminal would act on: an ESC, a BEL,
// a C1 control or DEL, a bidi override.
func rawControls(out string) []string {
	var bad []string
	for _, c := range []string{"\x1b", "\x07", "\x7f", "\u009b", "\u202e"} {
		if strings.Contains(out, c) {
			bad = append(bad, fmt.Sprintf("%q", c))
		}
	}
	return bad
}

// tamper status prints the findings' file names, which whoever creates a
// file under a protected directory chooses: as JSON \u escapes, the same
// value, not raw C1 controls or bidi overrides.
func TestTamperStatusIsPrintable(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("state_dir = %q\n[status]\nsocket = \"\"\n", dir)), 0o644)
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := tamper.State{}
	st.AddFinding(tamper.Finding{Condition: tamper.CondNode, Path: evil, Kind: tamper.Added, At: at, BootID: "b"})
	st.AddTolerated(tamper.Finding{Path: evil, Kind: tamper.Added, At: at, BootID: "b"})
	raw, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tamper.StatePath(dir), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := run(t, "tamper", "status", "--config", cfg)
	if bad := rawControls(stdout); len(bad) > 0 {
		t.Errorf("tamper status holds %s raw:\n%q", strings.Join(bad, ", "), stdout)
	}
	if !strings.Contains(stdout, `"path": "/etc/cni/net.d/\u001b]0;pwn\u0007\u009b2J\u202e.conflist"`) {
		t.Errorf("the path is not written with \\u escapes:\n%s", stdout)
	}
	var got struct{ Findings, Tolerated []tamper.Finding }
	if err := json.Unmarshal([]byte(stdout), &got); code != exitOK || err != nil ||
		len(got.Findings) != 1 || got.Findings[0].Path != evil || len(got.Tolerated) != 1 || got.Tolerated[0].Path != evil {
		t.Errorf("tamper status: exit %d, %v, findings %+v, tolerated %+v", code, err, got.Findings, got.Tolerated)
	}
}

// status prints a repair's reason, the kubelet's /healthz answer (whatever
// answers on its port while it is down): its control characters, C1
// controls and bidi overrides as \xNN, as a condition's message has them.
func TestStatusRepairReasonIsPrintable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	reason := "GET http://127.0.0.1:10248/healthz: HTTP 500: \x1b]0;pwn\x07\u009b2J\u202e"
	st := daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Now: now, Started: now,
		Repairs: map[string]checks.RepairStatus{"kubelet.service": {Repairs: 1, LastRepair: now, LastReason: reason, LastResult: "failed", Consecutive: 1,
			LastAttempt: now, LastAttemptError: "restart kubelet.service: " + reason}}}
	body, _ := json.Marshal(st)
	serveStatusBody(t, sock, body)
	_, out, _ := run(t, "status", "--socket", sock)
	if bad := rawControls(out); len(bad) > 0 {
		t.Errorf("status holds %s raw:\n%q", strings.Join(bad, ", "), out)
	}
	for _, want := range []string{
		`: restart failed (GET http://127.0.0.1:10248/healthz: HTTP 500: \x1b]0;pwn\x07\xc2\x9b2J\xe2\x80\xae), 1 in a row`,
		`could not start: restart kubelet.service: GET http://127.0.0.1:10248/healthz: HTTP 500: \x1b]0;pwn\x07\xc2\x9b2J\xe2\x80\xae` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// The other free text status prints (an API call's last error, which an
// API server or a webhook words; the metrics bind error; a refused
// reload's error; the Kubernetes detail) is printed with \xNN escapes too,
// as conditions' messages and repairs' reasons are.
func TestStatusOtherTextIsPrintable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	bad := "\x1b]0;pwn\x07\u009b2J\u202e"
	st := daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Now: now, Started: now,
		Kubernetes: daemon.KubernetesStatus{State: "reporting", Detail: "to https://10.0.0.1:6443 " + bad,
			Reporting: kube.Reporting{Calls: map[string]kube.CallStatus{
				"status": {LastError: "admission webhook denied: " + bad, LastErrorAt: now, Failing: true}}}},
		Config: daemon.ConfigStatus{File: "/etc/autopilot-health/config.toml", Since: now, LastReload: &daemon.ReloadOutcome{
			At: now, Result: "refused", Error: "config.toml:1: " + bad}},
		Metrics: daemon.MetricsStatus{Address: ":20257", Error: "listen tcp " + bad, FailingSince: now, Attempts: 1},
	}
	body, _ := json.Marshal(st)
	serveStatusBody(t, sock, body)
	_, out, _ := run(t, "status", "--socket", sock)
	if raw := rawControls(out); len(raw) > 0 {
		t.Errorf("status holds %s raw:\n%q", strings.Join(raw, ", "), out)
	}
	if n := strings.Count(out, `\x1b]0;pwn\x07\xc2\x9b2J\xe2\x80\xae`); n != 4 {
		t.Errorf("%d escaped texts, want 4 (API error, bind error, reload error, detail):\n%s", n, out)
	}
}

// serveStatusBody answers every request on the unix socket sock with body,
// as a daemon's status socket would, until the test ends.
func serveStatusBody(t *testing.T, sock string, body []byte) {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// A read that fails for a reason that passes, and then succeeds while run
// tries again, starts the daemon with the file (here as far as the control
// socket another daemon holds, exit 1): the path is a link to
// /proc/self/mem (EIO) repointed to a good file during the first wait.
func TestRunReadsAgainAFileThatCouldNotBeRead(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte(heldSocketConfig(t, dir)), 0o644)
	link := filepath.Join(dir, "config.toml")
	if err := os.Symlink("/proc/self/mem", link); err != nil {
		t.Fatal(err)
	}
	waits := 0
	oldWaits, oldSleep := readRetryWaits, readRetrySleep
	readRetryWaits = []time.Duration{time.Second, time.Second, time.Second}
	readRetrySleep = func(time.Duration) {
		if waits++; waits == 1 {
			os.Remove(link)
			os.Symlink(good, link)
		}
	}
	t.Cleanup(func() { readRetryWaits, readRetrySleep = oldWaits, oldSleep })
	code, _, errs := run(t, "run", "--config", link)
	if code != exitProblem || waits != 1 || !strings.Contains(errs, "trying again") ||
		strings.Contains(errs, "could not start: cannot read") || !strings.Contains(errs, "another daemon is listening") {
		t.Errorf("exit %d after %d waits, stderr %q; want the file read on the second try and started (exit 1: the control socket is taken)", code, waits, errs)
	}
}

// heldSocketConfig is a good configuration file's text whose state and
// control socket are in dir, the socket held by a listener of the test's
// (another daemon): run goes as far as daemon.New and exits 1 there.
func heldSocketConfig(t *testing.T, dir string) string {
	t.Helper()
	sock := filepath.Join(dir, "control.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return fmt.Sprintf("state_dir = %q\ncontrol_socket = %q\n[metrics]\nlisten_address = %q\n", dir, sock, freeMetricsAddress(t))
}

// freeMetricsAddress is a loopback address with a port free now, for a
// daemon's metrics.listen_address (the configuration refuses port 0,
// which Prometheus could never find). Taken meanwhile by another
// program, it only delays the metrics: the daemon starts without the
// listener and retries the bind. A test that waits for the daemon to run
// waits for either line ("serving metrics", "starting without the
// metrics listener"; TestStopWithUnwritableStateDirExitsZero).
func freeMetricsAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// `make fuzz` runs every fuzz target of the module (README: "each parser"):
// a Fuzz function added without its line in the Makefile was never fuzzed
// but by its seeds (seven were so).
func TestMakeFuzzRunsEveryFuzzTarget(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{} // target -> package
	for _, m := range regexp.MustCompile(`test (\./\S+) -run '\^\$\$' -fuzz '\^(Fuzz\w+)\$\$'`).FindAllStringSubmatch(string(mk), -1) {
		listed[m[2]] = m[1]
	}
	found := 0
	for name, pkgs := range declaredTests(t) {
		if !strings.HasPrefix(name, "Fuzz") {
			continue
		}
		for _, pkg := range pkgs {
			found++
			if got, ok := listed[name]; !ok {
				t.Errorf("%s (%s) is not in the Makefile's fuzz target", name, pkg)
			} else if got != pkg {
				t.Errorf("the Makefile fuzzes %s in %s, it is in %s", name, got, pkg)
			}
		}
	}
	if found < 20 {
		t.Errorf("found %d fuzz targets in the module; the walk is broken", found)
	}
}

// While the daemon's metrics listener is bound but its accepts have failed
// in a row for 10 s or more (EMFILE, ENOMEM), status says it is not
// accepting connections, since when, how many, and why (escaped), not
// "serving" (before, it said "Metrics: serving").
func TestStatusSaysFailedAccepts(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "status.sock")
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	st := daemon.StatusReport{Version: "v1", Node: "node-1", PID: 42, Now: now, Started: now,
		Config: daemon.ConfigStatus{File: "/etc/autopilot-health/config.toml", Since: now},
		Metrics: daemon.MetricsStatus{Address: "[::]:20257", Serving: true,
			AcceptError: "accept tcp [::]:20257: accept4: too many open files\x1b[2J", AcceptFailingSince: now.Add(-time.Minute), FailedAccepts: 62},
	}
	body, _ := json.Marshal(st)
	serveStatusBody(t, sock, body)
	_, out, _ := run(t, "status", "--socket", sock)
	for _, want := range []string{
		"Metrics: NOT accepting connections on [::]:20257 since ",
		" ago), 62 failed accepts in a row, retrying with backoff: accept tcp [::]:20257: accept4: too many open files\\x1b[2J\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Metrics: serving") {
		t.Errorf("status says serving while accepts fail:\n%s", out)
	}
}

// An empty capture (dmesg as a user that kernel.dmesg_restrict refuses
// prints nothing on stdout) is no error: nothing read, said so, exit 0;
// with --json nothing at all. (Held.)
func TestKmsgReplayEmptyInput(t *testing.T) {
	code, out, errs := run(t, "kmsg", "replay", "--config", "/dev/null", "/dev/null")
	if code != exitOK || out != "" || errs != "0 lines read, 0 skipped, 0 actions\n" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = run(t, "kmsg", "replay", "--json", "--config", "/dev/null", "/dev/null")
	if code != exitOK || out != "" || errs != "" {
		t.Errorf("--json: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
