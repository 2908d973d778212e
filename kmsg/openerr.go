package kmsg

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// printkDevkmsgPath is the sysctl under the host's procfs that, off, makes
// the kernel refuse every open of /dev/kmsg with EPERM.
const printkDevkmsgPath = "sys/kernel/printk_devkmsg"

// openError is an open of the kernel log refused with EPERM, with the
// setting that refused it (errors.Is still finds the EPERM).
type openError struct {
	err    error
	reason string
}

func (e *openError) Error() string { return e.err.Error() + ": " + e.reason }
func (e *openError) Unwrap() error { return e.err }

// dmesgRestrictPath is the sysctl under the host's procfs that, 1, makes
// the kernel refuse an open of /dev/kmsg for reading with EPERM to a
// process without CAP_SYSLOG.
const dmesgRestrictPath = "sys/kernel/dmesg_restrict"

// explainOpen adds to an open of the kernel log that failed with EPERM
// which of the host's settings refused it, read under proc (the host's
// procfs; "": not read): "operation not permitted" alone names neither the
// setting nor the fix.
//
// The kernel's devkmsg_open (kernel/printk/printk.c) refuses with EPERM in
// this order: kernel.printk_devkmsg=off (a hardened image's sysctl, or
// printk.devkmsg=off on the kernel command line, which also locks it)
// refuses every open, a reader's too, whatever the process's capabilities;
// then, for a reader, check_syslog_permissions: with kernel.dmesg_restrict=1
// (Debian's default) only a process with CAP_SYSLOG in the host's user
// namespace may read (on 6.18, CAP_SYS_ADMIN without CAP_SYSLOG is refused
// too). Other errors, and an EPERM with neither setting (a device cgroup's
// or a seccomp filter's), are returned as they are.
func explainOpen(err error, proc string) error {
	if err == nil || proc == "" || !errors.Is(err, syscall.EPERM) {
		return err
	}
	if sysctl(proc, printkDevkmsgPath) == "off" {
		return &openError{err: err, reason: "kernel.printk_devkmsg is off, and the kernel then refuses every open of /dev/kmsg, a reader's too; " +
			"set kernel.printk_devkmsg=ratelimit (the kernel's default) in the node image's sysctl.d, or drop printk.devkmsg=off from the kernel command line (which also locks the setting)"}
	}
	if sysctl(proc, dmesgRestrictPath) == "1" {
		return &openError{err: err, reason: "kernel.dmesg_restrict is 1, and the kernel then lets only a process with CAP_SYSLOG (in the host's user namespace) open /dev/kmsg for reading; " +
			"open it with CAP_SYSLOG: the daemon through autopilot-health-privileged.service, whose CapabilityBoundingSet= keeps CAP_SYSLOG (look for a drop-in that takes it away, or sets User= or PrivateUsers=), " +
			"with kmsg.device at /dev/kmsg (another path is opened by the daemon itself, which has no capabilities); `autopilot-health check` as root"}
	}
	return err
}

// sysctl is the value of the setting at name under proc, trimmed; "" when
// it cannot be read.
func sysctl(proc, name string) string {
	b, err := os.ReadFile(filepath.Join(proc, name))
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}
