// Package report holds the daemon's condition model: the catalog of every
// condition and event the daemon owns, the condition state with its
// transition times, and the Prometheus metrics. It has no Kubernetes imports;
// the Kubernetes edge lives in report/kube.
package report

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Status is a NodeCondition status.
type Status string

const (
	StatusTrue    Status = "True"
	StatusFalse   Status = "False"
	StatusUnknown Status = "Unknown"
)

// Disposition is what happens when a condition turns True (spec "Dispositions").
type Disposition string

const (
	Repair      Disposition = "repair"
	Alert       Disposition = "alert"
	Operability Disposition = "operability"
	Security    Disposition = "security"
)

// Source says which part of the daemon evaluates a condition.
type Source string

const (
	SourceCheck  Source = "check"
	SourceKmsg   Source = "kmsg"
	SourceTamper Source = "tamper"
)

// Scope says which nodes a condition or event applies to.
type Scope string

const (
	ScopeAll          Scope = "all"
	ScopeControlPlane Scope = "controlplane"
	ScopeWorker       Scope = "worker"
	ScopeGPU          Scope = "gpu"
)

// Role is the node's role in the cluster.
type Role string

const (
	RoleControlPlane Role = "controlplane"
	RoleWorker       Role = "worker"
)

// Applies reports whether a condition with this scope applies to a node.
func (s Scope) Applies(role Role, gpu bool) bool {
	switch s {
	case ScopeControlPlane:
		return role == RoleControlPlane
	case ScopeWorker:
		return role == RoleWorker
	case ScopeGPU:
		return gpu
	}
	return true
}

// Hold says how long a True condition is held once set.
type Hold string

const (
	// HoldWhileTrue: re-evaluated on every run; False as soon as the probe is healthy.
	HoldWhileTrue Hold = "while-true"
	// HoldUntilReboot: set by a kernel line and held for the rest of the boot.
	HoldUntilReboot Hold = "until-reboot"
	// HoldForever: stays set across reboots; a revert does not clear it.
	HoldForever Hold = "forever"
)

// TamperFindingRemovedLog is the warning logged, with the condition's
// reason, message and transition time, when a tamper finding (a True held
// forever) is taken off because its check is disabled (a reload, or a start
// that finds it in the state file or on the Node: once). The findings stay in tamper.json: the check's
// first run once it is enabled again sets the condition True from them.
const TamperFindingRemovedLog = "tamper finding removed: its check is disabled by the configuration; it is not cleared: its findings stay in tamper.json, " +
	"and the check's first run once it is enabled again sets the condition True from them, nothing changed again needed, with a new lastTransitionTime"

// Reason is a condition's reason: one of the constants below, each declared
// next to its catalog row, so a misspelt reason does not compile.
type Reason string

// Reasons that every condition may carry while it is Unknown.
const (
	ReasonNotImplemented Reason = "NotImplemented"
	ReasonDisabled       Reason = "Disabled"
	ReasonNotApplicable  Reason = "NotApplicable"
	ReasonCheckFailed    Reason = "CheckFailed"
	ReasonCheckTimeout   Reason = "CheckTimeout"
	ReasonCheckPanicked  Reason = "CheckPanicked"
	ReasonNoData         Reason = "NoData"
	// ReasonNothingToCheck: the check ran and found nothing on this node to
	// check (no configured certificate exists, no filesystem to measure); a
	// False would claim a health that nothing was measured for.
	ReasonNothingToCheck Reason = "NothingToCheck"
)

// UnknownReasons lists the reasons shared by all conditions for status Unknown.
var UnknownReasons = []Reason{ReasonCheckFailed, ReasonCheckTimeout, ReasonCheckPanicked, ReasonNotImplemented, ReasonDisabled, ReasonNotApplicable, ReasonNoData, ReasonNothingToCheck}

