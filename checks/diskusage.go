package checks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/rawsys"
	"github.com/syself/autopilot-health/report"
)

func init() { Register("DiskUsageHigh", newDiskUsageCheck) }

// diskUsageCheck statfs()es every writable filesystem of the host (from
// /proc/self/mountinfo under the host root) whose type and mount point are
// not excluded, once per filesystem, and compares space and inode use with
// the thresholds. Space is computed as df does: used / (used + available to
// unprivileged users), rounded up.
//
// A part is a problem when its use is over its threshold T, as the spec's
// catalog says ("over the space or inode threshold"), not at it: kubelet
// evicts below 10 % free, over 90 % used. A percent rounded up (space,
// inodes, a volume group's extents) is over T exactly when the real use is
// (ceil(x) > T iff x > T, T whole), so 900 of 1000 blocks used (90 %) is
// not over 90, and 901 (90.1 %, shown 91) is. A thin pool's use is LVM's
// own percent, rounded to two decimals (never to 100.00 short of full):
// over T when LVM's figure is.
//
// Writable means the filesystem, not this mount: the shipped unit's
// ProtectSystem=strict remounts every mount read-only in the daemon's mount
// namespace (per-mount "ro") while the filesystems under them stay read-write
// (superblock "rw") and fill up as ever. Only a filesystem whose superblock
// is read-only (a sealed erofs or squashfs, an ext4 the kernel remounted
// read-only after an error) cannot fill up and is skipped.
//
// The LVM part (lvm.go): each volume group's allocated extents, and each
// active thin pool's data and metadata use, from `vgs` and `lvs` JSON
// reports, against their own thresholds.
type diskUsageCheck struct {
	env                      *Env
	spacePct                 int
	inodesPct                int
	vgPct                    int
	poolDataPct, poolMetaPct int
	excludeMP                *regexp.Regexp
	excludeType              *regexp.Regexp
	// podDirs are the kubelet's pod volume directories (host paths,
	// config.PodVolumeDirs) where mount_points_exclude is the default's
	// (config.DefaultMountPointsExclude), else nil: a mount below where
	// the host's links lead one of them is matched as named below it too
	// (linkedPodDirs).
	podDirs []string
	// lvmLast is LVM's last report, reused while it can be (askLVM).
	lvmLast *lvmAnswer
	// timeout is the check's: the waits for statfs and LVM are parts of it.
	timeout time.Duration
	// statfsStuck: the filesystems whose statfs has not returned (keyed
	// by device); lvmStuck: an LVM report that has not. Both are Env's
	// (Env.Stuck): a reload's new instance sees the old one's hung calls.
	statfsStuck *stuckCalls[unix.Statfs_t]
	lvmStuck    *stuckCalls[lvmRead]
}

// statfsTimeout is the longest one mount's statfs is waited for:
// node_exporter's --collector.filesystem.mount-timeout (5 s), or a sixth of
// the check's timeout where that is shorter. All mounts are asked at once, so
// this is also the longest the statfs part of a run takes. A mount that does
// not answer in time (a hard NFS mount whose server is gone, a hung FUSE
// daemon) is "not checked" and not asked again until its statfs returns.
func (c *diskUsageCheck) statfsTimeout() time.Duration { return min(5*time.Second, c.timeout/6) }

// lvmWait is the longest LVM's reports are waited for: two thirds of the
// check's timeout (20 s of 30 s: the two reports' lvm_timeout of 10 s each).
// lvm_timeout kills an lvm that does not answer, but an lvm in D state (a
// dead physical volume) does not die, and exec waits for it; the check
// returns anyway, with the LVM part "not checked".
func (c *diskUsageCheck) lvmWait() time.Duration { return c.timeout * 2 / 3 }

func newDiskUsageCheck(env *Env) (Check, error) {
	c := env.Config.Checks.DiskUsageHigh
	mp, err := regexp.Compile(c.MountPointsExclude)
	if err != nil {
		return nil, err
	}
	ft, err := regexp.Compile(c.FSTypesExclude)
	if err != nil {
		return nil, err
	}
	timeout := c.Timeout.Duration
	if timeout <= 0 {
		timeout = 30 * time.Second // a configuration built in code; the runner refuses it
	}
	var podDirs []string
	if env.Config.DefaultMountPointsExclude() {
		podDirs = env.Config.PodVolumeDirs()
	}
	stuck := env.stuckCalls()
	return &diskUsageCheck{env: env, podDirs: podDirs, statfsStuck: &stuck.statfs, lvmStuck: &stuck.lvm, spacePct: c.SpacePercent, inodesPct: c.InodesPercent, vgPct: c.VolumeGroupPercent,
		poolDataPct: c.ThinPoolDataPct, poolMetaPct: c.ThinPoolMetaPct, excludeMP: mp, excludeType: ft, timeout: timeout}, nil
}

