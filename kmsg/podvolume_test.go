package kmsg

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// podVolumeRoot is a fixture host: /sys/class/block/<name>/dev of its block
// devices and the daemon's mount table, proc/self/mountinfo (a node with
// its root disk sda1, a pod's subPath of it bind-mounted below pods/, an
// LVM volume at /data, Ceph RBD volumes, a cloud volume, an iSCSI disk and
// a btrfs volume of pods, one RBD volume also mounted by hand outside, a
// pod's dm-crypt volume, two disks of the kubelet at /var/lib/kubelet,
// one with a pod's subPath of it below pods/).
const podVolumeRoot = "testdata/podvolume"

// volumeMonitor is a monitor that looks devices up in the fixture host (sys
// and proc "" none), the log read to its end, with the events it emits in
// got.
func volumeMonitor(t *testing.T, sys, proc string) (*Monitor, *report.Store, *[]report.Event) {
	t.Helper()
	store := report.NewStore("b")
	var got []report.Event
	store.Observe(events{&got})
	o := opts(t, store)
	o.Sysfs, o.Proc = sys, proc
	mon := NewMonitor(o)
	mon.volumes.now = func() uint64 { return nowUsec }
	mon.pods.now = mon.volumes.now
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	return mon, store, &got
}

// A filesystem the kernel remounted read-only (shut down, stopped) whose
// device is mounted only below the kubelet's pod volume directories is a
// pod's volume (Ceph RBD, iSCSI, a cloud volume attached for one pod):
// replacing the node does not fix it, the volume follows its pod, and one
// storage outage would replace every node attached to it. Such a line is a
// PodVolumeReadOnly event naming the device and its mounts, not
// ReadonlyFilesystem. A mount anywhere else (the root disk, whose pods'
// subPath bind mounts lie below pods/; a volume also mounted by hand), a
// device that is not mounted or not in sysfs, a line more than a minute
// old, no sysfs (a replay): ReadonlyFilesystem as before.
func TestPodVolumeReadOnlyIsNotReadonlyFilesystem(t *testing.T) {
	sys, proc := filepath.Join(podVolumeRoot, "sys"), filepath.Join(podVolumeRoot, "proc")
	const sec = uint64(time.Second / time.Microsecond)
	const (
		rbd0Global = "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/0d9a3c4b5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f80/globalmount/0001-0009-rook-ceph-0000000000000002-4c1f2a3b"
		rbd0Pod    = "/var/lib/kubelet/pods/6f1c5a8e-1b2d-4c3e-9f40-5a6b7c8d9e0f/volumes/kubernetes.io~csi/pvc-2b7e41c3-9a1d-4f52-8c6e-0d3f5a7b9c11/mount"
	)
	for _, tc := range []struct {
		name, sys, line string
		usec            uint64
		pod             bool
		note            string // the event's, after the line
	}{
		{name: "ext4 on a Ceph RBD volume", line: "EXT4-fs (rbd0): Remounting filesystem read-only", pod: true,
			note: " (the device rbd0, 252:0, is mounted only under the kubelet's pod volume directories: " + rbd0Global + ", " + rbd0Pod +
				"; a pod's volume, not the node's filesystem, so not ReadonlyFilesystem)"},
		{name: "ext4 on a cloud volume", line: "EXT4-fs (nvme1n1): Remounting filesystem read-only", pod: true},
		{name: "an XFS shutdown on an iSCSI disk", pod: true,
			line: "XFS (sdc): Log I/O Error (0x2) detected at xlog_ioend_work+0x6e/0x70 [xfs] (fs/xfs/xfs_log.c:1378).  Shutting down filesystem."},
		{name: "btrfs, its mount's anonymous device number, its source /dev/sdb2", line: "BTRFS error (device sdb2 state EA): forced readonly", pod: true},
		{name: "the root disk, a pod's subPath of it below pods/", line: "EXT4-fs (sda1): Remounting filesystem read-only"},
		{name: "an LVM volume at /data", line: "XFS (dm-3): Metadata I/O Error (0x1) detected at xfs_trans_read_buf_map+0x2a1/0x310 [xfs] (fs/xfs/xfs_trans_buf.c:296).  Shutting down filesystem."},
		{name: "a pod's volume also mounted outside", line: "EXT4-fs (rbd1): Remounting filesystem read-only"},
		{name: "the kubelet's own disk at /var/lib/kubelet, a pod's subPath of it below pods/", line: "EXT4-fs (sde): Remounting filesystem read-only"},
		{name: "the kubelet's own disk at /var/lib/kubelet, nothing below",
			line: "XFS (sdf): Log I/O Error (0x2) detected at xlog_ioend_work+0x6e/0x70 [xfs] (fs/xfs/xfs_log.c:1378).  Shutting down filesystem."},
		{name: "a pod's encrypted volume, dm-crypt, its source /dev/mapper/...", line: "EXT4-fs (dm-5): Remounting filesystem read-only", pod: true},
		{name: "a mount beside pods/ whose name starts the same", line: "EXT4-fs (sdd): Remounting filesystem read-only"},
		{name: "a device not mounted", line: "EXT4-fs (loop0): Remounting filesystem read-only"},
		{name: "a device gone from sysfs", line: "EXT4-fs (rbd7): Remounting filesystem read-only"},
		{name: "a line from more than a minute ago", line: "EXT4-fs (rbd0): Remounting filesystem read-only", usec: nowUsec - 61*sec},
		{name: "a line from a minute ago", line: "EXT4-fs (rbd0): Remounting filesystem read-only", usec: nowUsec - 60*sec, pod: true},
		{name: "no sysfs (a replay)", sys: "-", line: "EXT4-fs (rbd0): Remounting filesystem read-only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, p := sys, proc
			if tc.sys == "-" {
				s = ""
			}
			mon, store, got := volumeMonitor(t, s, p)
			usec := tc.usec
			if usec == 0 {
				usec = nowUsec - sec
			}
			mon.Handle(rec(usec, tc.line), t0)
			c, _ := store.Get("ReadonlyFilesystem")
			if !tc.pod {
				if c.Status != report.StatusTrue || c.Reason != report.ReasonFilesystemIsReadOnly || c.Message != tc.line {
					t.Errorf("ReadonlyFilesystem %+v, want True with the line", c)
				}
				if len(*got) != 0 {
					t.Errorf("events %+v, want none", *got)
				}
				if n := testutil.ToFloat64(mon.cur.matched["PodVolumeReadOnly"]); n != 0 {
					t.Errorf("PodVolumeReadOnly counted %v matches, want 0", n)
				}
				return
			}
			if c.Status != report.StatusFalse {
				t.Errorf("ReadonlyFilesystem %+v, want False: the filesystem is a pod's volume", c)
			}
			if len(*got) != 1 || (*got)[0].Reason != report.EventPodVolumeReadOnly {
				t.Fatalf("events %+v, want one PodVolumeReadOnly", *got)
			}
			ev := (*got)[0].Message
			if !strings.HasPrefix(ev, tc.line+" (the device ") || !strings.Contains(ev, "/var/lib/kubelet/") {
				t.Errorf("event message %q, want the line, the device and its mounts", ev)
			}
			if tc.note != "" && ev != tc.line+tc.note {
				t.Errorf("event message\n%q, want\n%q", ev, tc.line+tc.note)
			}
			if n := testutil.ToFloat64(mon.cur.matched["ReadonlyFilesystem"]); n != 0 {
				t.Errorf("ReadonlyFilesystem counted %v matches, want 0", n)
			}
			// autopilot_health_kmsg_matches_total{rule="PodVolumeReadOnly"}.
			if n := testutil.ToFloat64(mon.m.matchedVec.WithLabelValues("PodVolumeReadOnly")); n != 1 {
				t.Errorf("PodVolumeReadOnly counted %v matches, want 1", n)
			}
		})
	}
}

