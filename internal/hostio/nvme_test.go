package hostio

import (
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