// ConditionDesc describes one condition the daemon owns.
type ConditionDesc struct {
	Type        string
	Source      Source
	Disposition Disposition
	// Interval is the spec's check interval; zero for kmsg conditions, which
	// are set by kernel lines as they arrive.
	Interval time.Duration
	Scope    Scope
	// Evaluated, when set, is the narrower scope where the condition can be
	// anything but Unknown: it is set on every node of Scope (the spec's),
	// and on the others it is always Unknown, NothingToCheck
	// (TunnelDisconnected: a control-plane node has no tunnel agent).
	Evaluated Scope `json:",omitempty"`
	Hold      Hold
	// HealthyReason is the reason carried with status False.
	HealthyReason Reason
	// ProblemReasons are the reasons carried with status True.
	ProblemReasons []Reason
	// UnknownReasons are the condition's own reasons for status Unknown,
	// besides the shared ones (the package's UnknownReasons).
	UnknownReasons []Reason
	// Parts, when set, are the sources that evaluate the condition
	// together, each its own part of it (DisksFailure: the kernel's disk I/O
	// errors in the kernel log monitor, NVMe SMART in a check); see
	// Store.SetPart. The row's Source is one of them.
	Parts []Part
	// Trigger is the spec's "how it is triggered", Cause its "how it can happen".
	Trigger string
	Cause   string
}

// Nodes says which nodes the condition is set on, for the catalog's
// readers: Scope, and where it is evaluated when that is narrower.
func (c ConditionDesc) Nodes() string {
	if c.Evaluated == "" || c.Evaluated == c.Scope {
		return string(c.Scope)
	}
	return fmt.Sprintf("%s, evaluated on %s nodes (`Unknown` on the others)", c.Scope, c.Evaluated)
}

// Part is one source's share of a condition that several sources evaluate.
type Part struct {
	// Name names the part in the store; the parts of a condition combine
	// in the row's order.
	Name   string
	Source Source
	// Reasons are the condition's problem reasons this part sets: each of
	// the row's ProblemReasons belongs to one part. A True taken over from
	// the Node is this part's when its reason is.
	Reasons []Reason
}

// Part returns the part of the condition that src evaluates, if the
// condition has parts and src is one of them.
func (c ConditionDesc) Part(src Source) (Part, bool) {
	i := slices.IndexFunc(c.Parts, func(p Part) bool { return p.Source == src })
	if i < 0 {
		return Part{}, false
	}
	return c.Parts[i], true
}

// EventDesc describes one event reason (temp rule) the daemon emits.
type EventDesc struct {
	Reason  string
	Source  Source
	Scope   Scope
	Trigger string
	// Operator: the event records an operator's action, not a problem
	// (TamperCleared). It is an Event on the Node, but problem_counter,
	// which counts problems (the spec's temp rules, and conditions
	// turning True), has no series for it.
	Operator bool `json:",omitempty"`
}

// The reasons of each condition, in catalog order, declared next to one
// another: the reason for status False first, then those for status True.
// The catalog rows below are built from them, and every check and the
// kernel monitor return them by name, so a misspelt reason does not
// compile (report/reasons_test.go: no reason is written as a literal, each
// is in a row, each row's reason is one of these, and each is returned).

// KubeletUnhealthy.
const (
	ReasonKubeletIsHealthy     Reason = "KubeletIsHealthy"
	ReasonKubeletHealthzFailed Reason = "KubeletHealthzFailed"
)

// ContainerRuntimeUnhealthy.
const (
	ReasonContainerRuntimeIsHealthy Reason = "ContainerRuntimeIsHealthy"
	ReasonCRIProbeFailed            Reason = "CRIProbeFailed"
)

// ServiceNotRecovering.
const (
	ReasonCriticalUnitsRecovering Reason = "CriticalUnitsRecovering"
	ReasonUnitFailed              Reason = "UnitFailed"
	ReasonUnitFlapping            Reason = "UnitFlapping"
	ReasonRepairNotHelping        Reason = "RepairNotHelping"
)

// KubeletHeartbeatFailed.
const (
	ReasonKubeletHeartbeatOK     Reason = "KubeletHeartbeatOK"
	ReasonNodeStatusUpdateGaveUp Reason = "NodeStatusUpdateGaveUp"
)

