package kmsg

import (
	"fmt"
	"regexp"
	"slices"
)

// Kind says what a rule does on a match.
type Kind string

const (
	// Perm sets a condition and holds it.
	Perm Kind = "perm"
	// Temp emits a one-shot event.
	Temp Kind = "temp"
	// DiskIOError counts one disk I/O error towards the DisksFailure window
	// (and emits its event).
	DiskIOError Kind = "disk-io-error"
	// PodVolume is the kind of the built-in PodVolumeReadOnly alone: it has
	// no pattern; its lines are those of a ReadonlyFilesystem rule whose
	// device is a pod's volume (see volumes), each a PodVolumeReadOnly
	// event, not the condition. A rule by name all the same: listed,
	// counted (autopilot_health_kmsg_matches_total{rule="PodVolumeReadOnly"})
	// and turned off (kmsg.disable: such a line is then neither the event
	// nor the condition) as any other.
	PodVolume Kind = "pod-volume"
)

// PodVolumeRule is the built-in rule of kind PodVolume.
var PodVolumeRule = Rule{Name: "PodVolumeReadOnly", Kind: PodVolume, Reason: "PodVolumeReadOnly", builtin: true}

// Rule is one kernel log pattern and what a match does.
type Rule struct {
	// Name identifies the rule (config, metrics, fixtures).
	Name string
	Kind Kind
	// Condition and Reason: for Perm the condition type and its True reason;
	// for Temp and DiskIOError the event reason.
	Condition string
	Reason    string
	// Pattern is a Go regular expression matched against the unescaped
	// message. A named group "task" restricts the rule to the critical tasks
	// (with a group "pid", the task's PID: a node daemon's name in a pod's
	// cgroup is not critical, see PodGatedTasks); a named group "dev" names
	// the device for the disk I/O error window, and in a rule of
	// ReadonlyFilesystem the filesystem's device (a pod's volume is not the
	// node's, see volumes). Several groups may be named "dev" (one in each
	// branch of an alternation): the first that matched names the device.
	Pattern string
	// builtin marks PodVolumeRule itself: a rule of the configuration
	// (kmsg.rules) never has it, so one that copies PodVolumeRule field
	// for field is refused all the same (Compile).
	builtin bool
}

