package kmsg

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// testdata/sysfs is a host's sysfs as the NVMe driver lays it out
// (drivers/nvme/host/core.c, multipath.c): /sys/block/<disk>/device is the
// controller of a namespace without a multipath head (nvme0n1: PCIe;
// nvme3n1: TCP; nvme6n1: RDMA) and of a path of a head (nvme1c1n1: PCIe;
// nvme4c5n1, nvme4c10n1: TCP), and the subsystem of a head (nvme1n1: a
// local drive whose subsystem can have several controllers, as many
// enterprise drives say; nvme4n1: a volume of a storage target reached
// over TCP through nvme5 and nvme10, its first controller nvme4, whose
// instance the subsystem and the head keep, gone and reconnected as
// nvme10), which links its controllers. /sys/class/nvme holds nvme8
// (TCP), whose namespace nvme8n1 is gone. sda is a SATA disk; sdb a LUN of
// the iSCSI session session1 (drivers/scsi/scsi_transport_iscsi.c), as
// Longhorn's v1 engine attaches each volume. The PCI addresses and SCSI
// ids have _ for : (a Go module's file names cannot hold a colon).
const fixtureSysfs = "testdata/sysfs"

// Disk I/O errors of NVMe over Fabrics namespaces (a Longhorn v2 or
// Mayastor volume, a storage array's, attached over TCP or RDMA) are the
// target's or the network's, on every node attached to it: they do not
// count towards DisksFailure. The node's own NVMe drives' do, with or
// without a multipath head, and so does a device sysfs knows nothing of.
func TestNVMeFabricsIOErrorsAreNotDiskFailures(t *testing.T) {
	store := report.NewStore("b")
	o := opts(t, store)
	o.Sysfs = fixtureSysfs
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.CaughtUp(0, t0)
	sec := uint64(time.Second / time.Microsecond)
	at := uint64(0)
	ioerr := func(dev string) {
		at += sec
		mon.Handle(rec(at, fmt.Sprintf("I/O error, dev %s, sector 2048 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2", dev)), t0.Add(time.Duration(at)*time.Microsecond))
	}
	status := func() report.Condition { c, _ := store.Part(report.SourceKmsg, "DisksFailure"); return c }
	for range 10 {
		for _, dev := range []string{"nvme3n1", "nvme4n1", "nvme4c5n1", "nvme4c10n1", "nvme6n1", "nvme8n1", "sdb"} {
			ioerr(dev)
		}
	}
	if c := status(); c.Status != report.StatusFalse || !strings.Contains(c.Message, "logged 0 disk I/O errors") {
		t.Fatalf("70 I/O errors of NVMe over Fabrics namespaces and an iSCSI LUN: %+v; want False, none counted", c)
	}
	for _, dev := range []string{"nvme0n1", "nvme1n1", "nvme1c1n1", "sda"} {
		ioerr(dev)
	}
	if c := status(); c.Status != report.StatusFalse || !strings.Contains(c.Message, "logged 4 disk I/O errors") {
		t.Fatalf("4 I/O errors of local drives: %+v; want False, 4 counted", c)
	}
	ioerr("nvme9n1")
	if c := status(); c.Status != report.StatusTrue || !strings.HasSuffix(c.Message, "on nvme0n1, nvme1c1n1, nvme1n1, nvme9n1, sda") {
		t.Fatalf("5 I/O errors of local drives: %+v; want True naming them", c)
	}
}

// The answer for a device is looked up once and cached (a flood of errors
// on one device reads sysfs once a minute), and looked up again after a
// minute: the name may be another device's by then. A device gone from
// sysfs keeps the answer found for it while it was there; one never found
// is judged by its controller, or else counted. The cache is bounded.
func TestNVMeFabricsLookupCached(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("block/nvme3n1/device/transport", "tcp")
	d := devices{sysfs: root}
	minute := uint64(time.Minute / time.Microsecond)
	if !d.fabrics("nvme3n1", 1) {
		t.Fatal("nvme3n1 of a tcp controller: not fabrics")
	}
	// nvme3 is now a local drive: within a minute, the cached answer.
	write("block/nvme3n1/device/transport", "pcie")
	if !d.fabrics("nvme3n1", 1+minute/2) {
		t.Fatal("nvme3n1 looked up again within a minute")
	}
	if d.fabrics("nvme3n1", 2+minute) {
		t.Fatal("nvme3n1, a local drive's namespace now, not looked up again after a minute")
	}
	// Gone: the answer found before is kept.
	write("block/nvme5n1/device/transport", "rdma")
	if !d.fabrics("nvme5n1", 3*minute) {
		t.Fatal("nvme5n1 of an rdma controller: not fabrics")
	}
	os.RemoveAll(filepath.Join(root, "block/nvme5n1"))
	if !d.fabrics("nvme5n1", 5*minute) {
		t.Fatal("nvme5n1 gone from sysfs: the answer found while it was there not kept")
	}
	// Never seen, gone: its controller decides (nvme7 of nvme2c7n1), and
	// without one it is a disk.
	write("class/nvme/nvme7/transport", "tcp")
	if !d.fabrics("nvme2c7n1", 5*minute) || !d.fabrics("nvme7n2", 5*minute) {
		t.Fatal("namespaces gone from sysfs whose controller nvme7 is tcp: not fabrics")
	}
	if d.fabrics("nvme9n1", 5*minute) {
		t.Fatal("nvme9n1, unknown to sysfs: fabrics")
	}
	// A SCSI disk is looked up by its device path: a LUN of an iSCSI
	// session is not a disk of this node, a disk behind another host
	// adapter is; gone, it keeps its answer.
	if err := os.MkdirAll(filepath.Join(root, "devices/platform/host4/session2/target4_0_0/4_0_0_0/block/sdc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../devices/platform/host4/session2/target4_0_0/4_0_0_0/block/sdc", filepath.Join(root, "block", "sdc")); err != nil {
		t.Fatal(err)
	}
	write("block/sda/device/transport", "tcp") // not a transport SCSI has
	if !d.fabrics("sdc", 5*minute) {
		t.Error("sdc of iSCSI session2: not counted as a network volume")
	}
	os.Remove(filepath.Join(root, "block", "sdc"))
	if !d.fabrics("sdc", 7*minute) {
		t.Error("sdc gone from sysfs: the answer found while it was there not kept")
	}
	if d.fabrics("sdd", 5*minute) {
		t.Error("sdd, unknown to sysfs: taken for a network volume")
	}
	// Other names are neither NVMe namespaces nor SCSI disks.
	for _, dev := range []string{"sda", "sda1", "sd", "sdA", "nvme3", "nvme-subsys3", "nvmen1", "nvme1cn1", "nvme1n", "nvme1n1p1"} {
		if d.fabrics(dev, 5*minute) {
			t.Errorf("%s: fabrics", dev)
		}
	}
	for i := range 2 * fabricsCacheCap {
		d.fabrics(fmt.Sprintf("nvme%dn1", 100+i), 6*minute)
	}
	if len(d.cache) > fabricsCacheCap {
		t.Errorf("the cache holds %d devices, want at most %d", len(d.cache), fabricsCacheCap)
	}
	// Without a sysfs (a replay), nothing is looked up.
	if (&devices{}).fabrics("nvme3n1", 1) {
		t.Error("no sysfs: fabrics")
	}
}
