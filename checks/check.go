// Package checks holds the custom checks, one file per check, and the one
// runner that schedules them. A check only probes: it reads the host through
// its Env and returns a Result; the runner owns intervals, timeouts, panics
// and the condition state.
package checks

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// Result is what one probe found.
type Result struct {
	Status  report.Status
	Reason  report.Reason
	Message string
	// Details are fields of the health report this probe collected.
	Details []report.Detail
}

// Check probes one condition. Probe must honour ctx; the runner gives up on it
// at the check's timeout either way.
type Check interface {
	Probe(ctx context.Context) (Result, error)
}

// Factory builds a check for this host. An error means the check cannot run
// here (bad configuration that validation could not catch).
type Factory func(env *Env) (Check, error)

// Sys is the set of system calls checks use, injectable for tests.
type Sys interface {
	Statfs(path string, st *unix.Statfs_t) error
	Adjtimex(tx *unix.Timex) (state int, err error)
	// SinceBoot is the time since the kernel booted (CLOCK_BOOTTIME: steps
	// of the wall clock do not move it).
	SinceBoot() (time.Duration, error)
}

type realSys struct{}

func (realSys) Statfs(path string, st *unix.Statfs_t) error { return unix.Statfs(path, st) }
func (realSys) Adjtimex(tx *unix.Timex) (int, error)        { return unix.Adjtimex(tx) }
func (realSys) SinceBoot() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}

// RealSys returns the host's system calls.
func RealSys() Sys { return realSys{} }

// Env is everything a check may use to reach the host.
type Env struct {
	Config   *config.Config
	NodeName string
	Role     report.Role
	GPU      bool
	Log      *slog.Logger
	Sys      Sys
	Now      func() time.Time
	// Systemd reaches systemd over D-Bus; nil where it is not reachable.
	Systemd systemd.Manager
	// Repair restarts critical units in place.
	Repair *Repairer
	// NVMe reads NVMe drives; nil means the real ioctls on this host.
	NVMe NVMe
	// LVM runs LVM's report commands; nil means the host's lvm binary
	// (checks.DiskUsageHigh.lvm_command), used only when host_root is "/".
	LVM LVM
	// Units counts the restarts of the critical units that the readers of
	// their properties observe (syself_node_unit_restarts{unit}), and keeps
	// ServiceNotRecovering's baseline; nil: that check keeps its own,
	// without metrics or state (the one-shot check).
	Units *UnitWatch
	// Memos keeps a check's small values in the state file for this boot
	// (the daemon's condition store); nil: nothing is kept (the one-shot
	// check).
	Memos Memos
	// BootID is the kernel's boot ID (/proc/sys/kernel/random/boot_id).
	BootID string
	// GPUsSeen are the NVIDIA GPUs seen on PCI in this boot (kept in the
	// state file); nil: only the GPUs on PCI now are known (the one-shot
	// check).
	GPUsSeen *GPUsSeen
	// Tamper keeps the tamper checks' baseline and findings
	// (tamper.StateFileName in the state directory); nil: each tamper
	// check reads that file without writing it (the one-shot check).
	Tamper *tamper.Keeper
	// DM reads the device-mapper tables; nil means the ioctls on the
	// control node checks.SealedOSTampered.dm_control.
	DM tamper.DM
	// Helper does what needs privileges that the daemon's own unit does
	// not give it (internal/privileged: the NVMe admin commands, the LVM
	// reports, the device-mapper tables, the protected-path scan); nil:
	// this process does them. NVMe, LVM and DM, where set, come first.
	Helper Helper
	// Stuck keeps the calls that can hang (statfs, lvm, the NVMe admin
	// commands) for every check built from this Env and its copies, so a
	// reload or the three NVMe checks do not start a second call where one
	// hangs; nil: each check keeps its own (an Env built by hand).
	Stuck *StuckCalls
	// JournalFallbacks counts KubeletHeartbeatFailed's runs that read the
	// journal with journalctl, not natively
	// (autopilot_health_journal_fallbacks_total); nil: not counted (the
	// one-shot check).
	JournalFallbacks *JournalFallbacks
	// Malformed counts the lines of host input the readers skipped
	// because they could not parse them
	// (autopilot_health_malformed_lines_total); nil: not counted (the
	// one-shot check).
	Malformed *MalformedLines
}

// Helper is the privileged helper as the checks use it
// (privileged.Client).
type Helper interface {
	NVMeCommands
	LVMRunner
	DM(path string) tamper.DM
	ScanNoting(root string, spec tamper.Spec) ([]tamper.Entry, tamper.ScanNotes, error)
}

// scan reads the protected paths: through the helper where there is one;
// notes are what it skipped of its host input.
func (e *Env) scan(spec tamper.Spec) ([]tamper.Entry, tamper.ScanNotes, error) {
	if e.Helper != nil {
		return e.Helper.ScanNoting(e.Config.HostRoot, spec)
	}
	return tamper.ScanNoting(e.Config.HostRoot, spec)
}

// Path resolves an absolute host path under the configured host root, its
// symbolic links resolved as the host resolves them (hostio.InRoot: the
// host's /var/run -> /run leads to <host_root>/run, not the daemon's own
// /run). With host_root "/" it is p, with no system call.
func (e *Env) Path(p string) string {
	return hostio.InRoot(e.Config.HostRoot, p)
}

// PathNoFollow is Path of p's directory with p's last name as it is
// (hostio.InRootNoFollow): for a reader that refuses a symbolic link there.
func (e *Env) PathNoFollow(p string) string {
	return hostio.InRootNoFollow(e.Config.HostRoot, p)
}

var registry = map[string]Factory{}

// Register adds the check for a condition type. It panics when the type is
// not in the catalog, is not evaluated by checks, or is registered twice.
func Register(condType string, f Factory) {
	d, ok := report.Lookup(condType)
	if !ok {
		panic(fmt.Sprintf("checks: Register(%q): not a condition in the catalog", condType))
	}
	if d.Source == report.SourceKmsg {
		panic(fmt.Sprintf("checks: Register(%q): a kernel-log condition, not a check", condType))
	}
	if _, dup := registry[condType]; dup {
		panic(fmt.Sprintf("checks: Register(%q): registered twice", condType))
	}
	registry[condType] = f
}

// NewForTest builds the registered check for a condition (integration tests
// probe one check directly against real systems).
func NewForTest(condType string, env *Env) (Check, error) {
	f, ok := registry[condType]
	if !ok {
		return nil, fmt.Errorf("no check for %s", condType)
	}
	return f(env)
}
