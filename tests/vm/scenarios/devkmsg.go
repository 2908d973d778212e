package scenarios

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

const printkDevkmsg = "/proc/sys/kernel/printk_devkmsg"

// devkmsgOff: kernel.printk_devkmsg=off (a hardened image's sysctl, or
// printk.devkmsg=off on the kernel command line) makes the kernel refuse
// every open of /dev/kmsg with EPERM, a reader's too, not only a writer's.
// The one-shot check then cannot read the kernel log, and its kernel
// conditions are Unknown with an error that names the setting, not only
// "operation not permitted" (which reads as a missing capability). The
// setting is put back after (the sysctl takes a value ending in a newline
// only: "off" alone is EINVAL).
func devkmsgOff(g *Guest) error {
	old, err := os.ReadFile(printkDevkmsg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(printkDevkmsg, []byte("off\n"), 0); err != nil {
		return fmt.Errorf("setting kernel.printk_devkmsg=off: %w", err)
	}
	defer os.WriteFile(printkDevkmsg, []byte(strings.TrimSpace(string(old))+"\n"), 0)
	g.Logf("kernel.printk_devkmsg: %s -> off", strings.TrimSpace(string(old)))
	// The kernel's answer, read and write alike.
	for _, mode := range []int{unix.O_RDONLY | unix.O_NONBLOCK, unix.O_WRONLY} {
		fd, err := unix.Open("/dev/kmsg", mode|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
			return fmt.Errorf("open /dev/kmsg (flags %#o) with printk_devkmsg=off succeeded; want EPERM", mode)
		}
		if !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("open /dev/kmsg (flags %#o) with printk_devkmsg=off: %v, want EPERM", mode, err)
		}
	}
	out, err := g.Check("ReadonlyFilesystem")
	if err != nil {
		return err
	}
	for _, c := range out.Conditions {
		if c.Type != "ReadonlyFilesystem" {
			continue
		}
		g.Logf("check: %s", c)
		if c.Status != "Unknown" || c.Reason != "CheckFailed" {
			return fmt.Errorf("check with printk_devkmsg=off: %s, want Unknown CheckFailed", c)
		}
		return MessageHas(c, "operation not permitted", "kernel.printk_devkmsg is off")
	}
	return fmt.Errorf("check --only ReadonlyFilesystem: no ReadonlyFilesystem in %+v", out.Conditions)
}