// Mount is one line of /proc/<pid>/mountinfo.
type Mount struct {
	MountPoint string
	// Root is the directory of the filesystem mounted here: "/" for the
	// whole filesystem, the subdirectory for a bind mount of one.
	Root   string
	FSType string
	Source string
	Device string // major:minor
	// ReadOnly: the filesystem itself is read-only (superblock option "ro").
	ReadOnly bool
	// MountReadOnly: this mount is read-only (per-mount option "ro"), which
	// a read-only bind remount such as ProtectSystem= sets on a filesystem
	// that stays writable.
	MountReadOnly bool
}

// ParseMountinfo parses the format of proc(5) /proc/<pid>/mountinfo with
// hostio's reader (hostio.ParseMountinfo: fields split at each space as
// the kernel writes them, the root, mount point, filesystem type and
// source unescaped); a malformed line is the error, naming its number.
// FuzzParseMountinfo holds it to the kernel's rules.
func ParseMountinfo(r io.Reader) ([]Mount, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	return parseMountinfo(b)
}

// readMountinfo reads the mount table at path by ordinary system calls,
// not os (rawsys.ReadFileNoPoll): os.Open of it was two fcntl(2) and an
// epoll_ctl(2) add (procfs' mountinfo can be polled: the file ready, waking
// the thread waiting in the poller) and delete, and io.ReadAll's small
// first buffers eight reads of a 4 KiB table, every run
// (TestPeriodicPseudoFileReadsMakeNoEpollCtl). Not raw calls: the kernel
// makes the table under the mount namespace's lock, which a mount storm
// may hold.
func readMountinfo(path string) ([]byte, error) {
	return rawsys.ReadFileNoPoll(path, 0, 16<<10, -1)
}

func parseMountinfo(b []byte) ([]Mount, error) {
	es, err := hostio.ParseMountinfo(b)
	if err != nil {
		return nil, err
	}
	out := make([]Mount, 0, len(es))
	for _, e := range es {
		out = append(out, Mount{Device: e.Device, Root: e.Root, MountPoint: e.MountPoint, FSType: e.FSType, Source: e.Source,
			MountReadOnly: hasOption(e.Options, "ro"), ReadOnly: hasOption(e.SuperOptions, "ro")})
	}
	return out, nil
}

func hasOption(opts, name string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == name {
			return true
		}
	}
	return false
}

// FSUsage is one filesystem of the storage report: its use, or why it
// could not be measured.
type FSUsage struct {
	MountPoint string `json:"mountPoint"`
	FSType     string `json:"fsType"`
	Source     string `json:"source"`
	// FSFigures: nil for a filesystem that could not be measured, whose
	// entry then has no figures (not zeros, which read as an empty
	// filesystem), only its Error.
	*FSFigures
	// Error: why it could not be measured (its statfs failed, or did
	// not answer in time), as the disks report names a drive it could not
	// read; the condition's message names it "not checked".
	Error string `json:"error,omitempty"`
	// OverThreshold: its space or inodes used are over the check's
	// threshold (set by Probe; not in the report, where the problem
	// entries are kept first when the list is cut: Problem).
	OverThreshold bool `json:"-"`
}

// FSFigures are what statfs measured of a filesystem.
type FSFigures struct {
	SizeBytes   uint64 `json:"sizeBytes"`
	AvailBytes  uint64 `json:"availBytes"`
	UsedPercent int    `json:"usedPercent"`
	Inodes      uint64 `json:"inodes"`
	InodesPct   int    `json:"inodesUsedPercent"`
}

// Problem reports whether the filesystem is over its threshold, or could
// not be measured: the condition names it either way, so a list cut to
// fit its document keeps it.
func (u FSUsage) Problem() bool { return u.OverThreshold || u.Error != "" }

// Unread reports whether the filesystem is a problem only for not having
// been measured: a list cut to fit keeps those over their thresholds (the
// condition's True) before it (report.Unread).
func (u FSUsage) Unread() bool { return u.Error != "" && !u.OverThreshold }

