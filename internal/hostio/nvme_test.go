package hostio

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

func TestNVMePassthruLayout(t *testing.T) {
	// struct nvme_passthru_cmd is 72 bytes; the ioctl number encodes it.
	if s := unsafe.Sizeof(NVMePassthru{}); s != 72 || nvmeIoctlAdminCmd>>16&0x3fff != 72 {
		t.Errorf("NVMePassthru is %d bytes, ioctl says %d", s, nvmeIoctlAdminCmd>>16&0x3fff)
	}
	if off := unsafe.Offsetof(NVMePassthru{}.Cdw10); off != 40 {
		t.Errorf("cdw10 at offset %d, want 40", off)
	}
}

// An admin command the controller completed with an error status comes back
// from the ioctl as that status (positive), not as an errno: it is an error,
// not a page (a zeroed SMART page would read as a healthy drive). 0x4002:
// Invalid Field in Command, do not retry.
func TestAdminErrorIncludesTheNVMeStatus(t *testing.T) {
	if err := adminError("/dev/nvme0", 0x02, 0, 0); err != nil {
		t.Errorf("status 0: %v", err)
	}
	err := adminError("/dev/nvme0", 0x02, 0x4002, 0)
	if err == nil || !strings.Contains(err.Error(), "status 0x4002 (status code type 0, status code 0x02, do not retry)") || !errors.Is(err, ErrNVMeStatus) {
		t.Errorf("status 0x4002: %v, want an ErrNVMeStatus", err)
	}
	if err := adminError("/dev/nvme0", 0x06, 0, syscall.ENOTTY); !errors.Is(err, syscall.ENOTTY) || errors.Is(err, ErrNVMeStatus) {
		t.Errorf("ENOTTY: %v", err)
	}
}

// An admin command is sent with the kernel's own timeout (TimeoutMs 0,
// nvme_core.admin_timeout): a shorter one of ours made the PCIe driver
// reset the controller of a drive slow to answer a SMART read. A caller's
// timeout, and the buffer, are set as the command goes out.
func TestNVMeAdminLeavesTheTimeoutToTheKernel(t *testing.T) {
	buf := make([]byte, 512)
	c := NVMePassthru{Opcode: 0x02, TimeoutMs: 5000}
	prepareAdmin(&c, buf)
	if c.TimeoutMs != 0 {
		t.Errorf("TimeoutMs %d, want 0 (the kernel's admin_timeout)", c.TimeoutMs)
	}
	if c.DataLen != 512 || c.Addr == 0 {
		t.Errorf("buffer not set: addr %#x, len %d", c.Addr, c.DataLen)
	}
}