// DisksFailure.
const (
	ReasonDisksHealthy        Reason = "DisksHealthy"
	ReasonNVMeCriticalWarning Reason = "NVMeCriticalWarning"
	ReasonDiskIOErrors        Reason = "DiskIOErrors"
)

// DiskWearHigh.
const (
	ReasonDiskWearOK          Reason = "DiskWearOK"
	ReasonEnduranceMostlyUsed Reason = "EnduranceMostlyUsed"
)

// DiskTemperatureHigh.
const (
	ReasonDiskTemperatureOK         Reason = "DiskTemperatureOK"
	ReasonTemperatureAboveThreshold Reason = "TemperatureAboveThreshold"
)

// DiskUsageHigh.
const (
	ReasonDiskUsageOK          Reason = "DiskUsageOK"
	ReasonFilesystemSpaceHigh  Reason = "FilesystemSpaceHigh"
	ReasonFilesystemInodesHigh Reason = "FilesystemInodesHigh"
	ReasonVolumeGroupSpaceHigh Reason = "VolumeGroupSpaceHigh"
	ReasonThinPoolSpaceHigh    Reason = "ThinPoolSpaceHigh"
)

// NodeServiceDown.
const (
	ReasonNodeServicesActive Reason = "NodeServicesActive"
	ReasonUnitNotActive      Reason = "UnitNotActive"
)

// NodeInfoStale.
const (
	ReasonNodeInfoFresh    Reason = "NodeInfoFresh"
	ReasonNodeInfoOutdated Reason = "NodeInfoOutdated"
	ReasonNodeInfoMissing  Reason = "NodeInfoMissing"
	// ReasonNodeInfoInvalid: the file is not valid JSON (a torn write).
	ReasonNodeInfoInvalid Reason = "NodeInfoInvalid"
	// ReasonNodeInfoNotFound (Unknown): the file has not been written in
	// this boot (absent, or left by an earlier boot less than max_age + 10
	// minutes ago; after that an earlier boot's file is NodeInfoOutdated);
	// a node without the sync loop must not get a False or a True.
	ReasonNodeInfoNotFound Reason = "NodeInfoNotFound"
)

// CertRenewalFailing.
const (
	ReasonCertificatesValid       Reason = "CertificatesValid"
	ReasonCertificateExpiringSoon Reason = "CertificateExpiringSoon"
)

// ProxyNotServing.
const (
	ReasonProxyServing     Reason = "ProxyServing"
	ReasonProxyNotReady    Reason = "ProxyNotReady"
	ReasonProxyUnreachable Reason = "ProxyUnreachable"
)

// ClockNotSynchronized.
const (
	ReasonClockSynchronized   Reason = "ClockSynchronized"
	ReasonClockUnsynchronized Reason = "ClockUnsynchronized"
	ReasonClockErrorTooLarge  Reason = "ClockErrorTooLarge"
)

// CNIUnhealthy.
const (
	ReasonCNIHealthy        Reason = "CNIHealthy"
	ReasonCiliumNotOk       Reason = "CiliumNotOk"
	ReasonCiliumUnreachable Reason = "CiliumUnreachable"
)

// TunnelDisconnected.
const (
	ReasonTunnelConnected          Reason = "TunnelConnected"
	ReasonNoTunnelConnections      Reason = "NoTunnelConnections"
	ReasonTunnelMetricsUnreachable Reason = "TunnelMetricsUnreachable"
)

// GpuActivationFailed.
const (
	ReasonGpuActivated            Reason = "GpuActivated"
	ReasonActivationMarkerMissing Reason = "ActivationMarkerMissing"
	ReasonCDISpecMissing          Reason = "CDISpecMissing"
	// ReasonGpuGoneFromPCI (Unknown): a GPU seen on PCI earlier in this
	// boot is gone from it (fallen off the bus, its link down, removed):
	// whether it is activated cannot be checked, and the GPUs still there
	// being activated does not make the node's GPUs healthy.
	ReasonGpuGoneFromPCI Reason = "GpuGoneFromPCI"
)

