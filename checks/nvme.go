package checks

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/internal/hostio"
	"github.com/syself/autopilot-health/internal/rawsys"
)

// NVMe reads NVMe controllers' Identify and SMART/Health pages; injectable
// for tests.
type NVMe interface {
	// Controllers lists the NVMe controllers of the node's drives (nvme0,
	// nvme1, ...), not those of NVMe over Fabrics.
	Controllers() ([]string, error)
	// Identify returns the 4096-byte Identify Controller page.
	Identify(ctrl string) ([]byte, error)
	// SMART returns the 512-byte SMART / Health Information log page.
	SMART(ctrl string) ([]byte, error)
}

// realNVMe talks to /dev/nvmeN over NVME_IOCTL_ADMIN_CMD (needs
// CAP_SYS_ADMIN), finding the local controllers in /sys/class/nvme under
// the host root.
type realNVMe struct {
	env  *Env
	cmds NVMeCommands
}

func (e *Env) nvme() NVMe {
	if e.NVMe != nil {
		return e.NVMe
	}
	return realNVMe{env: e, cmds: e.Helper} // nil without a helper: in process
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
		if strings.HasPrefix(e.Name(), "nvme") && !r.fabrics(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// fabricsTransports are the transports of NVMe over Fabrics, as a
// controller's sysfs "transport" attribute names them (the kernel's
// nvme_ctrl_ops name; a local drive's is "pcie", a Mac's "apple-nvme").
var fabricsTransports = []string{"tcp", "rdma", "fc", "loop"}

// fabrics reports whether ctrl is a controller of NVMe over Fabrics: a
// volume of a storage array or of an SPDK target (Longhorn's, Mayastor's)
// attached over the network, not a drive of this node. Its SMART page is
// the target's, the same on every node attached to it, and one that is
// reconnecting answers "host path error". A controller whose transport
// cannot be read is taken for a local drive.
func (r realNVMe) fabrics(ctrl string) bool {
	b, err := rawsys.ReadPseudoFile(r.env.Path("/sys/class/nvme/"+ctrl+"/transport"), attrMax)
	return err == nil && slices.Contains(fabricsTransports, strings.TrimSpace(string(b)))
}

// NVMeAdminCommand sends one admin command to the NVMe controller device dev
// (NVME_IOCTL_ADMIN_CMD) with buf, which may be empty, as its data buffer,
// and returns the completion's result dword. The VM tier's scenarios use it
// to set features of QEMU's controller.
func NVMeAdminCommand(dev string, opcode uint8, nsid, cdw10, cdw11 uint32, buf []byte) (uint32, error) {
	return hostio.NVMeAdmin(dev, hostio.NVMePassthru{Opcode: opcode, Nsid: nsid, Cdw10: cdw10, Cdw11: cdw11}, buf)
}

// NVMeCommands sends the two admin commands the disk checks use to a
// controller (nvme0, ...): in process (hostio), or through the privileged
// helper.
type NVMeCommands interface {
	Identify(ctrl string) ([]byte, error)
	SMART(ctrl string) ([]byte, error)
}

func (r realNVMe) dev(ctrl string) string { return r.env.Path("/dev/" + filepath.Base(ctrl)) }

func (r realNVMe) Identify(ctrl string) ([]byte, error) {
	if r.cmds != nil {
		return r.cmds.Identify(ctrl)
	}
	return hostio.NVMeIdentify(r.dev(ctrl))
}

func (r realNVMe) SMART(ctrl string) ([]byte, error) {
	if r.cmds != nil {
		return r.cmds.SMART(ctrl)
	}
	return hostio.NVMeSMART(r.dev(ctrl))
}

// NVMeHealth is one drive in the disks report domain.
type NVMeHealth struct {
	Controller      string `json:"controller"`
	Model           string `json:"model,omitempty"`
	Serial          string `json:"serial,omitempty"`
	Firmware        string `json:"firmware,omitempty"`
	CriticalWarning uint8  `json:"criticalWarning"`
	// TemperatureC is the composite temperature; nil where the drive
	// reports none (0 K: AWS's EBS, Oxide's propolis; smartctl
	// prints "-").
	TemperatureC    *int   `json:"temperatureC,omitempty"`
	WarningTempC    int    `json:"warningTempC,omitempty"`  // WCTEMP; 0: not reported
	CriticalTempC   int    `json:"criticalTempC,omitempty"` // CCTEMP
	AvailableSpare  int    `json:"availableSparePercent"`
	SpareThreshold  int    `json:"spareThresholdPercent"`
	PercentageUsed  int    `json:"percentageUsed"`
	PowerOnHours    uint64 `json:"powerOnHours"`
	UnsafeShutdowns uint64 `json:"unsafeShutdowns"`
	MediaErrors     uint64 `json:"mediaErrors"`
	// Error: the SMART page could not be read (or the drive did not answer
	// in time): its health is not known.
	Error string `json:"error,omitempty"`
	// IdentifyError: the Identify page could not be read (no model, serial
	// or temperature thresholds); the SMART page is read all the same.
	IdentifyError string `json:"identifyError,omitempty"`
	// OverThreshold: its percentage used is at or over DiskWearHigh's
	// threshold, or its temperature at or over DiskTemperatureHigh's, so
	// that one of those conditions names it (set by the disks check's
	// Probe from their settings: nvmeThresholds; not in the report:
	// Problem).
	OverThreshold bool `json:"-"`
}

// Problem reports whether the drive is a problem: a SMART critical
// warning bit is set (spare below its threshold, temperature, reliability,
// read-only, ...), its composite temperature is at or over its own warning
// threshold (WCTEMP), it is over DiskWearHigh's or DiskTemperatureHigh's
// threshold (OverThreshold), or its SMART page could not be read.
func (h NVMeHealth) Problem() bool {
	return h.Error != "" || h.CriticalWarning != 0 || h.OverThreshold ||
		(h.TemperatureC != nil && h.WarningTempC > 0 && *h.TemperatureC >= h.WarningTempC)
}

// name is how messages call a drive: its controller and model.
func (h NVMeHealth) name() string {
	if h.Model == "" {
		return h.Controller
	}
	return h.Controller + " (" + h.Model + ")"
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
	h.TemperatureC = nil
	if k := binary.LittleEndian.Uint16(b[1:3]); k != 0 {
		c := kelvinToC(k)
		h.TemperatureC = &c
	}
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
	h.Serial = idString(b[4:24])
	h.Model = idString(b[24:64])
	h.Firmware = idString(b[64:72])
	if wc := binary.LittleEndian.Uint16(b[266:268]); wc != 0 {
		h.WarningTempC = kelvinToC(wc)
	}
	if cc := binary.LittleEndian.Uint16(b[268:270]); cc != 0 {
		h.CriticalTempC = kelvinToC(cc)
	}
	return nil
}

// idString is an ASCII field of the Identify page as text: the spec pads
// with spaces, some firmware with NUL bytes; a byte that is not printable
// ASCII becomes '?', so that no NUL or control byte reaches a condition's
// message or the report.
func idString(b []byte) string {
	out := make([]byte, 0, len(b))
	for _, c := range bytes.TrimRight(b, " \x00") {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		out = append(out, c)
	}
	return strings.TrimSpace(string(out))
}

// nvmeTimeout is the longest a drive's two admin commands are waited for,
// as a part of checkTimeout: half of it (15 s of 30 s). The kernel gives a
// controller 60 s to answer an admin command (nvme_core.admin_timeout), longer
// than the check's timeout, and no context reaches the ioctl.
func nvmeTimeout(checkTimeout time.Duration) time.Duration {
	if checkTimeout <= 0 {
		checkTimeout = 30 * time.Second // a configuration built in code; the runner refuses it
	}
	return checkTimeout / 2
}

// readNVMeHealth reads every controller, each on a goroutine of its own
// (stuck: the drives whose commands have not returned, not asked again
// until they do), waiting for them until timeout. A drive whose Identify
// fails with an answer (answered: EIO from a drive that may fail one
// command and serve another, an NVMe status the controller completed it
// with) or whose Identify page is malformed is still
// asked for its SMART page; after an Identify that timed out or did not
// reach the drive (the privileged helper's deadline or its socket) it is
// not, and carries that error. One
// whose SMART page cannot be read, or that does not answer in time,
// carries its error.
func readNVMeHealth(ctx context.Context, n NVMe, stuck *stuckCalls[NVMeHealth], timeout time.Duration) ([]NVMeHealth, error) {
	ctrls, err := n.Controllers()
	if err != nil {
		return nil, err
	}
	answers := callEach(ctx, stuck, timeout, ctrls, func(c string) (NVMeHealth, error) {
		h := NVMeHealth{Controller: c}
		id, err := n.Identify(c)
		if err != nil && !answered(err) {
			h.IdentifyError = err.Error()
			h.Error = "SMART page not asked: Identify failed: " + err.Error()
			return h, nil
		}
		if err == nil {
			err = ParseIdentify(&h, id)
		}
		if err != nil {
			h.IdentifyError = err.Error()
		}
		s, err := n.SMART(c)
		if err == nil {
			err = ParseSMART(&h, s)
		}
		if err != nil {
			h.Error = err.Error()
		}
		return h, nil
	})
	out := make([]NVMeHealth, 0, len(ctrls))
	for i, a := range answers {
		h := a.v
		if a.stuck {
			h = NVMeHealth{Controller: ctrls[i], Error: fmt.Sprintf("no answer within %s: admin command hung; read again once it answers", timeout)}
		}
		out = append(out, h)
	}
	return out, nil
}

// answered reports whether a failed admin command was answered: an NVMe
// status the command completed with (hostio.ErrNVMeStatus: the kernel
// returns it, not an errno, for a command the controller failed), or an
// errno of the open or of the ioctl, in this process or in the privileged
// helper (EIO from a drive that fails one command and may serve another,
// ENOTTY, ENOENT), but for a timeout's. A timeout (EINTR: the kernel's answer to
// a passthrough command it cancelled when the command's timeout reset the
// controller, nvme_execute_rq; ETIMEDOUT; the helper's deadline, "i/o
// timeout" while its ioctl still hangs) or an error of the way to the
// helper (its socket: a *net.OpError; no answer, a malformed one) is not:
// the next command to the drive would go the same way, a second hung call
// where one hangs.
func answered(err error) bool {
	if errors.Is(err, hostio.ErrNVMeStatus) {
		return true
	}
	var errno syscall.Errno
	var op *net.OpError
	return errors.As(err, &errno) && errno != syscall.ETIMEDOUT && errno != syscall.EINTR && !errors.As(err, &op)
}

// nvmeUnreadable summarizes controllers that could not be read.
func nvmeUnreadable(hs []NVMeHealth) (ok []NVMeHealth, bad []string) {
	for _, h := range hs {
		if h.Error != "" {
			bad = append(bad, h.Controller+" ("+h.Error+")")
			continue
		}
		ok = append(ok, h)
	}
	return ok, bad
}

// temperature is the drive's composite temperature in words.
func (h NVMeHealth) temperature() string {
	if h.TemperatureC == nil {
		return "temperature not reported"
	}
	return fmt.Sprintf("%d°C", *h.TemperatureC)
}
