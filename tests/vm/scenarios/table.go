// Package scenarios is the VM tier's list of scenarios and the guest side
// that runs them: each scenario makes a fault happen for real on Debian's
// kernel inside QEMU and asserts what the daemon (autopilot-health run,
// started by the guest's /init) answers, from its own state file, its
// /metrics and `check --json`.
//
// To add a scenario: write func(g *Guest) error in a file of this package
// and add a line to All. Scenarios with the same Machine share one boot and
// run in the order of All; a scenario that needs other emulated hardware
// gets a Machine of its own (another boot, about 3 s).
package scenarios

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Machine is the emulated hardware a boot has: one NVMe drive (256 MiB,
// serial NVMeSerial) whose SMART critical-warning bits QEMU sets from
// power-on.
type Machine struct {
	NVMeCriticalWarning uint8
}

// NVMeSerial is the serial number QEMU gives the NVMe drive.
const NVMeSerial = "vmtest0001"

// Scenario is one fault and the daemon's answer to it.
type Scenario struct {
	Name    string
	Machine Machine
	// Modules are kernel modules the scenario loads itself (g.Modprobe),
	// beyond BaseModules; the initramfs carries them with their
	// dependencies.
	Modules []string
	Run     func(g *Guest) error
	// BeforeDaemon, where set, runs in the guest's setup before the daemon
	// starts (for a kernel line the daemon must find already logged at its
	// start); Run runs in the scenario's turn as any other. Its error (or panic) fails
	// the scenario, whose Run then does not run.
	BeforeDaemon func(g *Guest) error
}

// All scenarios. Within a boot they run in this order, and kernel
// conditions are held until reboot: a scenario that asserts a condition
// False comes before the one that sets it (or gets a Machine of its own).
var All = []Scenario{
	{Name: "nvme_healthy", Run: nvmeHealthy},
	{Name: "nvme_temperature", Run: nvmeTemperature},
	{Name: "nvme_warning_at_run_time", Run: nvmeWarningAtRunTime},
	{Name: "ext4_remount_ro", Run: ext4RemountRO},
	{Name: "sealed_os", Run: sealedOS},
	// In this boot, not dm_verity's: VerityCorruption is False here.
	{Name: "dm_verity_metadata", Run: dmVerityMetadata},
	// Before disk_io_errors: DisksFailure must be False, and the errors
	// of the NVMe over Fabrics namespace must not count.
	{Name: "nvme_fabrics_io_errors", Modules: []string{"nvmet", "nvmet-tcp", "nvme-tcp"}, Run: nvmeFabricsIOErrors},
	{Name: "disk_io_errors", Modules: []string{"sd_mod", "scsi_debug"}, Run: diskIOErrors},
	{Name: "nvme_critical_warning", Machine: criticalWarning, Run: nvmeCriticalWarning},
	// Its ext4 error is logged before the daemon starts: in a boot where
	// no scenario needs ReadonlyFilesystem False, nor Ext4Error's first
	// event (ext4_remount_ro's).
	{Name: "kmsg_before_start", Machine: criticalWarning, BeforeDaemon: remountBeforeStart, Run: kmsgBeforeStart},
	// These need no healthy drive: they share the boot of the critical
	// warning, which balances the two boots (the tier takes as long as the
	// longer one). DiskUsageHigh, KernelDeadlock and VerityCorruption do not
	// look at SMART.
	// Before lvm_usage: it needs DiskUsageHigh False first, and removes
	// its own volume group after.
	{Name: "lvm_thin_out_of_space", Machine: criticalWarning, Run: lvmThinOutOfSpace},
	{Name: "lvm_usage", Machine: criticalWarning, Run: lvmUsage},
	{Name: "hung_task", Machine: criticalWarning, Run: hungTask},
	// After hung_task, which reads its pod's kubelet's message from the
	// daemon's first TaskHung event: this one logs a TaskHung event too.
	{Name: "hung_task_warnings", Machine: criticalWarning, Run: hungTaskWarnings},
	{Name: "dm_verity", Machine: criticalWarning, Run: dmVerity},
	// Last in its boot: it turns the kernel log off for user space while
	// it runs (and puts it back).
	{Name: "devkmsg_off", Machine: criticalWarning, Run: devkmsgOff},
}

// Select is the scenarios of All that VMTEST_RUN names (only: names
// separated by commas; empty: all of them), in All's order; DeadlineProbe
// is a name too, booted apart by TestVM. A name that is no scenario is an
// error naming it: left out, a typo's scenario would not run and the tier
// would pass.
func Select(only string) ([]Scenario, error) {
	if only == "" {
		return slices.Clone(All), nil
	}
	var known []string
	for _, s := range All {
		known = append(known, s.Name)
	}
	names := strings.Split(only, ",")
	for _, n := range names {
		if n != DeadlineProbe && !slices.Contains(known, n) {
			return nil, fmt.Errorf("VMTEST_RUN=%s: no scenario named %q (scenarios: %s; and %s)", only, n, strings.Join(known, ", "), DeadlineProbe)
		}
	}
	return slices.DeleteFunc(slices.Clone(All), func(s Scenario) bool { return !slices.Contains(names, s.Name) }), nil
}

// criticalWarning is a drive reporting available spare below threshold and
// reliability degraded (QEMU's smart_critical_warning=0x05).
var criticalWarning = Machine{NVMeCriticalWarning: 0x05}

// BaseModules are loaded at boot, before the daemon starts (it reads the
// NVMe drive from its first run).
var BaseModules = []string{"nvme", "loop", "ext4", "crc32c_generic", "crc32c-intel", "dm-mod", "dm-verity", "dm-thin-pool"}

// Tools are the host programs the guest runs (with their libraries).
var Tools = []string{"/usr/sbin/veritysetup", "/usr/sbin/dmsetup", "/usr/sbin/lvm", "/usr/sbin/mke2fs"}

// DaemonPath, ConfigPath and StateFile are where the guest has the daemon.
// CheckConfigPath is the configuration of the one-shot `check` (longer
// timeouts: it reads the report once, whatever the load).
const (
	DaemonPath      = "/usr/bin/autopilot-health"
	ConfigPath      = "/etc/autopilot-health/config.toml"
	CheckConfigPath = "/etc/autopilot-health/check.toml"
	StateDir        = "/var/lib/autopilot-health"
	StateFile       = StateDir + "/state.json"
	DaemonLog       = "/run/autopilot-health.log"
	MetricsURL      = "http://127.0.0.1:20257/metrics"
)

// DaemonConfig is the daemon's configuration in the guest: standalone (no
// kubeconfig), the checks that need systemd, kubelet or a network off, and
// the disk checks and SealedOSTampered every few seconds so a scenario does
// not wait minutes (an LVM report takes 0.3-2 s under TCG, depending on the
// host's load: lvm_timeout 3 s each, and a timeout of three times that, as
// the configuration requires, since the check waits two thirds of its
// timeout for the two reports).
var DaemonConfig = guestConfig("2s", "9s", "3s")

// CheckConfig is the one-shot check's configuration in the guest.
var CheckConfig = guestConfig("30s", "30s", "10s")

func guestConfig(nvme, usage, lvm string) string {
	return `node_name = "vmtest"
role = "worker"
gpu = "false"
state_dir = "` + StateDir + `"

[log]
format = "text"
level = "debug"

[metrics]
listen_address = "127.0.0.1:20257"

[kubernetes]
kubeconfig = ""

[runner]
first_run_spread = "0s"

[checks.KubeletUnhealthy]
enabled = false
[checks.ContainerRuntimeUnhealthy]
enabled = false
[checks.ServiceNotRecovering]
enabled = false
[checks.KubeletHeartbeatFailed]
enabled = false
[checks.NodeServiceDown]
enabled = false
[checks.NodeInfoStale]
enabled = false
[checks.CertRenewalFailing]
enabled = false
[checks.ProxyNotServing]
enabled = false
[checks.CNIUnhealthy]
enabled = false
[checks.TunnelDisconnected]
enabled = false
[checks.GpuActivationFailed]
enabled = false
[checks.APIServerSourceIPUnavailable]
enabled = false
[checks.ClockNotSynchronized]
enabled = false

[checks.DisksFailure]
interval = "` + nvme + `"
timeout = "` + nvme + `"
[checks.DiskWearHigh]
interval = "` + nvme + `"
timeout = "` + nvme + `"
[checks.DiskTemperatureHigh]
interval = "` + nvme + `"
timeout = "` + nvme + `"
[checks.DiskUsageHigh]
interval = "` + usage + `"
timeout = "` + usage + `"
lvm_timeout = "` + lvm + `"

[checks.SealedOSTampered]
interval = "2s"
timeout = "2s"
`
}

// A boot's time limits. A scenario fails at its first wait that runs out
// (awaitCheck, awaitKmsg: 40 s each), so a daemon that never answers costs
// each scenario about one wait; the guest stops at its deadline whatever
// the scenarios do, and prints the daemon's log (the evidence of a broken
// daemon) before the host gives up on QEMU.
const (
	// setupBudget is the kernel up to /init, the base modules and the
	// daemon serving /metrics: 10.5 s measured at load 3.5, and TCG
	// slows down several times on a loaded machine.
	setupBudget = 60 * time.Second
	// scenarioBudget is one scenario's share of the guest's deadline:
	// one wait that runs out, and the work around it.
	scenarioBudget = 45 * time.Second
	// hostMargin is what the host waits past the guest's deadline: QEMU's
	// start before the kernel's clock starts (SeaBIOS and the loader:
	// 8.4 s measured at load 11.6), stopping the daemon (up to 5 s),
	// printing its log and powering off.
	hostMargin = 60 * time.Second
)

// Deadline is the guest's deadline for a boot running n scenarios (counted
// from the kernel's boot: vmtest.deadline) and the host's timeout for that
// QEMU run, which leaves the guest hostMargin to print the daemon's log.
func Deadline(n int) (guest, host time.Duration) {
	guest = setupBudget + time.Duration(n)*scenarioBudget
	return guest, guest + hostMargin
}
