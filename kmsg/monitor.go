package kmsg

import (
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// Options configure a Monitor.
type Options struct {
	Rules *RuleSet
	Store *report.Store
	// GPU says whether GPU-only rules apply.
	GPU bool
	// KernelOnly ignores records that user space wrote (facility != 0).
	KernelOnly bool
	// IOErrorThreshold disk I/O errors within IOErrorWindow set DisksFailure.
	IOErrorThreshold int
	IOErrorWindow    time.Duration
	// IgnoreDevices: disk I/O errors on these devices (prefix match: loop,
	// dm-, ...) do not count towards DisksFailure: they are not disks.
	IgnoreDevices []string
	// Sysfs is the host's sysfs (/sys under the host root): disk I/O
	// errors of a namespace of NVMe over Fabrics (its controller's
	// transport tcp, rdma, fc or loop) or of a SCSI disk of an iSCSI
	// session do not count towards DisksFailure (see devices.fabrics).
	// "": no lookup (a replay of another host's lines), every NVMe device
	// and SCSI disk counts.
	Sysfs string
	// Proc is the host's procfs (/proc under the host root): a hung task
	// named as a node daemon (PodGatedTasks) whose cgroup
	// (/proc/<pid>/cgroup) is under the kubelet's pod hierarchy is a
	// pod's, not KernelDeadlock (see pods). "": no lookup (a replay of
	// another host's lines), every critical task's name counts.
	//
	// The monitor also reads kernel.hung_task_warnings there (see
	// hungWarnings); "": not read.
	Proc string
	// PodVolumeDirs are the directories, as the host names them (host
	// paths under HostRoot), below which the kubelet mounts pods'
	// volumes: a ReadonlyFilesystem line whose device (looked up under
	// Sysfs) is mounted only below them in the mount table
	// (Proc/self/mountinfo) is a pod volume's, an event
	// (PodVolumeReadOnly), not the condition (see volumes). Each is
	// looked for there both as given and resolved as the host resolves
	// it at the lookup (/var/lib/kubelet -> /data/kubelet: mountDirs).
	// nil: DefaultPodVolumeDirs; Sysfs or Proc "": no lookup, every such
	// line sets the condition.
	PodVolumeDirs []string
	// HostRoot is the host's root, under which PodVolumeDirs are
	// resolved; "" or "/": the daemon's own.
	HostRoot string
	// MalformedMountinfo counts the lines of the mount table that the
	// pod volume lookup reads and cannot split (a table with one is not
	// judged: the line is the node's), at each lookup; the daemon wires
	// in autopilot_health_malformed_lines_total{reader="mountinfo-kmsg"}.
	// nil: not counted (still logged once per change to Log).
	MalformedMountinfo prometheus.Counter
	Registerer         prometheus.Registerer
	// Log takes the monitor's own lines (kernel.hung_task_warnings at 0);
	// nil: discarded.
	Log *slog.Logger
}

// DefaultIgnoreDevices are block devices whose I/O errors are not disk
// failures: loop devices, device-mapper (a dm-verity corruption also fails
// reads on dm-N), network block devices (nbd, and Ceph RBD: a PVC of a Ceph
// cluster that is down or has blocklisted the node fails as "I/O error, dev
// rbd0"), RAM disks, optical drives, md, and floppy drives (a VM's
// emulated floppy controller with no disk in it fails every probe of fd0,
// "I/O error, dev fd0, sector 0", blkid's and udev's at each boot among
// them: a VM on QEMU's i440fx machine type, as many clouds run, has one).
var DefaultIgnoreDevices = []string{"loop", "dm-", "nbd", "rbd", "zram", "ram", "sr", "md", "fd"}

// Monitor turns kernel records into conditions and events.
type Monitor struct {
	o Options
	m *Metrics
	// next are the settings as last given (NewMonitor, Reconfigure); cur
	// are those the reader's goroutine applies, taken from next as it
	// handles the next record or tick (see use).
	next    atomic.Pointer[settings]
	cur     *settings
	window  window
	devices devices
	pods    pods
	volumes volumes
	hung    hungWarnings
	buf     []byte
	matches []Match
	// bootWall is the wall time of usec 0 (for event times).
	bootWall time.Time
	// suppressedIO are the I/O error lines the kernel's rate limit
	// dropped (see countSuppressed), oldest first; lastSiteUsec is the
	// kernel time of the last I/O error line (of any device) handled;
	// suppressedFns are the metric's series by function.
	suppressedIO  []suppression
	lastSiteUsec  uint64
	suppressedFns map[string]prometheus.Counter
	// winGen counts changes of the I/O error window (the reader saves the
	// window with its cursor when it changed).
	winGen uint64
	// caughtUp: the reader has read the log to its end since it last
	// opened it (until then the window's part is not evaluated False).
	caughtUp atomic.Bool
	// readFrom, when not zero, is when the reader began at the end of the
	// log (kmsg.from_boot_start false, no cursor of this boot): the records
	// logged before it were not read, and a kernel condition's healthy
	// False says so, not that this boot's records were read (readFromStart).
	// readFromUsec is that start in kernel time: until the I/O error
	// window's span has passed since, DisksFailure's count says it covers
	// only the errors logged since.
	readFrom     time.Time
	readFromUsec uint64
	// gpu says whether GPU-only rules apply (Options.GPU, then SetGPU).
	gpu atomic.Bool
	// lastSeq, lastUsec and lastAt (Unix ns) are of the last record
	// handled (lastAt 0: none yet), for status.
	lastSeq, lastUsec atomic.Uint64
	lastAt            atomic.Int64
	// beforeHandle, when set (tests), is called as Handle begins: a crash
	// point between reading a record and setting its conditions.
	beforeHandle func(Record)
}

// NewMonitor builds a monitor. It does not touch the store until Start.
func NewMonitor(o Options) *Monitor {
	if o.IgnoreDevices == nil {
		o.IgnoreDevices = DefaultIgnoreDevices
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	mon := &Monitor{o: o, m: NewMetrics(o.Registerer), buf: make([]byte, 0, 1024), devices: devices{sysfs: o.Sysfs}, pods: newPods(o.Proc),
		suppressedFns: map[string]prometheus.Counter{}}
	if o.PodVolumeDirs == nil {
		o.PodVolumeDirs = DefaultPodVolumeDirs
	}
	mon.volumes = newVolumes(o.Sysfs, o.Proc, o.HostRoot, o.PodVolumeDirs, o.MalformedMountinfo, o.Log)
	mon.hung = newHungWarnings(o.Proc, o.Log, mon.m)
	mon.cur = mon.settingsOf(o)
	mon.next.Store(mon.cur)
	mon.gpu.Store(o.GPU)
	return mon
}

// settings are what Reconfigure changes: the rules and what they count.
type settings struct {
	rules      *RuleSet
	matched    map[string]prometheus.Counter
	kernelOnly bool
	threshold  int
	window     time.Duration
	ignore     []string
}

func (mon *Monitor) settingsOf(o Options) *settings {
	ignore := o.IgnoreDevices
	if ignore == nil {
		ignore = DefaultIgnoreDevices
	}
	return &settings{rules: o.Rules, matched: mon.m.series(o.Rules), kernelOnly: o.KernelOnly,
		threshold: o.IOErrorThreshold, window: o.IOErrorWindow, ignore: ignore}
}

// RuleChanges says what Reconfigure changed in the rules, by name.
type RuleChanges struct {
	Added, Removed, Changed []string
}

// Reconfigure swaps in the rules, KernelOnly, the I/O error threshold and
// window and IgnoreDevices of o (the other options cannot change): the
// record the reader handles next is matched by the new rules, the one
// before by the old ones; the reader's cursor stays, so no record is lost
// or read twice. The window keeps the errors it holds (every one within
// the longest span the configuration allows, up to windowCap) and is
// evaluated with the new threshold and span at the next record or tick,
// just as a fresh start over the same records would be. Each rule's match
// counter is kept; a removed rule's series is dropped, a new rule's starts
// at 0.
func (mon *Monitor) Reconfigure(o Options) RuleChanges {
	s := mon.settingsOf(o)
	old := mon.next.Swap(s)
	var ch RuleChanges
	tasksChanged := !slices.Equal(old.rules.tasks(), s.rules.tasks())
	for _, r := range s.rules.list() {
		i := slices.IndexFunc(old.rules.list(), func(c compiled) bool { return c.Name == r.Name })
		switch {
		case i < 0:
			ch.Added = append(ch.Added, r.Name)
		case old.rules.list()[i].Rule != r.Rule, tasksChanged && r.taskIdx >= 0:
			// A rule with a task group matches the critical tasks.
			ch.Changed = append(ch.Changed, r.Name)
		}
	}
	for _, r := range old.rules.list() {
		if _, ok := s.matched[r.Name]; !ok {
			ch.Removed = append(ch.Removed, r.Name)
			mon.m.matchedVec.DeleteLabelValues(r.Name)
		}
	}
	return ch
}

func (rs *RuleSet) list() []compiled {
	if rs == nil {
		return nil
	}
	return rs.rules
}

func (rs *RuleSet) tasks() []string {
	if rs == nil {
		return nil
	}
	return rs.criticalTasks
}

// use returns the settings to apply now, taking the newest ones: called
// only by the goroutine that handles records (the reader).
func (mon *Monitor) use() *settings {
	if s := mon.next.Load(); s != mon.cur {
		if !slices.Equal(s.ignore, mon.cur.ignore) && mon.window.dropDevices(s.ignored) {
			// A device ignored now: its errors held are not counted,
			// as a fresh start would not have recorded them.
			mon.winGen++
		}
		mon.cur = s
	}
	return mon.cur
}

// Metrics returns the monitor's metrics.
func (mon *Monitor) Metrics() *Metrics { return mon.m }

// Conditions lists the conditions the monitor evaluates on this node.
func (mon *Monitor) Conditions() []string {
	var out []string
	for _, d := range report.Conditions {
		if d.Source == report.SourceKmsg && d.Scope.Applies(report.RoleWorker, mon.gpu.Load()) && d.Scope.Applies(report.RoleControlPlane, mon.gpu.Load()) {
			out = append(out, d.Type)
		}
	}
	return out
}

// LastRecord returns the sequence number and kernel time of the last record
// handled and its wall time (ok false: none yet).
func (mon *Monitor) LastRecord() (seq, usec uint64, at time.Time, ok bool) {
	ns := mon.lastAt.Load()
	if ns == 0 {
		return 0, 0, time.Time{}, false
	}
	return mon.lastSeq.Load(), mon.lastUsec.Load(), time.Unix(0, ns), true
}

// Start prepares the monitor before the reader opens the log. A kernel
// condition that has no state yet (none restored from this boot) is
// Unknown (NoData) until the reader has read the log up to its end
// (CaughtUp): before that, "no matching line" is not known. A condition
// restored from this boot keeps its state.
//
// The kernel's part of DisksFailure is kept as restored (report.Store.Load
// restores the parts with their condition, or sets them from it). A
// condition the store holds without them has them set from it the same
// way (report.Store.SeedParts: True for the part that owns its reason, the
// others no data), so the other part (NVMe SMART), set before the log is
// read again, neither lowers a True the kernel set nor, having nothing to
// check, turns the condition Unknown: no flap on a restart. Without the
// condition, the kernel's part has no data yet.
//
// A condition read back with a reason this build does not know
// (report.Store.Aside) gets no placeholder, nor does its kernel part: the
// placeholder would be the first evaluation of its type and spend the
// status and time kept for it; the first decision (the log read to its
// end, the other part of DisksFailure) takes them.
func (mon *Monitor) Start(now time.Time, bootWall time.Time) {
	mon.bootWall = bootWall
	mon.hung.read(now)
	aside := mon.o.Store.Aside()
	for _, t := range mon.Conditions() {
		if _, ok := mon.o.Store.Get(t); ok || slices.Contains(aside, t) {
			continue
		}
		mon.o.Store.Set(report.Condition{Type: t, Status: report.StatusUnknown, Reason: report.ReasonNoData,
			Message: "the kernel log has not been read yet"}, now)
	}
	if _, ok := mon.o.Store.Part(report.SourceKmsg, "DisksFailure"); ok {
		return
	}
	if _, ok := mon.o.Store.Get("DisksFailure"); ok {
		mon.o.Store.SeedParts("DisksFailure")
		return
	}
	if slices.Contains(aside, "DisksFailure") {
		return
	}
	mon.o.Store.SetPart(report.SourceKmsg, report.Condition{Type: "DisksFailure", Status: report.StatusUnknown, Reason: report.ReasonNoData,
		Message: "the kernel log has not been read yet"}, now)
}

// CaughtUp says the reader has read every record the kernel holds for
// now: a kernel condition that is not True is False (healthy), and the
// disk I/O error window is evaluated. The False's message says what was
// read: this boot's records, or, where the reader began at the end
// (readFrom), those since then.
func (mon *Monitor) CaughtUp(nowUsec uint64, now time.Time) {
	mon.caughtUp.Store(true)
	msg := "no matching kernel message in the records read (this boot's, as far as the ring buffer still held them)"
	if !mon.readFrom.IsZero() {
		msg = "no matching kernel message since the monitor began reading at the end of the kernel log at " +
			mon.readFrom.UTC().Format(time.RFC3339) + " (kmsg.from_boot_start = false: the records logged before were not read)"
	}
	for _, t := range mon.Conditions() {
		if c, ok := mon.o.Store.Get(t); ok && c.Status == report.StatusFalse {
			continue
		}
		d, _ := report.Lookup(t)
		mon.o.Store.Set(report.Condition{Type: t, Status: report.StatusFalse, Reason: d.HealthyReason, Message: msg}, now)
	}
	mon.evalWindow(nowUsec, now)
}

// Blind says the reader cannot read the log: a kernel condition that is
// not True (a True one is held for the boot) is Unknown until it can, and
// so is the kernel's part of DisksFailure. Never a healthy False while
// nothing is read.
func (mon *Monitor) Blind(err error, now time.Time) {
	mon.caughtUp.Store(false)
	msg := "cannot read the kernel log: " + err.Error()
	for _, t := range mon.Conditions() {
		mon.o.Store.Set(report.Condition{Type: t, Status: report.StatusUnknown, Reason: report.ReasonCheckFailed, Message: msg}, now)
	}
	mon.o.Store.SetPart(report.SourceKmsg, report.Condition{Type: "DisksFailure", Status: report.StatusUnknown, Reason: report.ReasonCheckFailed, Message: msg}, now)
}

// SetGPU changes whether GPU-only rules apply (a GPU found, or gone, after
// the start). A GPU-only kernel condition that now applies and has no state
// yet (or was set aside as not applicable) is False when the log has been
// read to its end ("since the GPU was detected": GPU lines before that were
// not evaluated), else Unknown until it is. The other kernel conditions are
// not touched.
//
// One read back with a reason this build does not know (report.Store.Aside)
// gets no Unknown placeholder, as at Start: it would be the first Set of its
// type and spend the status and time kept for it (a False since hours
// would be False since the log is read to its end); the log read to its
// end (CaughtUp) takes them, or the False here when it is read already.
func (mon *Monitor) SetGPU(gpu bool, now time.Time) {
	if mon.gpu.Swap(gpu) == gpu || !gpu {
		return
	}
	aside := mon.o.Store.Aside()
	for _, t := range mon.Conditions() {
		d, _ := report.Lookup(t)
		if d.Scope != report.ScopeGPU {
			continue
		}
		if c, ok := mon.o.Store.Get(t); ok && c.Status != report.StatusUnknown {
			continue
		}
		caughtUp := mon.caughtUp.Load()
		if !caughtUp && slices.Contains(aside, t) {
			continue
		}
		c := report.Condition{Type: t, Status: report.StatusUnknown, Reason: report.ReasonNoData, Message: "the kernel log has not been read yet"}
		if caughtUp {
			c.Status, c.Reason, c.Message = report.StatusFalse, d.HealthyReason, "no matching kernel message since the GPU was detected"
		}
		mon.o.Store.Set(c, now)
	}
}

// Handle processes one parsed record. at is the record's wall time.
func (mon *Monitor) Handle(r Record, at time.Time) {
	if mon.beforeHandle != nil {
		mon.beforeHandle(r)
	}
	mon.m.records.Inc()
	mon.lastSeq.Store(r.Seq)
	mon.lastUsec.Store(r.Usec)
	mon.lastAt.Store(at.UnixNano())
	set := mon.use()
	if set.kernelOnly && r.Facility != 0 {
		return
	}
	mon.buf = Unescape(mon.buf[:0], r.Message)
	if isHungReport(mon.buf) {
		// The kernel counted this report down before printing it.
		mon.hung.read(at)
	}
	if n, ok := parseBERTUnprinted(mon.buf); ok {
		// Matches no rule: said, as a fatal error among the records not
		// printed goes unseen.
		bertUnprinted(mon.o.Log, n, strings.TrimSpace(string(mon.buf)))
	}
	if fn, n, ok := parseSuppressed(mon.buf); ok {
		if mon.countSuppressed(fn, n, r.Usec, set.keep()) {
			mon.winGen++
			mon.evalWindow(r.Usec, at)
		}
		return
	}
	mon.matches = set.rules.Matches(mon.matches[:0], mon.buf)
	if len(mon.matches) == 0 {
		return
	}
	msg := strings.TrimSpace(string(mon.buf))
	// A node daemon's name hung in a pod's cgroup is the pod's: its
	// condition match is dropped, and the record's events say so.
	var note string
	mon.matches, note = mon.podTasks(mon.matches, r.Usec)
	// A filesystem remounted read-only on a pod's volume is the volume's:
	// an event instead of the condition.
	mon.matches = mon.podVolumes(set, mon.matches, r.Usec, msg, at)
	for _, m := range mon.matches {
		set.matched[m.Rule.Name].Inc()
		switch m.Rule.Kind {
		case Perm:
			d, _ := report.Lookup(m.Rule.Condition)
			if !d.Scope.Applies(report.RoleWorker, mon.gpu.Load()) {
				continue
			}
			mon.o.Store.Set(report.Condition{Type: m.Rule.Condition, Status: report.StatusTrue, Reason: report.Reason(m.Rule.Reason), Message: msg}, at)
		case Temp:
			if e, _ := report.LookupEvent(m.Rule.Reason); !e.Scope.Applies(report.RoleWorker, mon.gpu.Load()) {
				continue
			}
			mon.o.Store.Emit(report.Event{Reason: m.Rule.Reason, Message: msg + note, Time: at})
		case DiskIOError:
			mon.lastSiteUsec = r.Usec
			mon.o.Store.Emit(report.Event{Reason: m.Rule.Reason, Message: msg, Time: at})
			if !set.ignored(m.Dev) && !mon.devices.fabrics(m.Dev, r.Usec) {
				mon.window.add(ioError{Usec: r.Usec, Dev: m.Dev}, set.keep())
				mon.winGen++
				mon.evalWindow(r.Usec, at)
			}
		}
	}
}

// podTasks drops from ms the condition matches of a critical task named
// as a node daemon (PodGatedTasks) whose cgroup is a pod's (pods), and
// returns what the record's events add to say so ("" when none was).
func (mon *Monitor) podTasks(ms []Match, usec uint64) ([]Match, string) {
	var note string
	out := ms[:0]
	for _, m := range ms {
		if m.Rule.Kind == Perm && m.Pid != "" && gated(m.Task) {
			if cg, ok := mon.pods.podCgroup(m.Pid, m.Task, usec); ok {
				note = podNote(m.Task, cg)
				continue
			}
		}
		out = append(out, m)
	}
	return out, note
}

// podVolumes drops from ms the ReadonlyFilesystem matches whose device
// is a pod's volume (volumes), emitting a PodVolumeReadOnly event for each,
// its message the line's and the device with its mount points, unless
// kmsg.disable turned PodVolumeRule off: then the line is neither the
// event nor the condition.
func (mon *Monitor) podVolumes(set *settings, ms []Match, usec uint64, msg string, at time.Time) []Match {
	out := ms[:0]
	for _, m := range ms {
		if m.Rule.Kind == Perm && m.Rule.Condition == "ReadonlyFilesystem" && m.Dev != "" {
			if pv, ok := mon.volumes.podVolume(m.Dev, usec); ok {
				if set.rules.PodVolumeEvents() {
					// Counted under its own rule, as the event it is;
					// the ReadonlyFilesystem series counts the node's.
					set.matched[PodVolumeRule.Name].Inc()
					mon.o.Store.Emit(report.Event{Reason: report.EventPodVolumeReadOnly, Message: msg + pv.note(), Time: at})
				}
				continue
			}
		}
		out = append(out, m)
	}
	return out
}

func (s *settings) ignored(dev string) bool {
	for _, p := range s.ignore {
		if strings.HasPrefix(dev, p) {
			return true
		}
	}
	return false
}

// Tick re-evaluates the I/O error window at kernel time nowUsec, so that
// DisksFailure clears once the errors have aged out of the window.
// kernel.hung_task_warnings is read again, at most once a minute.
func (mon *Monitor) Tick(nowUsec uint64, now time.Time) {
	mon.evalWindow(nowUsec, now)
	mon.hung.tick(now)
}

// evalWindow sets the kernel's part of DisksFailure (the catalog row's part
// of source kmsg) from the disk I/O errors within the window.
func (mon *Monitor) evalWindow(nowUsec uint64, now time.Time) {
	set := mon.use()
	span := uint64(set.window / time.Microsecond)
	n, devs := mon.window.count(nowUsec, span)
	if n < set.threshold && !mon.caughtUp.Load() {
		return // not known to be healthy before the log is read to its end
	}
	// A full window within the span: errors dropped for room may have been
	// within it too.
	atLeast := ""
	if n >= windowCap {
		atLeast = "at least "
	}
	c := report.Condition{Type: "DisksFailure", Status: report.StatusFalse, Reason: report.ReasonDisksHealthy,
		Message: fmt.Sprintf("the kernel logged %s%d disk I/O errors in the last %s (threshold %d)", atLeast, n, set.window, set.threshold)}
	if n >= set.threshold {
		c.Status, c.Reason = report.StatusTrue, report.ReasonDiskIOErrors
		c.Message = fmt.Sprintf("the kernel logged %s%d disk I/O errors in the last %s (threshold %d) on %s", atLeast, n, set.window, set.threshold, strings.Join(devs, ", "))
	}
	// A start at the end of the log did not read the errors logged before
	// it: until the span has passed since, the count is of a part of it.
	if !mon.readFrom.IsZero() && nowUsec-min(nowUsec, mon.readFromUsec) < span {
		c.Message += ", read since " + mon.readFrom.UTC().Format(time.RFC3339) +
			" only (kmsg.from_boot_start = false: those logged before were not read)"
	}
	// The kernel's rate limit dropped I/O error lines in the window: some
	// may have been a disk's. Said, not counted: which device's they were
	// is not known.
	if now := max(nowUsec, mon.window.newest()); len(mon.suppressedIO) > 0 {
		if k := mon.suppressedWithin(now, span); k > 0 {
			c.Message += fmt.Sprintf("; the kernel suppressed %d I/O error lines in that time (its rate limit, shared by every device): the count is a lower bound", k)
		}
	}
	mon.o.Store.SetPart(report.SourceKmsg, c, now)
}

// windowCap bounds the disk I/O errors the window holds, so that a flood
// of them cannot grow memory (or the state file) without limit. It is at
// least the largest io_error_threshold the configuration allows (1000), so
// that every allowed threshold is judged on the errors themselves.
const windowCap = 1024

// keepSpan is how long the window keeps an error (before the newest one):
// the longest io_error_window the configuration allows, so that a reload
// that widens the window counts the errors already seen, as a fresh start
// over the same records would.
const keepSpan = 24 * time.Hour

// keep returns how long (in microseconds) the window keeps an error: the
// longest span allowed, or the span configured if it is longer.
func (s *settings) keep() uint64 {
	return uint64(max(s.window, keepSpan) / time.Microsecond)
}

// window keeps the kernel times and devices of the disk I/O errors, oldest
// first, in a ring: every error within keep of the newest, at most
// windowCap of them (the oldest dropped for room). It holds more than any
// threshold needs so that a changed threshold or span (Reconfigure) is
// judged on all the errors seen, not only on the newest ones.
type window struct {
	ring []ioError // grows (doubling) up to windowCap, then wraps
	head int       // index of the oldest error in ring
	n    int       // errors held
	devs []string  // reused by count
	// byDev is, for each device, its errors held and the newest one's
	// kernel time: count finds the devices within a span without walking
	// the window.
	byDev map[string]devErrors
}

// devErrors is one device's errors in the window.
type devErrors struct {
	n      int
	newest uint64
}

// at returns the i-th error held, oldest first.
func (w *window) at(i int) ioError { return w.ring[(w.head+i)%len(w.ring)] }

// drop forgets the oldest error.
func (w *window) drop() {
	e := w.ring[w.head]
	if d := w.byDev[e.Dev]; d.n <= 1 {
		delete(w.byDev, e.Dev)
	} else {
		d.n--
		w.byDev[e.Dev] = d
	}
	w.ring[w.head] = ioError{}
	w.head = (w.head + 1) % len(w.ring)
	w.n--
}

// add appends an error, first dropping those more than keep (µs) older than
// it and, when the window is full, the oldest one.
func (w *window) add(e ioError, keep uint64) {
	for w.n > 0 {
		if old := w.at(0).Usec; e.Usec > old && e.Usec-old > keep {
			w.drop()
			continue
		}
		break
	}
	if w.n == windowCap {
		w.drop()
	}
	if w.n == len(w.ring) { // grow, below the cap
		r := make([]ioError, min(max(2*len(w.ring), 8), windowCap))
		w.entries(r[:0])
		w.ring, w.head = r, 0
	}
	w.ring[(w.head+w.n)%len(w.ring)] = e
	w.n++
	if w.byDev == nil {
		w.byDev = map[string]devErrors{}
	}
	d := w.byDev[e.Dev]
	d.n++
	d.newest = max(d.newest, e.Usec)
	w.byDev[e.Dev] = d
}

// dropDevices forgets the errors of every device ignore says; it reports
// whether it forgot any.
func (w *window) dropDevices(ignore func(dev string) bool) bool {
	found := false
	for dev := range w.byDev {
		if ignore(dev) {
			found = true
		}
	}
	if !found {
		return false
	}
	kept := w.entries(nil)
	kept = slices.DeleteFunc(kept, func(e ioError) bool { return ignore(e.Dev) })
	*w = window{devs: w.devs}
	for _, e := range kept {
		w.add(e, ^uint64(0))
	}
	return true
}

// newest is the kernel time of the newest error held (0: none).
func (w *window) newest() uint64 {
	if w.n == 0 {
		return 0
	}
	return w.at(w.n - 1).Usec
}

// entries appends the errors held, oldest first, to dst.
func (w *window) entries(dst []ioError) []ioError {
	for i := range w.n {
		dst = append(dst, w.at(i))
	}
	return dst
}

// count returns how many errors lie within span before now (now 0: the
// newest error's time), and their devices (valid until the next count).
// The errors are in the kernel's order, which is its time's: a binary
// search finds the oldest within the span, and the devices come from each
// one's newest error, so a full window costs no walk (an I/O error flood
// evaluates it at every line).
func (w *window) count(now, span uint64) (int, []string) {
	if w.n == 0 {
		return 0, nil
	}
	if newest := w.at(w.n - 1).Usec; now == 0 || now < newest {
		now = newest
	}
	within := func(usec uint64) bool { return now-usec <= span || usec > now }
	first := sort.Search(w.n, func(i int) bool { return within(w.at(i).Usec) })
	w.devs = w.devs[:0]
	for dev, d := range w.byDev {
		if within(d.newest) {
			w.devs = append(w.devs, dev)
		}
	}
	slices.Sort(w.devs)
	return w.n - first, w.devs
}

// windowEntries appends the errors in the window, oldest first, to dst (the
// reader reuses its cursor's slice: no allocation per record).
func (mon *Monitor) windowEntries(dst []ioError) []ioError { return mon.window.entries(dst) }

// restoreWindow puts back the disk I/O errors saved before a restart within
// the same boot and re-evaluates DisksFailure's kernel part. The errors of
// a device ignored now (ignore_devices changed while the daemon was down)
// are left out, as a fresh start over the same lines would not record
// them.
func (mon *Monitor) restoreWindow(es []ioError, suppressed []suppression) {
	set := mon.use()
	keep := set.keep()
	for _, e := range es {
		if !set.ignored(e.Dev) {
			mon.window.add(e, keep)
		}
	}
	for _, s := range suppressed {
		mon.addSuppressed(s, keep)
	}
	if len(es) > 0 || len(suppressed) > 0 {
		mon.evalWindow(MonotonicNow(), time.Now())
	}
}
