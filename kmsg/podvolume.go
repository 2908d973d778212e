package kmsg

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/hostio"
)

// DefaultPodVolumeDirs are the kubelet's directories under which it mounts
// a pod's volumes (its root directory's pods/<uid>/volumes/...) and the
// staging mounts of them (plugins/kubernetes.io/csi/<driver>/<hash>/globalmount,
// the in-tree plugins' plugins/kubernetes.io/<plugin>/mounts/...).
var DefaultPodVolumeDirs = []string{"/var/lib/kubelet/pods", "/var/lib/kubelet/plugins"}

// mountinfoMax bounds what is read of the mount table (a node with
// hundreds of pods holds a few thousand mounts of ~200 bytes); a table
// longer than that is not judged: the line sets its condition.
const mountinfoMax = 16 << 20

// devAttrMax bounds what is read of /sys/class/block/<name>/dev ("8:1\n").
const devAttrMax = 64

// volumes looks up whether the filesystem a read-only line names is a
// pod's volume: its device mounted only under the kubelet's pod volume
// directories. Only the reader's goroutine uses it.
type volumes struct {
	// sysfs and mountinfo are the host's /sys and the daemon's mount
	// table: either "" no lookup (a replay of another host's lines).
	sysfs, mountinfo string
	// root is the host root ("" or "/": the daemon's own) and dirs the
	// pod volume directories as the host names them (host paths): at
	// each lookup each is looked for in the mount table both as given
	// (under root) and as the kernel writes it (mountDirs).
	root string
	dirs []string
	// read reads at most max bytes of a file, and fails on a longer one
	// (readBounded): tests replace it.
	read func(path string, max int) ([]byte, error)
	// malformed counts the mount table's lines that do not split, at
	// each reading (Options.MalformedMountinfo; nil: not counted); said
	// logs them to log once per change. Only the lookup's goroutine uses
	// said (one lookup at a time: lookup).
	malformed prometheus.Counter
	log       *slog.Logger
	said      hostio.MalformedSaid
	hostLookup
}

func newVolumes(sysfs, proc, root string, dirs []string, malformed prometheus.Counter, log *slog.Logger) volumes {
	v := volumes{sysfs: sysfs, root: root, dirs: dirs, read: readBounded, malformed: malformed, log: log, hostLookup: hostLookup{now: MonotonicNow}}
	if proc != "" {
		v.mountinfo = filepath.Join(proc, "self", "mountinfo")
	}
	return v
}

var errTooLong = errors.New("longer than the bound")

func readBounded(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err == nil && len(b) > max {
		err = errTooLong
	}
	return b, err
}

// podVolume is a filesystem found to be a pod's volume.
type podVolume struct {
	dev, majMin string
	mounts      []string
}

// podVolume reports whether the filesystem on the block device dev (as a
// read-only line names it: sda1, rbd0, dm-3, nvme1n1) is a pod's volume:
// its device number (/sys/class/block/<dev>/dev) is that of mounts in the
// mount table (or the table names /dev/<dev> as their source: btrfs,
// whose mounts carry an anonymous device number), and every one of them
// lies below one of the pod volume directories. usec is the kernel time
// of the line. Not known (no lookup configured, a name that is no block
// device's, the device gone or not mounted, the line over
// podLookupMaxAge old, a read that fails or does not answer within
// podLookupWait, a mount table over mountinfoMax): ok false, and the line
// is the node's, as any mount outside the directories makes it (the root
// disk, with a pod's subPath bind mounts below pods/ among its mounts).
func (v *volumes) podVolume(dev string, usec uint64) (podVolume, bool) {
	if v.sysfs == "" || v.mountinfo == "" || len(v.dirs) == 0 || !blockName(dev) {
		return podVolume{}, false
	}
	read, attr, table, root, dirs := v.read, filepath.Join(v.sysfs, "class", "block", dev, "dev"), v.mountinfo, v.root, v.dirs
	return lookup(&v.hostLookup, usec, func() (podVolume, bool) {
		b, err := read(attr, devAttrMax)
		if err != nil {
			return podVolume{}, false
		}
		majMin := strings.TrimSpace(string(b))
		if !validMajMin(majMin) {
			return podVolume{}, false
		}
		mi, err := read(table, mountinfoMax)
		if err != nil {
			return podVolume{}, false
		}
		mounts, ok, bad, first := podVolumeMounts(mi, majMin, dev, mountDirs(root, dirs))
		v.noteMalformed(table, bad, first)
		return podVolume{dev: dev, majMin: majMin, mounts: mounts}, ok
	})
}

