package kmsg

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// FabricsTransports are the transports of NVMe over Fabrics, as a
// controller's sysfs "transport" attribute names them (the kernel's
// nvme_ctrl_ops name; a local drive's is "pcie", a Mac's "apple-nvme"):
// the same list as the NVMe SMART check's (checks/nvme.go).
var FabricsTransports = []string{"tcp", "rdma", "fc", "loop"}

// fabricsRecheck is how long (kernel time) an answer of the device cache
// holds before the device is looked up again: a name is reused once its
// device is gone (a fabrics volume detached, another attached or a drive
// hot-plugged gets nvme3 again), so no answer is kept for good, and a
// flood of errors on one device costs one lookup a minute.
const fabricsRecheck = uint64(time.Minute / time.Microsecond)

// fabricsCacheCap bounds the devices the cache holds (it is emptied when
// full): a name is added only by a disk I/O error that names it.
const fabricsCacheCap = 256

// fabricsAnswer is what the cache holds for one device name.
type fabricsAnswer struct {
	fabrics bool
	known   bool   // the device (or its controller) was found in sysfs
	at      uint64 // kernel time of the lookup
}

// devices looks up, under sysfs, whether a block device named by a disk
// I/O error is a namespace of NVMe over Fabrics, and caches the answer.
// Only the reader's goroutine uses it.
type devices struct {
	sysfs string // "": no lookup (every device is taken for a disk)
	cache map[string]fabricsAnswer
}

// fabrics reports whether dev is a namespace (nvme3n1) or a multipath
// path (nvme4c5n1) of NVMe over Fabrics, or a SCSI disk of an iSCSI session
// (sdb, see lookupSCSI): a volume of a storage array or of an SPDK or
// iSCSI target (Longhorn's, Mayastor's) attached over the network, whose
// I/O errors are the target's or the network's, on every node attached to
// it at once, not a failing disk of this node. usec is the record's kernel
// time. Any other name is not looked up.
//
// A device that is no longer in sysfs when its error line is read (a
// fabrics volume detached after its controller gave up reconnecting: the
// kernel fails the I/O held and removes the namespace, then the
// controller) keeps the answer found for it before, if any; else its
// controller (nvme3 of nvme3n1, nvme5 of nvme4c5n1, which the kernel
// removes after the namespace) decides; with neither, it is taken for a
// disk, as a drive that fails and drops off the bus ("Disabling device
// after reset failure") is. That answer is cached like the others, and
// not kept over a later one: the name may come back as another device.
func (d *devices) fabrics(dev string, usec uint64) bool {
	if d.sysfs == "" {
		return false
	}
	ctrl, nvme := nvmeController(dev)
	if !nvme && !scsiDisk(dev) {
		return false
	}
	// A cached answer costs a map look-up, no allocation.
	old, cached := d.cache[dev]
	if cached && (usec < old.at || usec-old.at < fabricsRecheck) {
		return old.fabrics
	}
	var a fabricsAnswer
	if nvme {
		a = d.lookup(dev, ctrl)
	} else {
		a = d.lookupSCSI(dev)
	}
	a.at = usec
	if !a.known && cached && old.known {
		a.fabrics, a.known = old.fabrics, true
	}
	if d.cache == nil || len(d.cache) >= fabricsCacheCap && !cached {
		d.cache = make(map[string]fabricsAnswer)
	}
	d.cache[dev] = a
	return a.fabrics
}