// APIServerSourceIPUnavailable.
const (
	ReasonSourceIPAvailable      Reason = "SourceIPAvailable"
	ReasonSourceIPMissingInAudit Reason = "SourceIPMissingInAudit"
	// ReasonNoAuditRecords (Unknown): the window has no audit record of a
	// request by a user outside the cluster's own components (or there is
	// no audit log): nothing says whether client addresses are recorded.
	ReasonNoAuditRecords Reason = "NoAuditRecords"
)

// ReadonlyFilesystem.
const (
	ReasonFilesystemIsNotReadOnly Reason = "FilesystemIsNotReadOnly"
	ReasonFilesystemIsReadOnly    Reason = "FilesystemIsReadOnly"
)

// KernelDeadlock.
const (
	ReasonKernelHasNoDeadlock Reason = "KernelHasNoDeadlock"
	ReasonCriticalTaskHung    Reason = "CriticalTaskHung"
)

// VerityCorruption.
const (
	ReasonNoVerityCorruption   Reason = "NoVerityCorruption"
	ReasonVerityBlockCorrupted Reason = "VerityBlockCorrupted"
)

// CperHardwareErrorFatal.
const (
	ReasonNoFatalHardwareError Reason = "NoFatalHardwareError"
	ReasonFatalHardwareError   Reason = "FatalHardwareError"
)

// GpuFallenOffBus.
const (
	ReasonGpuOnBus      Reason = "GpuOnBus"
	ReasonGpuFellOffBus Reason = "GpuFellOffBus"
)

// SealedOSTampered.
const (
	ReasonSealedOSIntact      Reason = "SealedOSIntact"
	ReasonRootHashMismatch    Reason = "RootHashMismatch"
	ReasonSealedLayerMissing  Reason = "SealedLayerMissing"
	ReasonRecordedHashAltered Reason = "RecordedHashAltered"
)

// NodeTampered.
const (
	ReasonNodeIntact           Reason = "NodeIntact"
	ReasonProtectedFileChanged Reason = "ProtectedFileChanged"
	ReasonBaselineCorrupt      Reason = "BaselineCorrupt"
	// ReasonBaselinePending: this boot has no baseline yet (Unknown).
	ReasonBaselinePending Reason = "BaselinePending"
)