// mountDirs are the pod volume directories dirs (host paths under root)
// as the mount table may write a mount point below them: each as given,
// under root, and as the host resolves it now, its links followed
// (hostio.MountPath: a kubelet moved to a data disk, /var/lib/kubelet ->
// /data/kubelet, mounts its pods' volumes at /data/kubelet/pods/..., at
// host_root "/" too). Resolved at each lookup, not once at the start: a
// link the node makes later (the data disk set up after the daemon
// started) is followed too; a few system calls a directory, against a
// mount table of megabytes.
func mountDirs(root string, dirs []string) []string {
	out := make([]string, 0, 2*len(dirs))
	for _, d := range dirs {
		given := hostio.HostJoin(root, d)
		out = append(out, given)
		if r := hostio.MountPath(root, d); r != given {
			out = append(out, r)
		}
	}
	return out
}

// blockName reports whether s can name an entry of /sys/class/block: a
// single path element (a name with a slash is written with "!" there).
func blockName(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) <= 255 && !strings.ContainsAny(s, "/\x00")
}

// validMajMin reports whether s is "major:minor".
func validMajMin(s string) bool {
	a, b, ok := strings.Cut(s, ":")
	return ok && isDigits(a) && isDigits(b)
}

// noteMalformed counts a reading's malformed lines of the mount table
// (autopilot_health_malformed_lines_total{reader="mountinfo-kmsg"}) and
// logs them once per change (hostio.MalformedSaid): such a table is not
// judged, and every read-only line looked up in it is the node's.
func (v *volumes) noteMalformed(table string, bad int, first *hostio.MalformedMountinfoError) {
	if v.malformed != nil && bad > 0 {
		v.malformed.Add(float64(bad))
	}
	key, text := "", ""
	if first != nil {
		key, text = first.Text, first.Error()
	}
	v.said.Reading(v.log, bad, key, "pod volume lookup: malformed lines in the mount table, which is not judged: a read-only filesystem looked up in it is the node's", "path", table, "first", text)
}

// podVolumeMounts returns the mount points, in the order of the mount
// table mi (/proc/<pid>/mountinfo), of the filesystem on the device
// majMin, named dev: the mounts whose device number (field 3) is majMin
// or whose source is /dev/<dev>; ok when there is one at least and every
// one lies strictly below one of dirs. A line that does not parse makes
// the table not judged (ok false): bad counts such lines, all of the
// table's, and first is the first of them.
//
// The lines are split by hostio's mountinfo reader (hostio.SplitMountinfo:
// at each space, as the kernel writes them, no allocation), which reads a
// line the kernel does not write as malformed.
func podVolumeMounts(mi []byte, majMin, dev string, dirs []string) (mounts []string, ok bool, bad int, first *hostio.MalformedMountinfoError) {
	src := "/dev/" + dev
	outside := false
	for n, line := range hostio.MountinfoLines(mi) {
		f, ok := hostio.SplitMountinfo(line)
		if !ok {
			if bad == 0 {
				first = &hostio.MalformedMountinfoError{Line: n, Text: string(line)}
			}
			bad++
			continue
		}
		if outside || bad > 0 {
			continue // judged already: only malformed lines are counted
		}
		if string(f.Device) != majMin && hostio.UnescapeMountinfo(string(f.Source)) != src {
			continue
		}
		p := hostio.UnescapeMountinfo(string(f.MountPoint))
		if !below(p, dirs) {
			outside = true
			continue
		}
		mounts = append(mounts, p)
	}
	if outside || bad > 0 {
		return nil, false, bad, first
	}
	return mounts, len(mounts) > 0, 0, nil
}

// below reports whether the mount point mp (the kernel writes it
// resolved: no "..", no link) lies strictly below one of dirs.
func below(mp string, dirs []string) bool {
	for _, d := range dirs {
		d = strings.TrimSuffix(d, "/")
		if d != "" && strings.HasPrefix(mp, d+"/") {
			return true
		}
	}
	return false
}

// podVolumeMountsShown bounds the mount points an event names.
const podVolumeMountsShown = 4

// note is what the event of a read-only line on a pod's volume adds to it.
func (pv podVolume) note() string {
	shown := pv.mounts
	more := ""
	if len(shown) > podVolumeMountsShown {
		more = fmt.Sprintf(" and %d more", len(shown)-podVolumeMountsShown)
		shown = shown[:podVolumeMountsShown]
	}
	return fmt.Sprintf(" (the device %s, %s, is mounted only under the kubelet's pod volume directories: %s%s; a pod's volume, not the node's filesystem, so not ReadonlyFilesystem)",
		pv.dev, pv.majMin, strings.Join(shown, ", "), more)
}