// percentUp returns used/(used+avail) as a percentage, rounded up like df.
func percentUp(used, avail uint64) int {
	total := used + avail
	if total == 0 {
		return 0
	}
	return int((used*100 + total - 1) / total)
}

// usedOf is total less free, and 0 where free is more than total.
func usedOf(total, free uint64) uint64 {
	if free > total {
		return 0
	}
	return total - free
}

// mountSelection says what became of the mounts of mountinfo: the ones
// whose filesystems are measured, and how many were left out and why.
// excludedLink: those of excludedMP matched as named through a link
// (linkedDir), not as the mount table names them.
type mountSelection struct {
	measure                                           []Mount
	total, excludedType, excludedMP, excludedLink, ro int
}

// linkedDir is a pod volume directory as configured (named, a host path)
// and where the host's links lead it at this run (resolved, a host path
// as the mount table names a mount point below it).
type linkedDir struct{ named, resolved string }

// linkedPodDirs are the pod volume directories that the host's links lead
// elsewhere, resolved at each run under the host root as the host follows
// links (hostio.HostMountPath: the kernel log monitor's resolution of the
// same directories, kmsg's mountDirs). An operator who moves the kubelet
// to a data disk by a link, /var/lib/kubelet -> /data/kubelet, has its
// pods' volumes mounted at /data/kubelet/pods/<uid>/volumes/..., as the
// kernel writes the mount point, which the default mount_points_exclude,
// naming /var/lib/kubelet/pods, does not match: a pod's own full volume
// set the node's DiskUsageHigh. At each run, not once: a link made after
// the daemon started is followed at the next. A few system calls a
// directory (BenchmarkDiskUsageLinkedPodDirs), every 2 minutes.
func (c *diskUsageCheck) linkedPodDirs() []linkedDir {
	var out []linkedDir
	for _, d := range c.podDirs {
		// A directory that leads to / would make every mount its.
		if r := hostio.HostMountPath(c.env.Config.HostRoot, d); r != d && r != "/" {
			out = append(out, linkedDir{named: d, resolved: r})
		}
	}
	return out
}

// excludedThroughLink reports whether the mount point mp, at or below
// where a link leads a pod volume directory, is excluded by
// mount_points_exclude as named below that directory
// (/data/kubelet/pods/<uid>/volumes/... as /var/lib/kubelet/pods/<uid>/volumes/...):
// what the default leaves out there it leaves out where the link leads,
// and nothing else.
func (c *diskUsageCheck) excludedThroughLink(mp string, links []linkedDir) bool {
	for _, l := range links {
		if rest, ok := strings.CutPrefix(mp, l.resolved); ok && (rest == "" || rest[0] == '/') &&
			c.excludeMP.MatchString(l.named+rest) {
			return true
		}
	}
	return false
}

// selectMounts picks one mount per filesystem (device) to statfs among the
// mounts that are not excluded and whose filesystem is writable. statfs
// answers the same through any mount of a filesystem; the one named is the
// mount of the whole filesystem (Root "/", e.g. /var rather than the
// StateDirectory= bind /var/lib/autopilot-health of a subdirectory of it),
// else the first mount of it. Filesystems keep the order in which mountinfo
// first shows them. links: the pod volume directories the host's links
// lead elsewhere (linkedPodDirs), a mount below them excluded as named
// there.
func (c *diskUsageCheck) selectMounts(mounts []Mount, links []linkedDir) mountSelection {
	sel := mountSelection{total: len(mounts)}
	at := map[string]int{} // device -> index in sel.measure
	for _, m := range mounts {
		switch {
		case c.excludeType.MatchString(m.FSType):
			sel.excludedType++
		case c.excludeMP.MatchString(m.MountPoint):
			sel.excludedMP++
		case c.excludedThroughLink(m.MountPoint, links):
			sel.excludedMP++
			sel.excludedLink++
		case m.ReadOnly:
			sel.ro++
		default:
			i, seen := at[m.Device]
			if !seen {
				at[m.Device] = len(sel.measure)
				sel.measure = append(sel.measure, m)
				continue
			}
			if sel.measure[i].Root != "/" && m.Root == "/" {
				sel.measure[i] = m
			}
		}
	}
	return sel
}

// Usage returns the use of every filesystem the check watches and could
// measure, and why the others could not be.
func (c *diskUsageCheck) Usage() ([]FSUsage, []error, error) {
	u, errs, _, err := c.usage(context.Background())
	return measured(u), errs, err
}

