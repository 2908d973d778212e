package scenarios

import (
	"encoding/json"
	"fmt"
	"strings"
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
	for _, args := range [][]string{
		{"vgcreate", "-y", "vgvm", "/dev/nvme0n1"},
		{"lvcreate", "-y", "-L", "16M", "-T", "vgvm/pool", "-V", "64M", "-n", "thin"},
		{"lvcreate", "-y", "-l", "100%FREE", "-n", "fill", "vgvm"},
	} {
		if _, err := g.Run("lvm", args...); err != nil {
			return err
		}
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
	out, err := g.Check("DiskUsageHigh")
	if err != nil {
		return err
	}
	g.Logf("storage report: %s", compact(out.Report["storage"]))
	var doc struct {
		VolumeGroups []struct {
			Name      string `json:"name"`
			ThinPools []struct {
				Name        string  `json:"name"`
				DataPercent float64 `json:"dataPercent"`
			} `json:"thinPools"`
		} `json:"volumeGroups"`
	}
	if err := json.Unmarshal(out.Report["storage"], &doc); err != nil {
		return err
	}
	if len(doc.VolumeGroups) != 1 || doc.VolumeGroups[0].Name != "vgvm" || len(doc.VolumeGroups[0].ThinPools) != 1 ||
		doc.VolumeGroups[0].ThinPools[0].Name != "pool" || doc.VolumeGroups[0].ThinPools[0].DataPercent != 93.75 {
		return fmt.Errorf("storage report: volume groups %+v, want vgvm with thin pool pool at 93.75%%", doc.VolumeGroups)
	}
	return nil
}
