package scenarios

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LVMConf is the guest's /etc/lvm/lvm.conf: no udev (the guest has none;
// libdevmapper makes the /dev/mapper nodes), no metadata backups, and no
// thin_check (thin-provisioning-tools is not in the guest).
const LVMConf = `config { checks = 1 }
devices {
	obtain_device_list_from_udev = 0
	external_device_info_source = "none"
	use_devicesfile = 0
	scan = [ "/dev" ]
}
activation { udev_sync = 0 udev_rules = 0 monitoring = 0 }
global {
	use_lvmlockd = 0
	thin_check_executable = ""
	thin_repair_executable = ""
}
backup { backup = 0 archive = 0 }
`

// lvmUsage: a volume group on the NVMe drive with every extent allocated
// and a thin pool filled to 15 of its 16 MiB: DiskUsageHigh True for the
// volume group (and naming the pool); the filler volume removed, True for
// the thin pool alone; the storage report lists both.
func lvmUsage(g *Guest) error {
	if _, err := g.Await("DiskUsageHigh", "False", "DiskUsageOK", awaitCheck); err != nil {
		return err
	}
	// vgcreate makes the drive a physical volume; one lvcreate makes the
	// pool and a thin volume in it.
	if err := g.lvm(
		[]string{"vgcreate", "-y", "vgvm", "/dev/nvme0n1"},
		[]string{"lvcreate", "-y", "-L", "16M", "-T", "vgvm/pool", "-V", "64M", "-n", "thin"},
		[]string{"lvcreate", "-y", "-l", "100%FREE", "-n", "fill", "vgvm"},
	); err != nil {
		return err
	}
	if err := DirectWrite("/dev/mapper/vgvm-thin", 15); err != nil {
		return err
	}
	c, err := g.Await("DiskUsageHigh", "True", "VolumeGroupSpaceHigh", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "volume group vgvm 100% of extents allocated (threshold 90%)", "thin pool vgvm/pool 93.75% of data used (threshold 90%)"); err != nil {
		return err
	}
	if _, err := g.Run("lvm", "lvremove", "-y", "vgvm/fill"); err != nil {
		return err
	}
	c, err = g.Await("DiskUsageHigh", "True", "ThinPoolSpaceHigh", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "thin pool vgvm/pool 93.75% of data used (threshold 90%)"); err != nil {
		return err
	}
	if strings.Contains(c.Message, "volume group") {
		return fmt.Errorf("%s: the volume group is no longer full", c)
	}
	vgs, err := g.volumeGroups()
	if err != nil {
		return err
	}
	if len(vgs) != 1 || vgs[0].Name != "vgvm" || len(vgs[0].ThinPools) != 1 ||
		vgs[0].ThinPools[0].Name != "pool" || vgs[0].ThinPools[0].DataPercent != 93.75 {
		return fmt.Errorf("storage report: volume groups %+v, want vgvm with thin pool pool at 93.75%%", vgs)
	}
	return nil
}