// measured returns the entries of the filesystems that were measured.
func measured(entries []FSUsage) []FSUsage {
	var out []FSUsage
	for _, e := range entries {
		if e.FSFigures != nil {
			out = append(out, e)
		}
	}
	return out
}

func (c *diskUsageCheck) usage(ctx context.Context) ([]FSUsage, []error, mountSelection, error) {
	b, err := readMountinfo(c.env.Path(mountinfoPath))
	if err != nil {
		return nil, nil, mountSelection{}, err
	}
	mounts, err := parseMountinfo(b)
	if err != nil {
		return nil, nil, mountSelection{}, err
	}
	sel := c.selectMounts(mounts, c.linkedPodDirs())
	var out []FSUsage
	var errs []error
	// Keyed by the filesystem (device) alone: the mount chosen for a
	// device may change between runs (a mount of the whole filesystem
	// appears), and its hung statfs is the filesystem's.
	keys := make([]string, len(sel.measure))
	mountOf := make(map[string]string, len(sel.measure))
	for i, m := range sel.measure {
		keys[i] = m.Device // one mount per device
		mountOf[m.Device] = m.MountPoint
	}
	wait := c.statfsTimeout()
	answers := callEach(ctx, c.statfsStuck, wait, keys, func(dev string) (unix.Statfs_t, error) {
		var st unix.Statfs_t
		err := c.env.Sys.Statfs(c.env.Path(mountOf[dev]), &st)
		return st, err
	})
	for i, m := range sel.measure {
		st, err := answers[i].v, answers[i].err
		entry := FSUsage{MountPoint: m.MountPoint, FSType: m.FSType, Source: m.Source}
		if answers[i].stuck {
			entry.Error = fmt.Sprintf("statfs hung: no answer within %s; asked again once it answers", wait)
			errs = append(errs, fmt.Errorf("%s (%s)", m.MountPoint, entry.Error))
			out = append(out, entry)
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("statfs %s: %w", m.MountPoint, err))
			entry.Error = "statfs: " + err.Error()
			out = append(out, entry)
			continue
		}
		bs := uint64(st.Bsize)
		// A filesystem that reports more free blocks (or inodes) than it
		// has (network and FUSE filesystems, some overlay and btrfs
		// versions) uses none: the unsigned difference would wrap round
		// to nearly all of them.
		used := usedOf(st.Blocks, st.Bfree) * bs
		f := &FSFigures{
			SizeBytes: st.Blocks * bs, AvailBytes: st.Bavail * bs,
			UsedPercent: percentUp(used, st.Bavail*bs),
			Inodes:      st.Files,
		}
		if st.Files > 0 {
			f.InodesPct = percentUp(usedOf(st.Files, st.Ffree), st.Ffree)
		}
		entry.FSFigures = f
		out = append(out, entry)
	}
	return out, errs, sel, nil
}

const mountinfoPath = "/proc/self/mountinfo"