// lookup finds dev's controllers in sysfs: /sys/block/<dev>/device is the
// controller (a namespace without a multipath head, or a path of one,
// nvme4c5n1), or, for a multipath head, the subsystem (nvme-subsys4),
// which links each of its controllers (nvme4, nvme5). A head is of NVMe
// over Fabrics when every controller of its subsystem is (a local drive
// among them is a disk of this node). Without the device, ctrl (the
// controller its name holds) decides.
func (d *devices) lookup(dev, ctrl string) fabricsAnswer {
	base := filepath.Join(d.sysfs, "block", dev, "device")
	if t, ok := readTransport(base); ok {
		return fabricsAnswer{fabrics: slices.Contains(FabricsTransports, t), known: true}
	}
	if ents, err := os.ReadDir(base); err == nil {
		a := fabricsAnswer{}
		for _, e := range ents {
			if n, ok := strings.CutPrefix(e.Name(), "nvme"); !ok || !isDigits(n) {
				continue // not a controller: the head itself (nvme4n1), an attribute
			}
			t, ok := readTransport(filepath.Join(base, e.Name()))
			if !ok {
				continue
			}
			if !slices.Contains(FabricsTransports, t) {
				return fabricsAnswer{known: true}
			}
			a = fabricsAnswer{fabrics: true, known: true}
		}
		if a.known {
			return a
		}
	}
	if t, ok := readTransport(filepath.Join(d.sysfs, "class", "nvme", "nvme"+ctrl)); ok {
		return fabricsAnswer{fabrics: slices.Contains(FabricsTransports, t), known: true}
	}
	return fabricsAnswer{}
}

// lookupSCSI finds whether a SCSI disk (sdb) is a LUN of an iSCSI
// session: its device path in sysfs runs through the session
// (/sys/devices/platform/host3/session1/target3:0:0/3:0:0:0/block/sdb,
// drivers/scsi/scsi_transport_iscsi.c "session%u"), for iscsi_tcp's
// software initiator and an iSCSI HBA's alike. Such a disk is a volume of
// a target reached over the network (Longhorn's v1 engine exposes each
// volume to its node this way, as do democratic-csi's and NetApp's iSCSI
// volumes): its I/O errors are the target's or the network's, not a
// failing disk of this node. /sys/block/<disk> is a link to the device
// (../devices/...), read as it is: the host root's own path is not looked
// at. A disk gone from sysfs is not known.
func (d *devices) lookupSCSI(dev string) fabricsAnswer {
	link := filepath.Join(d.sysfs, "block", dev)
	p, err := os.Readlink(link)
	if err != nil {
		if _, err := os.Lstat(link); err == nil {
			return fabricsAnswer{known: true} // a directory: no device path to read
		}
		return fabricsAnswer{}
	}
	for _, part := range strings.Split(filepath.ToSlash(p), "/") {
		if n, ok := strings.CutPrefix(part, "session"); ok && isDigits(n) {
			return fabricsAnswer{fabrics: true, known: true}
		}
	}
	return fabricsAnswer{known: true}
}

// scsiDisk reports whether dev is a SCSI disk's name (sd_format_disk_name:
// "sd" and letters, sda to sdzz...), not a partition's.
func scsiDisk(dev string) bool {
	rest, ok := strings.CutPrefix(dev, "sd")
	if !ok || rest == "" {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if rest[i] < 'a' || rest[i] > 'z' {
			return false
		}
	}
	return true
}

func readTransport(dir string) (string, bool) {
	b, err := rawsys.ReadPseudoFile(filepath.Join(dir, "transport"), attrMax)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// nvmeController returns the instance of the controller (3 for nvme3)
// that an NVMe namespace's block device name holds (drivers/nvme/host:
// "nvme%dn%d", the controller's instance or, for a multipath head, its
// subsystem's, which is its first controller's; "nvme%dc%dn%d" for a path
// of a head, the controller's instance after the c), and false for any
// other name.
func nvmeController(dev string) (string, bool) {
	rest, ok := strings.CutPrefix(dev, "nvme")
	if !ok {
		return "", false
	}
	x, rest, ok := strings.Cut(rest, "n")
	if !ok || !isDigits(rest) {
		return "", false
	}
	if sub, c, path := strings.Cut(x, "c"); path {
		if !isDigits(sub) || !isDigits(c) {
			return "", false
		}
		return c, true
	}
	if !isDigits(x) {
		return "", false
	}
	return x, true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