// Conditions is the catalog of every condition in the spec, in the spec's order.
var Conditions = []ConditionDesc{
	// Conditions from custom checks.
	{Type: "KubeletUnhealthy", Source: SourceCheck, Disposition: Repair, Interval: 10 * time.Second, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonKubeletIsHealthy, ProblemReasons: []Reason{ReasonKubeletHealthzFailed},
		Trigger: "kubelet /healthz fails", Cause: "kubelet hung, out of file descriptors, bad config, cert problem"},
	{Type: "ContainerRuntimeUnhealthy", Source: SourceCheck, Disposition: Repair, Interval: 10 * time.Second, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonContainerRuntimeIsHealthy, ProblemReasons: []Reason{ReasonCRIProbeFailed},
		Trigger: "containerd CRI probe fails", Cause: "containerd deadlocked, disk full, corrupt state"},
	{Type: "ServiceNotRecovering", Source: SourceCheck, Disposition: Alert, Interval: time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonCriticalUnitsRecovering, ProblemReasons: []Reason{ReasonUnitFailed, ReasonUnitFlapping, ReasonRepairNotHelping},
		Trigger: "a critical unit is failed, or restarted >=3x since the last run, or 3 of the daemon's own restarts of it in a row did not help", Cause: "repeated repair did not fix kubelet / containerd / proxy"},
	{Type: "KubeletHeartbeatFailed", Source: SourceCheck, Disposition: Alert, Interval: 5 * time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonKubeletHeartbeatOK, ProblemReasons: []Reason{ReasonNodeStatusUpdateGaveUp},
		Trigger: "kubelet logged an error meaning it gave up retrying node-status updates to the API server", Cause: "kubelet lost its API connection and could not re-establish it"},
	{Type: "DisksFailure", Source: SourceCheck, Disposition: Alert, Interval: 5 * time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonDisksHealthy, ProblemReasons: []Reason{ReasonNVMeCriticalWarning, ReasonDiskIOErrors},
		Trigger: "an NVMe SMART critical-warning bit other than the temperature bit (`DiskTemperatureHigh`'s) is set (ioctl), or the kernel logged 5 or more disk I/O errors in the last 10 minutes, not counting the devices of `kmsg.ignore_devices` (loop, device-mapper, nbd, Ceph RBD, ...) nor NVMe over Fabrics or iSCSI volumes", Cause: "a physical disk is wearing out or failing",
		// Two sources, each its own part: the kernel log monitor's I/O error window and the NVMe SMART check.
		Parts: []Part{{Name: "kernel-io-errors", Source: SourceKmsg, Reasons: []Reason{ReasonDiskIOErrors}},
			{Name: "nvme-smart", Source: SourceCheck, Reasons: []Reason{ReasonNVMeCriticalWarning}}}},
	{Type: "DiskWearHigh", Source: SourceCheck, Disposition: Operability, Interval: 30 * time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonDiskWearOK, ProblemReasons: []Reason{ReasonEnduranceMostlyUsed},
		Trigger: "an NVMe drive has used most of its rated write endurance", Cause: "a drive is approaching end of life"},
	{Type: "DiskTemperatureHigh", Source: SourceCheck, Disposition: Operability, Interval: 5 * time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonDiskTemperatureOK, ProblemReasons: []Reason{ReasonTemperatureAboveThreshold},
		Trigger: "an NVMe drive is past its temperature threshold", Cause: "a cooling or airflow problem"},
	{Type: "DiskUsageHigh", Source: SourceCheck, Disposition: Operability, Interval: 2 * time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonDiskUsageOK, ProblemReasons: []Reason{ReasonFilesystemSpaceHigh, ReasonFilesystemInodesHigh, ReasonVolumeGroupSpaceHigh, ReasonThinPoolSpaceHigh},
		Trigger: "statfs or LVM vgs over the space or inode threshold (LVM: volume group extents allocated, thin pool data or metadata used)", Cause: "logs, images, or data filled a filesystem"},
	{Type: "NodeServiceDown", Source: SourceCheck, Disposition: Operability, Interval: 30 * time.Second, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonNodeServicesActive, ProblemReasons: []Reason{ReasonUnitNotActive},
		Trigger: "an operability unit is not active", Cause: "the tunnel agent, server, or source-IP helper crashed and did not restart"},
	{Type: "NodeInfoStale", Source: SourceCheck, Disposition: Alert, Interval: time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonNodeInfoFresh, ProblemReasons: []Reason{ReasonNodeInfoOutdated, ReasonNodeInfoMissing, ReasonNodeInfoInvalid},
		UnknownReasons: []Reason{ReasonNodeInfoNotFound},
		Trigger:        "nodes.json is older than 5 minutes", Cause: "the node-info sync loop is stuck, often a CNI problem"},
	{Type: "CertRenewalFailing", Source: SourceCheck, Disposition: Alert, Interval: time.Hour, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonCertificatesValid, ProblemReasons: []Reason{ReasonCertificateExpiringSoon},
		Trigger: "a node certificate expires within 7 days and has not renewed", Cause: "the automatic renewer (kubelet rotation, tunnel self-renew) is broken"},
	{Type: "ProxyNotServing", Source: SourceCheck, Disposition: Operability, Interval: 30 * time.Second, Scope: ScopeWorker, Hold: HoldWhileTrue,
		HealthyReason: ReasonProxyServing, ProblemReasons: []Reason{ReasonProxyNotReady, ReasonProxyUnreachable},
		Trigger: "the proxy's ready gauge on http://127.0.0.1:9587/metrics is 0 or missing, or the endpoint is unreachable", Cause: "the local syself-proxy is down or has no valid target set"},
	{Type: "ClockNotSynchronized", Source: SourceCheck, Disposition: Alert, Interval: time.Minute, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonClockSynchronized, ProblemReasons: []Reason{ReasonClockUnsynchronized, ReasonClockErrorTooLarge},
		Trigger: "adjtimex reports unsynced, or estimated error > 5s", Cause: "NTP is broken and the clock is drifting"},
	{Type: "CNIUnhealthy", Source: SourceCheck, Disposition: Alert, Interval: 30 * time.Second, Scope: ScopeAll, Hold: HoldWhileTrue,
		HealthyReason: ReasonCNIHealthy, ProblemReasons: []Reason{ReasonCiliumNotOk, ReasonCiliumUnreachable},
		Trigger: "local cilium-agent health is not Ok, or its socket is unreachable", Cause: "the cilium-agent crashed or is degraded"},
	{Type: "TunnelDisconnected", Source: SourceCheck, Disposition: Operability, Interval: 30 * time.Second, Scope: ScopeAll, Evaluated: ScopeWorker, Hold: HoldWhileTrue,
		HealthyReason: ReasonTunnelConnected, ProblemReasons: []Reason{ReasonNoTunnelConnections, ReasonTunnelMetricsUnreachable},
		Trigger: "the tunnel connection count is 0 (the worker's tunnel agent)", Cause: "the reverse tunnel to the control plane dropped"},
	{Type: "GpuActivationFailed", Source: SourceCheck, Disposition: Operability, Interval: time.Minute, Scope: ScopeGPU, Hold: HoldWhileTrue,
		HealthyReason: ReasonGpuActivated, ProblemReasons: []Reason{ReasonActivationMarkerMissing, ReasonCDISpecMissing},
		UnknownReasons: []Reason{ReasonGpuGoneFromPCI},
		Trigger:        "an NVIDIA GPU is present but has no activation marker or CDI spec", Cause: "gpu-activate did not finish, so containerd cannot use the GPU"},
	{Type: "APIServerSourceIPUnavailable", Source: SourceCheck, Disposition: Alert, Interval: time.Minute, Scope: ScopeControlPlane, Hold: HoldWhileTrue,
		HealthyReason: ReasonSourceIPAvailable, ProblemReasons: []Reason{ReasonSourceIPMissingInAudit}, UnknownReasons: []Reason{ReasonNoAuditRecords},
		Trigger: "the API server's audit records stop carrying the real client IP", Cause: "KubeGate can no longer record the real client source IP; contact support"},

	// Conditions from the kernel monitor (kmsg).
	{Type: "ReadonlyFilesystem", Source: SourceKmsg, Disposition: Alert, Scope: ScopeAll, Hold: HoldUntilReboot,
		HealthyReason: ReasonFilesystemIsNotReadOnly, ProblemReasons: []Reason{ReasonFilesystemIsReadOnly},
		Trigger: "kernel: Remounting filesystem read-only, or an XFS shutdown or f2fs stop after an error (Shutting down filesystem, Stopped filesystem); not a pod's volume (its device mounted only under the kubelet's pods and plugins directories: a PodVolumeReadOnly event)", Cause: "the kernel hit an I/O or filesystem error and remounted read-only (XFS: shut the filesystem down; f2fs by default: stopped it) to protect data; writes now fail"},
	{Type: "KernelDeadlock", Source: SourceKmsg, Disposition: Alert, Scope: ScopeAll, Hold: HoldUntilReboot,
		HealthyReason: ReasonKernelHasNoDeadlock, ProblemReasons: []Reason{ReasonCriticalTaskHung},
		Trigger: "kernel: a critical process (kubelet, containerd, runc, crun, qemu and its vCPU threads, virtiofsd) blocked longer than the hung-task threshold; not a pod's own kubelet or containerd (its cgroup under kubepods, its PID namespace a container's: a TaskHung event)", Cause: "a critical process is wedged on stuck I/O or a kernel deadlock"},
	{Type: "VerityCorruption", Source: SourceKmsg, Disposition: Security, Scope: ScopeAll, Hold: HoldUntilReboot,
		HealthyReason: ReasonNoVerityCorruption, ProblemReasons: []Reason{ReasonVerityBlockCorrupted},
		Trigger: "kernel: device-mapper: verity: ... corrupt", Cause: "a block on the sealed read-only OS failed its dm-verity check (disk corruption or tampering)"},
	{Type: "CperHardwareErrorFatal", Source: SourceKmsg, Disposition: Alert, Scope: ScopeAll, Hold: HoldUntilReboot,
		HealthyReason: ReasonNoFatalHardwareError, ProblemReasons: []Reason{ReasonFatalHardwareError},
		Trigger: "kernel: firmware CPER event with severity: fatal", Cause: "a fatal hardware fault in CPU, memory, or PCIe reported by firmware"},
	{Type: "GpuFallenOffBus", Source: SourceKmsg, Disposition: Alert, Scope: ScopeGPU, Hold: HoldUntilReboot,
		HealthyReason: ReasonGpuOnBus, ProblemReasons: []Reason{ReasonGpuFellOffBus},
		Trigger: "kernel: NVRM: ... GPU has fallen off the bus", Cause: "a GPU dropped off the PCI bus due to power, heat, or a hardware fault"},

	// The tamper conditions.
	{Type: "SealedOSTampered", Source: SourceTamper, Disposition: Security, Interval: 5 * time.Minute, Scope: ScopeAll, Hold: HoldForever,
		HealthyReason: ReasonSealedOSIntact, ProblemReasons: []Reason{ReasonRootHashMismatch, ReasonSealedLayerMissing, ReasonRecordedHashAltered},
		Trigger: "a sealed OS layer's integrity hash no longer matches the hash recorded at provisioning", Cause: "a sealed layer was swapped for a different image, or its recorded hash was altered"},
	{Type: "NodeTampered", Source: SourceTamper, Disposition: Security, Interval: 5 * time.Minute, Scope: ScopeAll, Hold: HoldForever,
		HealthyReason: ReasonNodeIntact, ProblemReasons: []Reason{ReasonProtectedFileChanged, ReasonBaselineCorrupt}, UnknownReasons: []Reason{ReasonBaselinePending},
		Trigger: "a protected file (by default under /etc and /var/lib: the kubelet's, containerd's and CNI's configuration, static pods, systemd units, the recorded root hashes) was added, removed, or changed since the boot baseline", Cause: "a rogue pod, a bad config push, an operator edit, or a userspace rootkit"},
}

