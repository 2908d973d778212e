package checks

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NVMe reads NVMe controllers' Identify and SMART/Health pages; injectable
// for tests.
type NVMe interface {
	// Controllers lists the NVMe controllers (nvme0, nvme1, ...).
	Controllers() ([]string, error)
	// Identify returns the 4096-byte Identify Controller page.
	Identify(ctrl string) ([]byte, error)
	// SMART returns the 512-byte SMART / Health Information log page.
	SMART(ctrl string) ([]byte, error)
}

// realNVMe talks to /dev/nvmeN over NVME_IOCTL_ADMIN_CMD (needs
// CAP_SYS_ADMIN), finding controllers in /sys/class/nvme under the host root.
type realNVMe struct{ env *Env }

func (e *Env) nvme() NVMe {
	if e.NVMe != nil {
		return e.NVMe
	}
	return realNVMe{e}
}

func (r realNVMe) Controllers() ([]string, error) {
	ents, err := os.ReadDir(r.env.Path("/sys/class/nvme"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "nvme") {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

const nvmeIoctlAdminCmd = 0xC0484E41 // _IOWR('N', 0x41, struct nvme_passthru_cmd)

// nvmePassthru is struct nvme_passthru_cmd of linux/nvme_ioctl.h (72 bytes).
type nvmePassthru struct {
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

func (r realNVMe) admin(ctrl string, c nvmePassthru, size int) ([]byte, error) {
	buf := make([]byte, size)
	if _, err := adminCommand(r.env.Path("/dev/"+filepath.Base(ctrl)), c, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// NVMeAdminCommand sends one admin command to the NVMe controller device dev
// (NVME_IOCTL_ADMIN_CMD) with buf, which may be empty, as its data buffer,
// and returns the completion's result dword. The VM tier's scenarios use it
// to set features of QEMU's controller.
func NVMeAdminCommand(dev string, opcode uint8, nsid, cdw10, cdw11 uint32, buf []byte) (uint32, error) {
	return adminCommand(dev, nvmePassthru{Opcode: opcode, Nsid: nsid, Cdw10: cdw10, Cdw11: cdw11}, buf)
}

func adminCommand(dev string, c nvmePassthru, buf []byte) (uint32, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: dev, Err: err}
	}
	defer unix.Close(fd)
	if len(buf) > 0 {
		c.Addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
		c.DataLen = uint32(len(buf))
	}
	c.TimeoutMs = 5000
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&c)))
	runtime.KeepAlive(buf)
	if e != 0 {
		return 0, fmt.Errorf("%s: NVMe admin command 0x%02x: %w", dev, c.Opcode, e)
	}
	return c.Result, nil
}

func (r realNVMe) Identify(ctrl string) ([]byte, error) {
	return r.admin(ctrl, nvmePassthru{Opcode: 0x06, Cdw10: 1}, 4096) // Identify, CNS 1: controller
}

func (r realNVMe) SMART(ctrl string) ([]byte, error) {
	// Get Log Page, all namespaces, LID 02h, NUMDL = dwords - 1.
	return r.admin(ctrl, nvmePassthru{Opcode: 0x02, Nsid: 0xffffffff, Cdw10: (512/4-1)<<16 | 0x02}, 512)
}

// NVMeHealth is one drive in the disks report domain.
type NVMeHealth struct {
	Controller      string `json:"controller"`
	Model           string `json:"model,omitempty"`
	Serial          string `json:"serial,omitempty"`
	Firmware        string `json:"firmware,omitempty"`
	CriticalWarning uint8  `json:"criticalWarning"`
	TemperatureC    int    `json:"temperatureC"`
	WarningTempC    int    `json:"warningTempC,omitempty"`  // WCTEMP; 0: not reported
	CriticalTempC   int    `json:"criticalTempC,omitempty"` // CCTEMP
	AvailableSpare  int    `json:"availableSparePercent"`
	SpareThreshold  int    `json:"spareThresholdPercent"`
	PercentageUsed  int    `json:"percentageUsed"`
	PowerOnHours    uint64 `json:"powerOnHours"`
	UnsafeShutdowns uint64 `json:"unsafeShutdowns"`
	MediaErrors     uint64 `json:"mediaErrors"`
	Error           string `json:"error,omitempty"`
}

// Critical warning bits (NVMe base specification, SMART / Health log byte 0).
var criticalWarningBits = []string{
	0: "available spare below threshold",
	1: "temperature outside its threshold",
	2: "NVM subsystem reliability degraded",
	3: "media placed in read-only mode",
	4: "volatile memory backup device failed",
	5: "persistent memory region read-only or unreliable",
}

// warnings lists the set critical-warning bits in words; skip masks bits out.
func warnings(cw uint8, skip uint8) []string {
	var out []string
	for bit, name := range criticalWarningBits {
		if cw&(1<<bit) != 0 && skip&(1<<bit) == 0 {
			out = append(out, name)
		}
	}
	if rest := cw &^ 0x3f &^ skip; rest != 0 {
		out = append(out, fmt.Sprintf("reserved bits 0x%02x", rest))
	}
	return out
}

func kelvinToC(k uint16) int { return int(k) - 273 }

// ParseSMART fills the health fields from a SMART / Health log page.
func ParseSMART(h *NVMeHealth, b []byte) error {
	if len(b) < 512 {
		return fmt.Errorf("SMART log page is %d bytes, want 512", len(b))
	}
	h.CriticalWarning = b[0]
	h.TemperatureC = kelvinToC(binary.LittleEndian.Uint16(b[1:3]))
	h.AvailableSpare, h.SpareThreshold, h.PercentageUsed = int(b[3]), int(b[4]), int(b[5])
	h.PowerOnHours = binary.LittleEndian.Uint64(b[128:136])
	h.UnsafeShutdowns = binary.LittleEndian.Uint64(b[144:152])
	h.MediaErrors = binary.LittleEndian.Uint64(b[160:168])
	return nil
}

// ParseIdentify fills model, serial, firmware and the temperature thresholds
// from an Identify Controller page.
func ParseIdentify(h *NVMeHealth, b []byte) error {
	if len(b) < 4096 {
		return fmt.Errorf("identify page is %d bytes, want 4096", len(b))
	}
	h.Serial = strings.TrimSpace(string(b[4:24]))
	h.Model = strings.TrimSpace(string(b[24:64]))
	h.Firmware = strings.TrimSpace(string(b[64:72]))
	if wc := binary.LittleEndian.Uint16(b[266:268]); wc != 0 {
		h.WarningTempC = kelvinToC(wc)
	}
	if cc := binary.LittleEndian.Uint16(b[268:270]); cc != 0 {
		h.CriticalTempC = kelvinToC(cc)
	}
	return nil
}

// readNVMeHealth reads every controller; a controller that cannot be read
// carries its error.
func readNVMeHealth(n NVMe) ([]NVMeHealth, error) {
	ctrls, err := n.Controllers()
	if err != nil {
		return nil, err
	}
	out := make([]NVMeHealth, 0, len(ctrls))
	for _, c := range ctrls {
		h := NVMeHealth{Controller: c}
		id, err := n.Identify(c)
		if err == nil {
			err = ParseIdentify(&h, id)
		}
		if err == nil {
			var s []byte
			if s, err = n.SMART(c); err == nil {
				err = ParseSMART(&h, s)
			}
		}
		if err != nil {
			h.Error = err.Error()
		}
		out = append(out, h)
	}
	return out, nil
}

// nvmeUnreadable summarizes controllers that could not be read.
func nvmeUnreadable(hs []NVMeHealth) (ok []NVMeHealth, bad []string) {
	for _, h := range hs {
		if h.Error != "" {
			bad = append(bad, h.Error)
			continue
		}
		ok = append(ok, h)
	}
	return ok, bad
}