// DefaultRules are the built-in rules, written from the kernel's and the
// drivers' message formats (several versions where the wording changed).
var DefaultRules = []Rule{
	// Perm: conditions.
	{Name: "ReadonlyFilesystem", Kind: Perm, Condition: "ReadonlyFilesystem", Reason: "FilesystemIsReadOnly",
		// ext4, and ext3 mounted by ext4 (fs/ext4/super.c ext4_handle_error): "EXT4-fs (sda1): Remounting filesystem read-only";
		// ext2 (fs/ext2/super.c ext2_error) and the old ext3 driver (fs/ext3, before 4.3, ext3_handle_error/ext3_abort):
		// "EXT2-fs (sdb1): error: remounting filesystem read-only";
		// btrfs: "BTRFS info (device sda1): forced readonly" (4.x-6.x) / "BTRFS error (device sda1 state EA): forced readonly";
		// XFS, which shuts the filesystem down instead (fs/xfs/xfs_fsops.c xfs_do_force_shutdown, every write fails):
		// "XFS (sdb1): Log I/O Error (0x2) detected at xlog_ioend_work+0x6e/0x70 [xfs] (fs/xfs/xfs_log.c:1378).  Shutting down filesystem." (6.x),
		// "XFS (sdb1): Log I/O Error Detected. Shutting down filesystem" (4.x), "XFS (sdb1): Corruption of in-memory data detected.  Shutting down filesystem".
		// Not a shutdown an administrator asked for (XFS_IOC_GOINGDOWN: xfs_io -x -c shutdown), which is no error: its flags
		// hold SHUTDOWN_FORCE_UMOUNT (0x4), "Metadata I/O Error (0x4) detected at xfs_fs_goingdown..." (0x6 with the log
		// error flag), and up to 5.15 its line was "User initiated shutdown [(0x4) ]received. Shutting down filesystem".
		// f2fs (fs/f2fs/super.c f2fs_handle_critical_error, "F2FS-fs (%s): " from f2fs_printk), after a critical error
		// that stopped its checkpoints (every later write fails): "F2FS-fs (sdb1): Remounting filesystem read-only"
		// (errors=remount-ro, 6.6+), "F2FS-fs (sdb1): Stopped filesystem due to reason: 3" (errors=continue, the
		// default; 6.10+, and 6.6 stable), the reason an enum stop_cp_reason (include/linux/f2fs_fs.h); not reason 0,
		// a shutdown someone asked for (F2FS_IOC_SHUTDOWN), nor 1, its fault injection (a test).
		// Each form names the filesystem's device in a "dev" group: a pod's volume is no ReadonlyFilesystem (see volumes).
		Pattern: `^(EXT[234]-fs \((?P<dev>\S+)\): (error: r|R)emounting filesystem read-only|BTRFS \w+ \(device (?P<dev>[^):\s]+)[^)]*\): forced readonly|` +
			`F2FS-fs \((?P<dev>\S+)\): (Remounting filesystem read-only|Stopped filesystem due to reason: ([2-9]|[1-9][0-9]+)$)|` +
			`XFS \((?P<dev>[^)]+)\): ([^.(]* [Dd]etected\.|All device paths lost\.|[^(]*\(0x[0-9a-f]*[0-389ab]\) detected at ).*Shutting down filesystem)`},
	// A ReadonlyFilesystem line on a pod's volume: an event (see PodVolume).
	PodVolumeRule,
	{Name: "KernelDeadlock", Kind: Perm, Condition: "KernelDeadlock", Reason: "CriticalTaskHung",
		// kernel/hung_task.c: "INFO: task %s:%d blocked for more than %ld seconds." (3.x-6.x),
		// the thread's name (comm) and its PID in the host's namespace (t->pid).
		Pattern: `^INFO: task (?P<task>.+):(?P<pid>\d+) blocked for more than \d+ seconds\.`},
	{Name: "VerityCorruption", Kind: Perm, Condition: "VerityCorruption", Reason: "VerityBlockCorrupted",
		// drivers/md/dm-verity-target.c: "device-mapper: verity: 7:1: data block 5 is corrupted",
		// "... metadata block 6 is corrupted", "...: reached maximum errors" is not a corruption by itself.
		Pattern: `^device-mapper: verity: \S+: (data|metadata) block \d+ is corrupted`},
	{Name: "CperHardwareErrorFatal", Kind: Perm, Condition: "CperHardwareErrorFatal", Reason: "FatalHardwareError",
		// drivers/firmware/efi/cper.c cper_estatus_print, "%s" "event severity: %s" with the caller's prefix:
		// GHES "{1}[Hardware Error]: event severity: fatal" ("{%u}" HW_ERR);
		// BERT (drivers/acpi/apei/bert.c, KERN_INFO HW_ERR, a previous boot's error) "[Hardware Error]: event severity: fatal"
		// after "BERT: Error records from previous boot:";
		// Intel eMCA (drivers/acpi/acpi_extlog.c __print_extlog_rcd, 3.14-6.x) "{1}event severity: fatal": its prefix is
		// "%s{%u}" of the level alone, no HW_ERR, after "{1}Hardware error detected on CPU3". See cperSeverity.
		Pattern: cperSeverity("fatal")},
	{Name: "GpuFallenOffBus", Kind: Perm, Condition: "GpuFallenOffBus", Reason: "GpuFellOffBus",
		// NVIDIA driver: "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." and
		// "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=nvidia-smi, GPU has fallen off the bus.";
		// a GPU already lost when the driver probes it (osapi.c rm_is_supported_device), one record of three lines:
		// "NVRM: The NVIDIA GPU 0000:3b:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."
		Pattern: `^NVRM: (?s:.*)(GPU has fallen off the bus|fallen off the bus and is not responding to commands)`},

	// Temp: events.
	{Name: "TaskHung", Kind: Temp, Reason: "TaskHung",
		Pattern: `^INFO: task .+:\d+ blocked for more than \d+ seconds\.`},
	{Name: "Ext4Error", Kind: Temp, Reason: "Ext4Error",
		// "EXT4-fs error (device sda1): ext4_find_entry:1455: ..." and "EXT4-fs error (device loop0) in __ext4_new_inode:1096: ..."
		Pattern: `^EXT4-fs error \(device \S+\)`},
	{Name: "Ext4Warning", Kind: Temp, Reason: "Ext4Warning",
		Pattern: `^EXT4-fs warning \(device \S+\)`},
	{Name: "IOError", Kind: Temp, Reason: "IOError",
		// fs/buffer.c: "Buffer I/O error on dev sda1, logical block 0, async page read" (4.x+),
		// "Buffer I/O error on device sda1, logical block 0" (older).
		Pattern: `^Buffer I/O error on dev(ice)? \S+, logical block \d+`},
	{Name: "BlockIOError", Kind: DiskIOError, Reason: "BlockIOError",
		// block/blk-core.c: "blk_update_request: I/O error, dev sda, sector 2048" (<= 5.2),
		// "blk_update_request: I/O error, dev sda, sector 2048 op 0x0:(READ) flags 0x0 phys_seg 1 prio class 0" (5.3-5.15),
		// "I/O error, dev nvme0n1, sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2" (5.16+: print_req_error lost
		// its caller argument, "block: remove useless caller argument to print_req_error()"; blk_print_req_error in blk-mq.c since 5.18);
		// the status names of blk_errors[]: "critical medium error, dev sdc, sector ...", "timeout error, ...",
		// "device offline error, dev sdb, sector ..." (BLK_STS_OFFLINE, 2022: what SCSI fails a request with once the
		// device is offline, which error handling does to a disk that no longer recovers; older kernels printed "I/O error").
		// Not the statuses a healthy disk returns: "critical nexus" (BLK_STS_NEXUS, a persistent reservation another host
		// holds; "reservation conflict" since 6.5), "critical space allocation" (BLK_STS_NOSPC, a thin-provisioned LUN
		// whose pool is full), "operation not supported", "kernel resource", the zone and "nonblocking retry" statuses.
		Pattern: `(I/O|critical medium|critical target|recoverable transport|protection|timeout|device offline) error, dev (?P<dev>[^,\s]+), sector \d+`},
	{Name: "NvmeError", Kind: Temp, Reason: "NvmeError",
		// drivers/nvme/host: "nvme nvme0: I/O 123 QID 4 timeout, aborting", "nvme nvme0: I/O tag 12 (100c) opcode 0x2 (Read) QID 4 timeout, reset controller" (6.x),
		// "nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff", "nvme nvme0: Device not ready; aborting reset, CSTS=0x1",
		// "nvme nvme0: Removing after probe failure status: -19" (up to 6.1), "nvme nvme0: Disabling device after reset failure: -19" (6.2+);
		// nvme_log_error (6.0+): "nvme0n1: Read(0x2) @ LBA 2048, 8 blocks, Unrecovered Read Error (sct 0x2 / sc 0x81) DNR",
		// on a path of a multipath namespace (nvme_mpath_set_disk_name) "nvme0c0n1: ...".
		Pattern: `^(nvme nvme\d+: (I/O (tag )?\d+ .*QID \d+ timeout|controller is down|Device not ready|Removing after probe failure|Disabling device after reset failure)|nvme\d+(c\d+)?n\d+: .* @ LBA \d+, \d+ blocks, .*\(sct 0x[0-9a-f]+ / sc 0x[0-9a-f]+\))`},
	{Name: "AtaError", Kind: Temp, Reason: "AtaError",
		// drivers/ata/libata-eh.c: "ata1.00: exception Emask 0x0 SAct 0x0 SErr 0x0 action 0x6 frozen",
		// "ata1.00: failed command: READ FPDMA QUEUED", "ata1.00: error: { UNC }", "ata1: COMRESET failed (errno=-16)" (up to 6.5);
		// 6.6+ logs a failed link reset once its retries are used up, "ata1: hardreset failed" (ata_eh_reset);
		// drivers/ata/libahci.c: "ata1: softreset failed (device not ready)".
		Pattern: `^ata\d+(\.\d+)?: (exception Emask|failed command:|error: \{|COMRESET failed|(hard|soft)reset failed)`},
	{Name: "NvidiaXidError", Kind: Temp, Reason: "NvidiaXidError",
		// "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics SM Warp Exception ...";
		// on a MIG GPU the GPU instance, and the compute instance when known (kernel_rc.c krcReportXid):
		// "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 43, pid=..., name=..., ...", "NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, ...".
		Pattern: `^NVRM: Xid \(PCI:[0-9a-fA-F:.]+( GPU-I:\d+( GPU-CI:\d+)?)?\): \d+`},
	{Name: "MemoryReadError", Kind: Temp, Reason: "MemoryReadError",
		// drivers/edac/edac_mc.c (edac_ce_error/edac_ue_error via edac_mc_printk, "EDAC MC%d: "):
		// "%d CE %s%son %s (...)" and "%d UE %s%son %s (...)", the first %s the driver's message:
		// Intel sb/skx/i10nm the operation, "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (...)",
		// "... memory scrubbing error on ..."; amd64_edac "" on a decoded address, "EDAC MC0: 1 CE on mc#0csrow#1channel#0 (...)";
		// ghes_edac the CPER memory error type, "EDAC MC0: 1 CE single-bit ECC on unknown memory (...)"
		// ("Single-bit ECC" before 5.18). UE (and fatal) is the same event: a memory error, corrected or not.
		Pattern: `^EDAC MC\d+: \d+ [CU]E `},
	{Name: "UnregisterNetDevice", Kind: Temp, Reason: "UnregisterNetDevice",
		// net/core/dev.c: "unregister_netdevice: waiting for eth0 to become free. Usage count = 1".
		Pattern: `^unregister_netdevice: waiting for \S+ to become free`},
	{Name: "CperHardwareErrorCorrected", Kind: Temp, Reason: "CperHardwareErrorCorrected",
		Pattern: cperSeverity("corrected")},
	{Name: "CperHardwareErrorRecoverable", Kind: Temp, Reason: "CperHardwareErrorRecoverable",
		Pattern: cperSeverity("recoverable")},
}