// Events is the catalog of every event reason (temp rule) in the spec.
var Events = []EventDesc{
	{Reason: "TaskHung", Source: SourceKmsg, Scope: ScopeAll, Trigger: "a task blocked longer than the hung-task threshold"},
	{Reason: "Ext4Error", Source: SourceKmsg, Scope: ScopeAll, Trigger: "EXT4-fs error"},
	{Reason: "Ext4Warning", Source: SourceKmsg, Scope: ScopeAll, Trigger: "EXT4-fs warning"},
	{Reason: "IOError", Source: SourceKmsg, Scope: ScopeAll, Trigger: "Buffer I/O error on a device"},
	{Reason: "BlockIOError", Source: SourceKmsg, Scope: ScopeAll, Trigger: "blk_update_request / I/O error on a block device"},
	{Reason: "NvmeError", Source: SourceKmsg, Scope: ScopeAll, Trigger: "nvme controller or I/O error"},
	{Reason: "AtaError", Source: SourceKmsg, Scope: ScopeAll, Trigger: "ATA bus or device error"},
	{Reason: "NvidiaXidError", Source: SourceKmsg, Scope: ScopeGPU, Trigger: "NVRM: Xid"},
	{Reason: "MemoryReadError", Source: SourceKmsg, Scope: ScopeAll, Trigger: "the EDAC core logged a memory error (corrected or uncorrected)"},
	{Reason: "UnregisterNetDevice", Source: SourceKmsg, Scope: ScopeAll, Trigger: "unregister_netdevice: waiting for a device to become free"},
	{Reason: "CperHardwareErrorCorrected", Source: SourceKmsg, Scope: ScopeAll, Trigger: "firmware CPER event with severity: corrected"},
	{Reason: "CperHardwareErrorRecoverable", Source: SourceKmsg, Scope: ScopeAll, Trigger: "firmware CPER event with severity: recoverable"},
	{Reason: EventPodVolumeReadOnly, Source: SourceKmsg, Scope: ScopeAll, Trigger: "a ReadonlyFilesystem line (remounted read-only, an XFS shutdown, an f2fs stop) on a device mounted only under the kubelet's pod volume directories (pods and plugins in kubelet_root_dir, /var/lib/kubelet by default): a pod's volume, not the node's filesystem, so not the condition"},
	{Reason: EventTamperCleared, Source: SourceTamper, Scope: ScopeAll, Operator: true, Trigger: "an operator cleared the tamper conditions (autopilot-health tamper clear)"},
}