// The mount table is read as the line is: a device mounted below pods/
// when one line is read and outside by the next is the node's then; a
// mount table that cannot be read, or does not parse, leaves the line to
// set the condition.
func TestPodVolumeMountTableFailsTowardsTheNode(t *testing.T) {
	sys := filepath.Join(podVolumeRoot, "sys")
	fixture, err := os.ReadFile(filepath.Join(podVolumeRoot, "proc", "self", "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	line := "EXT4-fs (rbd0): Remounting filesystem read-only"
	for _, tc := range []struct {
		name string
		mi   []byte // nil: no mount table
	}{
		{name: "no mount table"},
		{name: "a line without the separator", mi: append(append([]byte{}, fixture...), "600 22 8:64 / /x rw\n"...)},
		// Lines the kernel does not write, which hostio's reader
		// refuses as DiskUsageHigh's does (before, the lookup read past
		// them): an empty filesystem type, an empty device number, a
		// line that begins with a space.
		{name: "a line with an empty filesystem type", mi: append(append([]byte{}, fixture...), "600 22 8:64 / /x rw -  /dev/sde rw\n"...)},
		{name: "a line with an empty device number", mi: append(append([]byte{}, fixture...), "600 22  / /x rw - ext4 /dev/sde rw\n"...)},
		{name: "a line beginning with a space", mi: append(append([]byte{}, fixture...), " 600 22 8:64 / /x rw - ext4 /dev/sde rw\n"...)},
		{name: "a mount of the device outside, added", mi: append(append([]byte{}, fixture...),
			"600 22 252:0 / /var/lib/kubelet rw,relatime shared:260 - ext4 /dev/rbd0 rw\n"...)},
		{name: "a mount of the device by its source only, outside", mi: append(append([]byte{}, fixture...),
			"600 22 0:77 / /srv rw,relatime shared:260 - ext4 /dev/rbd0 rw\n"...)},
		{name: "a mount of the device at the pods directory itself", mi: append(append([]byte{}, fixture...),
			"600 22 252:0 / /var/lib/kubelet/pods rw,relatime shared:260 - ext4 /dev/rbd0 rw\n"...)},
		// The kernel escapes a space, tab, newline and backslash in a path,
		// nothing else: a bind mount at /srv of a directory whose name
		// holds a \v or a U+00A0 is at /srv, not at the piece of its root
		// after that character.
		{name: "a mount of the device outside, its root's name with a \\v", mi: append(append([]byte{}, fixture...),
			"600 22 252:0 /srv/a\v/var/lib/kubelet/pods/x /srv rw,relatime shared:260 - ext4 /dev/rbd0 rw\n"...)},
		{name: "a mount of the device outside, its root's name with a U+00A0", mi: append(append([]byte{}, fixture...),
			"600 22 252:0 /srv/a\u00a0/var/lib/kubelet/pods/x /srv rw,relatime shared:260 - ext4 /dev/rbd0 rw\n"...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			if tc.mi != nil {
				if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), tc.mi, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			mon, store, got := volumeMonitor(t, sys, proc)
			mon.Handle(rec(nowUsec-1, line), t0)
			if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue || c.Message != line {
				t.Errorf("ReadonlyFilesystem %+v, want True", c)
			}
			if len(*got) != 0 {
				t.Errorf("events %+v, want none", *got)
			}
		})
	}
}

// A mount table longer than the bound is not judged: a mount outside may
// be in the part not read.
func TestPodVolumeMountTableOverTheBound(t *testing.T) {
	mon, store, _ := volumeMonitor(t, filepath.Join(podVolumeRoot, "sys"), filepath.Join(podVolumeRoot, "proc"))
	read := mon.volumes.read
	mon.volumes.read = func(path string, max int) ([]byte, error) {
		if filepath.Base(path) == "mountinfo" {
			max = 512 // the fixture is longer
		}
		return read(path, max)
	}
	line := "EXT4-fs (rbd0): Remounting filesystem read-only"
	mon.Handle(rec(nowUsec-1, line), t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
		t.Errorf("ReadonlyFilesystem %+v, want True: the table was cut", c)
	}
	if _, err := readBounded(filepath.Join(podVolumeRoot, "proc", "self", "mountinfo"), 512); !errors.Is(err, errTooLong) {
		t.Errorf("readBounded over the bound: %v, want errTooLong", err)
	}
}

// A lookup that does not answer (the mount table waits for the kernel's
// namespace lock, a sysfs read for a device being torn down) holds the
// reader for podLookupWait at most: the line then sets ReadonlyFilesystem.
// While it hangs no other lookup starts; once it returns, devices are
// looked up again.
func TestHungVolumeLookupFailsTowardsTheNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var reads atomic.Int32
		var hang atomic.Bool
		hang.Store(true)
		mon, store, got := volumeMonitor(t, filepath.Join(podVolumeRoot, "sys"), filepath.Join(podVolumeRoot, "proc"))
		read := mon.volumes.read
		mon.volumes.read = func(path string, max int) ([]byte, error) {
			reads.Add(1)
			if hang.Load() {
				<-release
			}
			return read(path, max)
		}
		line := "EXT4-fs (rbd0): Remounting filesystem read-only"
		start := time.Now()
		mon.Handle(rec(nowUsec-1, line), t0)
		if waited := time.Since(start); waited != podLookupWait {
			t.Errorf("the reader waited %v for the hung lookup, want %v", waited, podLookupWait)
		}
		if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue {
			t.Errorf("ReadonlyFilesystem %+v after a hung lookup, want True", c)
		}
		start = time.Now()
		mon.Handle(rec(nowUsec-1, "EXT4-fs (nvme1n1): Remounting filesystem read-only"), t0)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("a line while the lookup hangs waited %v, want none", waited)
		}
		if n := reads.Load(); n != 1 {
			t.Errorf("%d reads while the first hangs, want 1", n)
		}
		if c, _ := store.Get("ReadonlyFilesystem"); !strings.HasPrefix(c.Message, "EXT4-fs (nvme1n1)") {
			t.Errorf("ReadonlyFilesystem %+v, want the second line's", c)
		}
		// A storm of read-only lines while it hangs: none waits, none
		// starts a lookup of its own (no goroutine per line).
		goroutines := runtime.NumGoroutine()
		start = time.Now()
		for range 1000 {
			mon.Handle(rec(nowUsec-1, "EXT4-fs (nvme1n1): Remounting filesystem read-only"), t0)
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("1,000 lines while the lookup hangs waited %v, want none", waited)
		}
		if n := reads.Load(); n != 1 {
			t.Errorf("%d reads after 1,000 lines while the first hangs, want 1", n)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			t.Errorf("%d goroutines after 1,000 lines while the lookup hangs, %d before", n, goroutines)
		}
		hang.Store(false)
		close(release)
		synctest.Wait()
		mon.Handle(rec(nowUsec-1, "XFS (sdc): Log I/O Error Detected. Shutting down filesystem"), t0)
		if len(*got) != 1 || (*got)[0].Reason != report.EventPodVolumeReadOnly {
			t.Errorf("events %+v, want a PodVolumeReadOnly once the hung lookup returned", *got)
		}
	})
}