// cperSeverity is the pattern of cper_estatus_print's severity line
// (drivers/firmware/efi/cper.c, "%s" "event severity: %s" with its caller's
// prefix, cper_severity_str: "recoverable", "fatal", "corrected", "info")
// for one severity, in the forms of its callers:
//   - GHES (drivers/acpi/apei/ghes.c __ghes_print_estatus), "{%u}" HW_ERR:
//     "{1}[Hardware Error]: event severity: corrected";
//   - BERT (drivers/acpi/apei/bert.c bert_print_all), HW_ERR alone:
//     "[Hardware Error]: event severity: fatal";
//   - Intel eMCA's extended error log (drivers/acpi/acpi_extlog.c
//     __print_extlog_rcd, 3.14 to 6.x), "%s{%u}" of KERN_INFO or KERN_ERR
//     alone, which printk takes off: "{1}event severity: corrected" (the
//     record starts "{1}Hardware error detected on CPU3"; its sections are
//     "{1} Error 0, type: corrected" and so on, as GHES's are). Up to the
//     kernels that print its records unconditionally, extlog prints them
//     only while no user space RAS consumer (rasdaemon) holds the ras
//     debugfs trace file open: a node running rasdaemon has no such line.
//
// The extlog form is anchored at the message's start, "{" and a number
// being all its prefix: "event severity: fatal" after other text is no
// CPER line's.
func cperSeverity(severity string) string {
	return `(\[Hardware Error\]: |^\{\d+\})event severity: ` + severity
}