// lvmThinOutOfSpace: a thin pool of 8 MiB on a volume group of its own (a
// loop device over a file in /tmp), made with --errorwhenfull y, and 16 MiB
// written to a thin volume in it: dm-thin runs out of data blocks, switches
// the pool to out-of-data-space mode and fails the write past them with
// ENOSPC (without --errorwhenfull it queues it for no_space_timeout, 60 s).
// LVM's lv_attr then has D as its 9th character: DiskUsageHigh True,
// ThinPoolSpaceHigh, "thin pool vgthin/pool out of data space", and the
// storage report's pool entry says so. Before lvm_usage in its boot: it
// removes its volume group and loop device after, and DiskUsageHigh is
// False again for lvm_usage's first wait.
func lvmThinOutOfSpace(g *Guest) error {
	if _, err := g.Await("DiskUsageHigh", "False", "DiskUsageOK", awaitCheck); err != nil {
		return err
	}
	img := "/tmp/vgthin.img"
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	err = f.Truncate(32 << 20)
	f.Close()
	if err != nil {
		return err
	}
	defer os.Remove(img)
	dev, detach, err := AttachLoop(img)
	if err != nil {
		return err
	}
	defer detach()
	removed := false
	defer func() {
		if !removed {
			_, _ = g.Run("lvm", "vgremove", "-y", "-ff", "vgthin")
		}
	}()
	if err := g.lvm(
		[]string{"vgcreate", "-y", "vgthin", dev},
		[]string{"lvcreate", "-y", "-L", "8M", "-T", "vgthin/pool", "--errorwhenfull", "y", "-V", "32M", "-n", "thin"},
	); err != nil {
		return err
	}
	k, err := OpenKmsg()
	if err != nil {
		return err
	}
	defer k.Close()
	k.Drain()
	err = DirectWrite("/dev/mapper/vgthin-thin", 16)
	if !errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("16 MiB written to a thin volume in an 8 MiB pool with --errorwhenfull y: %v, want ENOSPC", err)
	}
	g.Logf("the write: %v", err)
	r, err := k.Await(regexp.MustCompile(`device-mapper: thin: \d+:\d+: switching pool to out-of-data-space \(error IO\) mode`), 10*time.Second)
	if err != nil {
		return err
	}
	g.Logf("kernel: %s", r.Msg)
	lvs, err := g.Run("lvm", "lvs", "--noheadings", "-o", "lv_attr,metadata_percent", "vgthin/pool")
	if err != nil {
		return err
	}
	var attr string
	var meta float64
	if _, err := fmt.Sscan(lvs, &attr, &meta); err != nil || len(attr) < 9 || attr[8] != 'D' {
		return fmt.Errorf("lvs of vgthin/pool: %q, want lv_attr with D (out of data space) and its metadata use", lvs)
	}
	c, err := g.Await("DiskUsageHigh", "True", "ThinPoolSpaceHigh", awaitCheck)
	if err != nil {
		return err
	}
	if err := MessageHas(c, "thin pool vgthin/pool out of data space"); err != nil {
		return err
	}
	if strings.Contains(c.Message, "% of data used") {
		return fmt.Errorf("%s: the pool's health, not its use, is the problem", c)
	}
	vgs, err := g.volumeGroups()
	if err != nil {
		return err
	}
	// Its metadata use as lvs reported it (two decimals): the pool has
	// written none since.
	want := ThinPoolEntry{Name: "pool", SizeBytes: 8 << 20, DataPercent: 100, MetadataPercent: meta, Health: "out of data space"}
	if len(vgs) != 1 || vgs[0].Name != "vgthin" || len(vgs[0].ThinPools) != 1 || vgs[0].ThinPools[0] != want {
		return fmt.Errorf("storage report: volume groups %+v, want vgthin with thin pool %+v", vgs, want)
	}
	removed = true
	if _, err := g.Run("lvm", "vgremove", "-y", "-ff", "vgthin"); err != nil {
		return err
	}
	_, err = g.Await("DiskUsageHigh", "False", "DiskUsageOK", awaitCheck)
	return err
}

// lvm runs lvm with each of cmds in order (vgcreate, lvcreate: a
// scenario's volumes), up to the first that fails.
func (g *Guest) lvm(cmds ...[]string) error {
	for _, args := range cmds {
		if _, err := g.Run("lvm", args...); err != nil {
			return err
		}
	}
	return nil
}

// volumeGroups is the volume groups of the storage report of a
// `autopilot-health check DiskUsageHigh`, logged as it came.
func (g *Guest) volumeGroups() ([]VolumeGroupEntry, error) {
	out, err := g.Check("DiskUsageHigh")
	if err != nil {
		return nil, err
	}
	g.Logf("storage report: %s", compact(out.Report["storage"]))
	var doc struct {
		VolumeGroups []VolumeGroupEntry `json:"volumeGroups"`
	}
	if err := json.Unmarshal(out.Report["storage"], &doc); err != nil {
		return nil, err
	}
	return doc.VolumeGroups, nil
}

// VolumeGroupEntry is a volume group's entry in the storage report (the
// parts the scenarios read).
type VolumeGroupEntry struct {
	Name      string          `json:"name"`
	ThinPools []ThinPoolEntry `json:"thinPools"`
}

// ThinPoolEntry is a thin pool's entry in the storage report.
type ThinPoolEntry struct {
	Name            string  `json:"name"`
	SizeBytes       uint64  `json:"sizeBytes"`
	DataPercent     float64 `json:"dataPercent"`
	MetadataPercent float64 `json:"metadataPercent"`
	Inactive        bool    `json:"inactive"`
	Health          string  `json:"health"`
	Unmeasured      bool    `json:"unmeasured"`
}
