package scenarios

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