// DefaultCriticalTasks are the processes whose hung task sets KernelDeadlock.
// The kernel truncates task names to 15 characters (qemu-system-x86_64 is
// "qemu-system-x86"), hence the prefix patterns. A Kata VM's QEMU is
// qemu-system-<arch> or qemu-kvm; the other QEMU tools (qemu-img, qemu-ga,
// qemu-nbd, qemu-storage-daemon) are not the VM and not critical. The
// hung-task line names the thread, not the process: QEMU with
// debug-threads=on (Kata's and libvirt's command line) names its vCPU
// threads "CPU <n>/KVM", and a vCPU stuck in the host kernel is the VM hung.
var DefaultCriticalTasks = []string{"kubelet", "containerd", "containerd-shim*", "runc", "runc:*", "crun", "qemu-system-*", "qemu-kvm", "CPU */KVM", "virtiofsd"}

// BuildRules returns the default rules without the disabled ones, with
// custom rules replacing defaults of the same name and the rest appended.
func BuildRules(disable []string, custom []Rule) ([]Rule, error) {
	for _, d := range disable {
		if !slices.ContainsFunc(DefaultRules, func(r Rule) bool { return r.Name == d }) &&
			!slices.ContainsFunc(custom, func(r Rule) bool { return r.Name == d }) {
			return nil, fmt.Errorf("unknown rule %q", d)
		}
	}
	var out []Rule
	for _, r := range DefaultRules {
		if i := slices.IndexFunc(custom, func(c Rule) bool { return c.Name == r.Name }); i >= 0 {
			r = custom[i]
		}
		if !slices.Contains(disable, r.Name) {
			out = append(out, r)
		}
	}
	for _, c := range custom {
		if !slices.ContainsFunc(DefaultRules, func(r Rule) bool { return r.Name == c.Name }) && !slices.Contains(disable, c.Name) {
			out = append(out, c)
		}
	}
	// PodVolumeReadOnly takes its lines from a ReadonlyFilesystem rule that
	// names the device: without one (ReadonlyFilesystem disabled, or
	// replaced by a rule without the group) it can never match, and is not
	// in effect: not listed by `kmsg rules`, no series of the match counter.
	if !slices.ContainsFunc(out, feedsPodVolume) {
		out = slices.DeleteFunc(out, func(r Rule) bool { return r == PodVolumeRule })
	}
	return out, nil
}

// feedsPodVolume reports whether r's matches can be PodVolumeReadOnly's
// (Monitor.podVolumes): a ReadonlyFilesystem rule with a (?P<dev>...)
// group. A pattern that does not compile is Compile's to refuse.
func feedsPodVolume(r Rule) bool {
	if r.Kind != Perm || r.Condition != "ReadonlyFilesystem" {
		return false
	}
	re, err := regexp.Compile(r.Pattern)
	return err == nil && re.SubexpIndex("dev") >= 0
}