// EventPodVolumeReadOnly is the event of a filesystem on a pod's volume
// that the kernel remounted read-only (or shut down, or stopped): the
// volume's problem, not ReadonlyFilesystem.
const EventPodVolumeReadOnly = "PodVolumeReadOnly"

// EventTamperCleared is the event of an operator's clear of the tamper
// conditions.
const EventTamperCleared = "TamperCleared"

var conditionIndex = func() map[string]int {
	m := make(map[string]int, len(Conditions))
	for i, c := range Conditions {
		if _, dup := m[c.Type]; dup {
			panic(fmt.Sprintf("report: duplicate condition %q in catalog", c.Type))
		}
		m[c.Type] = i
		if len(c.Parts) == 0 {
			continue
		}
		if _, ok := c.Part(c.Source); !ok || len(c.Parts) < 2 {
			panic(fmt.Sprintf("report: condition %q: its parts must be two or more, one of them its own source %s", c.Type, c.Source))
		}
		for j, p := range c.Parts {
			if p.Name == "" || slices.ContainsFunc(c.Parts[:j], func(q Part) bool { return q.Name == p.Name || q.Source == p.Source }) {
				panic(fmt.Sprintf("report: condition %q: part %q: a part needs a name, and parts differ in name and source", c.Type, p.Name))
			}
		}
		for _, r := range c.ProblemReasons {
			if n := len(slices.DeleteFunc(slices.Clone(c.Parts), func(p Part) bool { return !slices.Contains(p.Reasons, r) })); n != 1 {
				panic(fmt.Sprintf("report: condition %q: reason %s belongs to %d parts, not one", c.Type, r, n))
			}
		}
	}
	for _, e := range Events {
		if _, dup := m[e.Reason]; dup {
			panic(fmt.Sprintf("report: event reason %q collides with a condition type", e.Reason))
		}
	}
	return m
}()

// Lookup returns the catalog entry for a condition type.
func Lookup(condType string) (ConditionDesc, bool) {
	i, ok := conditionIndex[condType]
	if !ok {
		return ConditionDesc{}, false
	}
	return Conditions[i], true
}

// LookupEvent returns the catalog entry for an event reason.
func LookupEvent(reason string) (EventDesc, bool) {
	i := slices.IndexFunc(Events, func(e EventDesc) bool { return e.Reason == reason })
	if i < 0 {
		return EventDesc{}, false
	}
	return Events[i], true
}

// ValidReason reports whether reason is one the catalog allows for the
// condition with the given status.
func (c ConditionDesc) ValidReason(s Status, reason Reason) bool {
	switch s {
	case StatusFalse:
		return reason == c.HealthyReason
	case StatusTrue:
		return slices.Contains(c.ProblemReasons, reason)
	case StatusUnknown:
		return slices.Contains(UnknownReasons, reason) || slices.Contains(c.UnknownReasons, reason)
	}
	return false
}

// JoinReasons joins reasons with sep (for messages and tables).
func JoinReasons(rs []Reason, sep string) string {
	ss := make([]string, len(rs))
	for i, r := range rs {
		ss[i] = string(r)
	}
	return strings.Join(ss, sep)
}
