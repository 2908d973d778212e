package hostio

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const nvmeIoctlAdminCmd = 0xC0484E41 // _IOWR('N', 0x41, struct nvme_passthru_cmd)

// NVMePassthru is struct nvme_passthru_cmd of linux/nvme_ioctl.h (72 bytes).
type NVMePassthru struct {
	Opcode      uint8
	Flags       uint8
	Rsvd1       uint16
	Nsid        uint32
	Cdw2, Cdw3  uint32
	Metadata    uint64
	Addr        uint64
	MetadataLen uint32
	DataLen     uint32
	Cdw10       uint32
	Cdw11       uint32
	Cdw12       uint32
	Cdw13       uint32
	Cdw14       uint32
	Cdw15       uint32
	TimeoutMs   uint32
	Result      uint32
}

// NVMeAdmin sends one admin command to the NVMe controller device dev
// (NVME_IOCTL_ADMIN_CMD, which needs CAP_SYS_ADMIN) with buf, which may be
// empty, as its data buffer, and returns the completion's result dword.
func NVMeAdmin(dev string, c NVMePassthru, buf []byte) (uint32, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: dev, Err: err}
	}
	defer unix.Close(fd)
	prepareAdmin(&c, buf)
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&c)))
	runtime.KeepAlive(buf)
	if err := adminError(dev, c.Opcode, r, e); err != nil {
		return 0, err
	}
	return c.Result, nil
}

// prepareAdmin points c at buf and leaves its timeout to the kernel
// (TimeoutMs 0: nvme_core.admin_timeout, 60 s by default), as nvme-cli
// does. A timeout of the caller's own is no shorter wait: when an admin
// command times out, the PCIe driver disables and resets the controller
// (nvme_timeout: "QID 0 timeout, reset controller"), so a drive slow to
// answer a SMART read (5 s was the value here) was reset by the health
// daemon, the root disk's among them. The checks stop waiting long
// before (half their timeout) and do not ask a drive again until its
// command returns.
func prepareAdmin(c *NVMePassthru, buf []byte) {
	if len(buf) > 0 {
		c.Addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
		c.DataLen = uint32(len(buf))
	}
	c.TimeoutMs = 0
}

// adminError is the error of an admin command's ioctl that returned r and
// e. The kernel returns a negative errno for a command it could not send,
// and the NVMe status (positive) for one the controller completed with an
// error (nvme_user_cmd): the buffer then holds no page, and a zeroed SMART
// page would read as a healthy drive at -273 °C.
func adminError(dev string, opcode uint8, r uintptr, e syscall.Errno) error {
	if e != 0 {
		return fmt.Errorf("%s: NVMe admin command 0x%02x: %w", dev, opcode, e)
	}
	if r != 0 {
		return &NVMeStatusError{Dev: dev, Opcode: opcode, Status: uint32(r)}
	}
	return nil
}

// ErrNVMeStatus is what errors.Is finds in an NVMeStatusError, here and
// through the privileged helper: the command was answered, with an error.
var ErrNVMeStatus = errors.New("NVMe admin command completed with an error status")

// NVMeStatusError is an admin command that the kernel completed with an
// NVMe status rather than an errno: the controller answered it (or the
// host did at once for a controller it cannot send to), so another command
// to the same drive does not hang behind it.
type NVMeStatusError struct {
	Dev    string
	Opcode uint8
	Status uint32
}

func (e *NVMeStatusError) Error() string {
	r := e.Status
	return fmt.Sprintf("%s: NVMe admin command 0x%02x: the controller answered status 0x%x (status code type %d, status code 0x%02x%s)",
		e.Dev, e.Opcode, r, r>>8&0x7, r&0xff, map[bool]string{true: ", do not retry", false: ""}[r&0x4000 != 0])
}

// Is makes errors.Is(err, ErrNVMeStatus) true.
func (e *NVMeStatusError) Is(target error) bool { return target == ErrNVMeStatus }

// NVMeIdentify returns the 4096-byte Identify Controller page of the
// controller device dev.
func NVMeIdentify(dev string) ([]byte, error) {
	buf := make([]byte, 4096)
	_, err := NVMeAdmin(dev, NVMePassthru{Opcode: 0x06, Cdw10: 1}, buf) // Identify, CNS 1: controller
	return buf, err
}

// NVMeSMART returns the 512-byte SMART / Health Information log page of the
// controller device dev.
func NVMeSMART(dev string) ([]byte, error) {
	// Get Log Page, all namespaces, LID 02h, NUMDL = dwords - 1.
	buf := make([]byte, 512)
	_, err := NVMeAdmin(dev, NVMePassthru{Opcode: 0x02, Nsid: 0xffffffff, Cdw10: (512/4-1)<<16 | 0x02}, buf)
	return buf, err
}