// Every form of the ReadonlyFilesystem rule names its device; a custom
// rule's dev group may hold anything, and only a name of /sys/class/block
// is looked up, never a path out of it; a custom rule without one sets the
// condition as before.
func TestReadonlyFilesystemDevice(t *testing.T) {
	rs, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	for line, dev := range map[string]string{
		"EXT4-fs (rbd0): Remounting filesystem read-only":          "rbd0",
		"EXT2-fs (sdb1): error: remounting filesystem read-only":   "sdb1",
		"BTRFS info (device sda2): forced readonly":                "sda2",
		"BTRFS error (device nvme0n1p2 state EA): forced readonly": "nvme0n1p2",
		"BTRFS info (device dm-2: state EA): forced readonly":      "dm-2",
		"F2FS-fs (sdb1): Stopped filesystem due to reason: 3":      "sdb1",
		"F2FS-fs (mmcblk0p2): Remounting filesystem read-only":     "mmcblk0p2",
		"XFS (dm-3): Metadata I/O Error (0x1) detected at xfs_trans_read_buf_map+0x2a1/0x310 [xfs] (fs/xfs/xfs_trans_buf.c:296).  Shutting down filesystem.": "dm-3",
		"XFS (sda3): Log I/O Error Detected. Shutting down filesystem":                                                                                       "sda3",
	} {
		ms := rs.Matches(nil, []byte(line))
		if len(ms) != 1 || ms[0].Rule.Name != "ReadonlyFilesystem" || ms[0].Dev != dev {
			t.Errorf("%q: matches %+v, want ReadonlyFilesystem on %s", line, ms, dev)
		}
	}

	sys := t.TempDir()
	// A dev file out of /sys/class/block, where "../x" would lead.
	if err := os.MkdirAll(filepath.Join(sys, "class", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "class", "x", "dev"), []byte("252:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, pattern := range []string{`^ro: (?P<dev>.+)$`, `^ro: .+$`} {
		store := report.NewStore("b")
		rs, err := Compile([]Rule{{Name: "ReadonlyFilesystem", Kind: Perm, Condition: "ReadonlyFilesystem", Reason: "FilesystemIsReadOnly",
			Pattern: pattern}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		mon := NewMonitor(Options{Rules: rs, Store: store, Sysfs: sys, Proc: filepath.Join(podVolumeRoot, "proc")})
		mon.volumes.now = func() uint64 { return nowUsec }
		mon.Start(t0, t0)
		mon.CaughtUp(0, t0)
		for _, dev := range []string{"../x", "..", "rbd0"} {
			mon.Handle(rec(nowUsec-1, "ro: "+dev), t0)
			if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue || c.Message != "ro: "+dev {
				t.Errorf("pattern %s, device %q: ReadonlyFilesystem %+v, want True", pattern, dev, c)
			}
		}
	}
}

// Only a ReadonlyFilesystem line looks its device up: the lines of the
// other rules that name a device (a disk I/O error, an ext4 error) or a
// task read neither sysfs nor the mount table.
func TestPodVolumeLookupOnlyForReadonlyLines(t *testing.T) {
	mon, _, _ := volumeMonitor(t, filepath.Join(podVolumeRoot, "sys"), filepath.Join(podVolumeRoot, "proc"))
	var reads []string
	read := mon.volumes.read
	mon.volumes.read = func(path string, max int) ([]byte, error) {
		reads = append(reads, path)
		return read(path, max)
	}
	for _, line := range []string{
		"I/O error, dev rbd0, sector 2048 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 2",
		"EXT4-fs error (device rbd0): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0",
		"EXT4-fs warning (device rbd0): ext4_end_bio:343: I/O error 10 writing to inode 12",
		"INFO: task kubelet:128 blocked for more than 120 seconds.",
	} {
		mon.Handle(rec(nowUsec-1, line), t0)
	}
	if len(reads) != 0 {
		t.Errorf("reads %q for lines of other rules, want none", reads)
	}
	mon.Handle(rec(nowUsec-1, "EXT4-fs (rbd0): Remounting filesystem read-only"), t0)
	if len(reads) != 2 {
		t.Errorf("reads %q for a ReadonlyFilesystem line, want the device's number and the mount table", reads)
	}
}

// kmsg.disable = ["PodVolumeReadOnly"] turns the pod volume events off, as
// any rule's name turns its lines off: a ReadonlyFilesystem line on a
// pod's volume is then neither the event nor the condition (the volume is
// still not the node's), and a line of the node's filesystem sets the
// condition as ever. A reload that takes the name out of kmsg.disable
// brings the events back at the next line. No other rule takes the name or
// the kind.
func TestPodVolumeReadOnlyDisabled(t *testing.T) {
	rules, err := BuildRules([]string{"PodVolumeReadOnly"}, nil)
	if err != nil {
		t.Fatalf("kmsg.disable = [\"PodVolumeReadOnly\"]: %v", err)
	}
	rs, err := Compile(rules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	if rs.PodVolumeEvents() {
		t.Error("PodVolumeEvents with PodVolumeReadOnly disabled")
	}
	mon, store, got := volumeMonitor(t, filepath.Join(podVolumeRoot, "sys"), filepath.Join(podVolumeRoot, "proc"))
	o := mon.o
	o.Rules = rs
	if ch := mon.Reconfigure(o); len(ch.Removed) != 1 || ch.Removed[0] != "PodVolumeReadOnly" || len(ch.Added)+len(ch.Changed) != 0 {
		t.Errorf("Reconfigure without PodVolumeReadOnly: %+v, want it removed", ch)
	}
	mon.Handle(rec(nowUsec-1, "EXT4-fs (rbd0): Remounting filesystem read-only"), t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Errorf("ReadonlyFilesystem %+v after a pod volume's line, PodVolumeReadOnly disabled: want False", c)
	}
	if len(*got) != 0 {
		t.Errorf("events %+v with PodVolumeReadOnly disabled, want none", *got)
	}
	// A disabled rule's series is dropped, and nothing counts it.
	if n := testutil.CollectAndCount(mon.m.matchedVec); n != len(rules) {
		t.Errorf("%d series of the match counter, want %d (the rules in effect)", n, len(rules))
	}
	if _, ok := mon.cur.matched["PodVolumeReadOnly"]; ok {
		t.Error("a PodVolumeReadOnly series with the rule disabled")
	}

	all, err := Compile(DefaultRules, DefaultCriticalTasks)
	if err != nil {
		t.Fatal(err)
	}
	o.Rules = all
	if ch := mon.Reconfigure(o); len(ch.Added) != 1 || ch.Added[0] != "PodVolumeReadOnly" {
		t.Errorf("Reconfigure with PodVolumeReadOnly again: %+v, want it added", ch)
	}
	mon.Handle(rec(nowUsec-1, "EXT4-fs (nvme1n1): Remounting filesystem read-only"), t0)
	if len(*got) != 1 || (*got)[0].Reason != report.EventPodVolumeReadOnly {
		t.Errorf("events %+v after the reload, want one PodVolumeReadOnly", *got)
	}
	if n := testutil.ToFloat64(mon.cur.matched["PodVolumeReadOnly"]); n != 1 {
		t.Errorf("PodVolumeReadOnly counted %v matches after the reload, want 1", n)
	}
	line := "EXT4-fs (sda1): Remounting filesystem read-only"
	mon.Handle(rec(nowUsec-1, line), t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusTrue || c.Message != line {
		t.Errorf("ReadonlyFilesystem %+v after the node's line, want True", c)
	}

	for _, r := range []Rule{
		{Name: "PodVolumeReadOnly", Kind: Temp, Reason: "PodVolumeReadOnly", Pattern: `^x`},
		{Name: "Mine", Kind: PodVolume, Reason: "PodVolumeReadOnly"},
		{Name: "PodVolumeReadOnly", Kind: PodVolume, Reason: "PodVolumeReadOnly", Pattern: `^x`},
		// A custom rule that copies the built-in one field for field.
		{Name: "PodVolumeReadOnly", Kind: PodVolume, Reason: "PodVolumeReadOnly"},
	} {
		if _, err := Compile([]Rule{r}, nil); err == nil || !strings.Contains(err.Error(), "cannot be replaced or copied") {
			t.Errorf("rule %+v: %v, want refused", r, err)
		}
	}
}

// PodVolumeReadOnly is in effect only where a ReadonlyFilesystem rule gives
// it lines: a rule of that condition with the device in a (?P<dev>...)
// group. With ReadonlyFilesystem disabled (README: it "still turns off
// both"), or replaced by a custom rule without the group, no line can be
// the event, and the rule is not listed by `kmsg rules` ("the rules in
// effect") nor exported as a series of the match counter at 0.
func TestPodVolumeReadOnlyGoesWithReadonlyFilesystem(t *testing.T) {
	for _, c := range []struct {
		name    string
		disable []string
		custom  []Rule
		want    bool
	}{
		{name: "defaults", want: true},
		{name: "ReadonlyFilesystem disabled", disable: []string{"ReadonlyFilesystem"}},
		{name: "both disabled", disable: []string{"ReadonlyFilesystem", "PodVolumeReadOnly"}},
		{name: "ReadonlyFilesystem replaced without a dev group", custom: []Rule{
			{Name: "ReadonlyFilesystem", Kind: Perm, Condition: "ReadonlyFilesystem", Reason: "FilesystemIsReadOnly", Pattern: `^EXT4-fs \(\S+\): Remounting filesystem read-only`}}},
		{name: "ReadonlyFilesystem replaced with a dev group", want: true, custom: []Rule{
			{Name: "ReadonlyFilesystem", Kind: Perm, Condition: "ReadonlyFilesystem", Reason: "FilesystemIsReadOnly", Pattern: `^EXT4-fs \((?P<dev>\S+)\): Remounting filesystem read-only`}}},
		{name: "ReadonlyFilesystem disabled, a custom rule of its condition with a dev group", want: true, disable: []string{"ReadonlyFilesystem"}, custom: []Rule{
			{Name: "MyReadOnly", Kind: Perm, Condition: "ReadonlyFilesystem", Reason: "FilesystemIsReadOnly", Pattern: `^XFS \((?P<dev>[^)]+)\): Corruption`}}},
	} {
		rules, err := BuildRules(c.disable, c.custom)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		rs, err := Compile(rules, DefaultCriticalTasks)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		listed := slices.ContainsFunc(rs.Rules(), func(r Rule) bool { return r.Name == PodVolumeRule.Name })
		if listed != c.want || rs.PodVolumeEvents() != c.want {
			t.Errorf("%s: PodVolumeReadOnly listed %v, events %v; want %v", c.name, listed, rs.PodVolumeEvents(), c.want)
		}
	}
}

// Lines this machine's kernel (6.1) wrote for mounts an operator makes, in
// a table otherwise the fixture's: `mount -t tmpfs "" /mnt` (an empty
// source, "tmpfs  rw"), a source and a path with a space, a path with a
// tab (escaped), with a U+00A0, a \v and a \r (not escaped). The table is
// judged (held: the lookup reads them as the kernel wrote them), so rbd0's
// remount is still the pod's volume.
func TestPodVolumeLookupReadsTheKernelsOwnOddLines(t *testing.T) {
	fixture, err := os.ReadFile(filepath.Join(podVolumeRoot, "proc", "self", "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	mi := append(fixture, ""+
		"201 22 0:58 / /mnt rw,relatime - tmpfs  rw\n"+
		"202 22 0:59 / /tmp/cr/a\\040b rw,relatime - tmpfs src\\040with\\040space rw\n"+
		"203 22 0:60 / /tmp/cr/t\\011ab rw,relatime - tmpfs tabby rw\n"+
		"204 22 7:0 / /tmp/cr/n\u00a0bsp rw,relatime - ext4 /dev/loop0 rw\n"+
		"205 22 0:62 / /tmp/cr/v\vx rw,relatime - tmpfs vv rw\n"+
		"206 22 0:63 / /tmp/cr/cr\rx rw,relatime - tmpfs cr\rs rw\n"...)
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), mi, 0o644); err != nil {
		t.Fatal(err)
	}
	mon, store, got := volumeMonitor(t, filepath.Join(podVolumeRoot, "sys"), proc)
	line := "EXT4-fs (rbd0): Remounting filesystem read-only"
	mon.Handle(rec(nowUsec-1, line), t0)
	if c, _ := store.Get("ReadonlyFilesystem"); c.Status != report.StatusFalse {
		t.Errorf("ReadonlyFilesystem %+v, want False: the table is judged, rbd0 is a pod's volume", c)
	}
	if len(*got) != 1 || (*got)[0].Reason != report.EventPodVolumeReadOnly {
		t.Errorf("events %+v, want one PodVolumeReadOnly", *got)
	}
}