func (c *diskUsageCheck) Probe(ctx context.Context) (Result, error) {
	entries, errs, sel, err := c.usage(ctx)
	if err != nil {
		return Result{}, err
	}
	// entries: every filesystem watched, in mountinfo order, those whose
	// statfs failed or hung with their error (the storage report's
	// list); those measured decide.
	measuredN := len(measured(entries))
	fsDetail := report.Detail{Domain: "storage", Field: "filesystems", Value: entries}
	lvm := c.askLVM(ctx)
	// A copy: the answer is reused while it can be, and a VGUsage's
	// OverThreshold is this run's.
	vgs := slices.Clone(lvm.VGs)
	errs = append(errs, lvm.Errs...)
	if measuredN == 0 && len(vgs) == 0 && len(errs) > 0 {
		// The run failed; the filesystems it could not measure are
		// reported with their errors, as the disks check reports the
		// drives it could not read.
		var ds []report.Detail
		if len(entries) > 0 {
			ds = []report.Detail{fsDetail}
		}
		return Result{Details: ds}, errors.Join(errs...)
	}
	if len(entries) == 0 && len(vgs) == 0 {
		linked := ""
		if sel.excludedLink > 0 {
			linked = fmt.Sprintf(" (%d of them below where a link leads the kubelet's pod volume directories, matched as named there)", sel.excludedLink)
		}
		return Result{Status: report.StatusUnknown, Reason: report.ReasonNothingToCheck,
			Message: fmt.Sprintf("no writable filesystem to measure in %s: %d mounts, %d excluded by fs_types_exclude, %d by mount_points_exclude%s, %d of read-only filesystems",
				mountinfoPath, sel.total, sel.excludedType, sel.excludedMP, linked, sel.ro)}, nil
	}
	var space, inodes, vgHigh, poolHigh []string
	for i, u := range entries {
		if u.FSFigures == nil {
			continue // not measured: named "not checked"
		}
		if u.UsedPercent > c.spacePct {
			space = append(space, fmt.Sprintf("%s %d%% of space used (threshold %d%%)", u.MountPoint, u.UsedPercent, c.spacePct))
			entries[i].OverThreshold = true
		}
		if u.Inodes > 0 && u.InodesPct > c.inodesPct {
			inodes = append(inodes, fmt.Sprintf("%s %d%% of inodes used (threshold %d%%)", u.MountPoint, u.InodesPct, c.inodesPct))
			entries[i].OverThreshold = true
		}
	}
	pools := 0
	for i, vg := range vgs {
		if vg.AllocatedPercent > c.vgPct {
			vgHigh = append(vgHigh, fmt.Sprintf("volume group %s %d%% of extents allocated (threshold %d%%)", vg.Name, vg.AllocatedPercent, c.vgPct))
			vgs[i].OverThreshold = true
		}
		for _, p := range vg.ThinPools {
			switch {
			case p.Health != "":
				poolHigh = append(poolHigh, fmt.Sprintf("thin pool %s/%s %s", vg.Name, p.Name, p.Health))
				vgs[i].OverThreshold = true
				continue
			case p.Inactive:
				continue
			case p.Unmeasured:
				errs = append(errs, fmt.Errorf("thin pool %s/%s: active, but LVM reports no data or metadata use", vg.Name, p.Name))
				continue
			}
			pools++
			if p.DataPercent > float64(c.poolDataPct) {
				poolHigh = append(poolHigh, fmt.Sprintf("thin pool %s/%s %s%% of data used (threshold %d%%)", vg.Name, p.Name, pct(p.DataPercent), c.poolDataPct))
				vgs[i].OverThreshold = true
			}
			if p.MetadataPercent > float64(c.poolMetaPct) {
				poolHigh = append(poolHigh, fmt.Sprintf("thin pool %s/%s %s%% of metadata used (threshold %d%%)", vg.Name, p.Name, pct(p.MetadataPercent), c.poolMetaPct))
				vgs[i].OverThreshold = true
			}
		}
	}
	details := []report.Detail{fsDetail}
	if vgs != nil {
		// Absent when LVM was not asked (not installed, lvm_command off, a
		// host root elsewhere) or gave no report: an empty list is an
		// answer, "no volume groups".
		details = append(details, report.Detail{Domain: "storage", Field: "volumeGroups", Value: vgs})
	}
	var notes string
	if len(errs) > 0 {
		notes = "; not checked: " + errors.Join(errs...).Error()
		notes = strings.ReplaceAll(notes, "\n", "; ")
	}
	problems := strings.Join(slices.Concat(space, inodes, vgHigh, poolHigh), ", ") + notes
	switch {
	case len(space) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh, Message: problems, Details: details}, nil
	case len(inodes) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonFilesystemInodesHigh, Message: problems, Details: details}, nil
	case len(vgHigh) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonVolumeGroupSpaceHigh, Message: problems, Details: details}, nil
	case len(poolHigh) > 0:
		return Result{Status: report.StatusTrue, Reason: report.ReasonThinPoolSpaceHigh, Message: problems, Details: details}, nil
	}
	msg := fmt.Sprintf("%d %s not over %d%% space and %d%% inodes", measuredN, plural(measuredN, "filesystem", "filesystems"), c.spacePct, c.inodesPct)
	if len(vgs) > 0 {
		msg += fmt.Sprintf(", %d LVM %s not over %d%% of extents allocated", len(vgs), plural(len(vgs), "volume group", "volume groups"), c.vgPct)
	}
	if pools > 0 {
		msg += fmt.Sprintf(", %d thin %s not over %d%% of data and %d%% of metadata used", pools, plural(pools, "pool", "pools"), c.poolDataPct, c.poolMetaPct)
	}
	return Result{Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK, Message: msg + notes, Details: details}, nil
}

// pct writes a percentage as LVM does, without trailing zeros (93.75, 10).
func pct(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// plural picks the word for a count of n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
