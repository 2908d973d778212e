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

// explainOpen adds to an open of the kernel log that failed with EPERM
// which of the host's settings refused it, read under proc (the host's
// procfs; "": not read): "operation not permitted" alone reads as a
// missing capability, while kernel.printk_devkmsg=off (a hardened image's
// sysctl, or printk.devkmsg=off on the kernel command line, which also
// locks it) makes the kernel refuse every open of /dev/kmsg, a reader's
// too, whatever the process's capabilities. Other errors, and an EPERM
// with the setting not off (kernel.dmesg_restrict=1 and no CAP_SYSLOG),
// are returned as they are.
func explainOpen(err error, proc string) error {
	if err == nil || proc == "" || !errors.Is(err, syscall.EPERM) {
		return err
	}
	if b, rerr := os.ReadFile(filepath.Join(proc, printkDevkmsgPath)); rerr == nil && string(bytes.TrimSpace(b)) == "off" {
		return &openError{err: err, reason: "kernel.printk_devkmsg is off, and the kernel then refuses every open of /dev/kmsg, a reader's too; " +
			"set kernel.printk_devkmsg=ratelimit (the kernel's default) in the node image's sysctl.d, or drop printk.devkmsg=off from the kernel command line (which also locks the setting)"}
	}
	return err
}
