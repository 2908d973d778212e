// Package privileged splits the daemon's privileges from its network.
//
// The daemon (autopilot-health run) talks to the API server, serves
// Prometheus and reads the node's local health endpoints; under its unit it
// holds no capability, no device and no kernel log. What needs them is done
// by the privileged helper (autopilot-health-privileged), a small process
// without a network that links nothing but this package and
// internal/hostio, and answers on a Unix socket that only root may use:
//
//   - kmsg: opens /dev/kmsg (CAP_SYSLOG under kernel.dmesg_restrict) and
//     passes the descriptor (SCM_RIGHTS); the daemon reads it itself;
//   - nvme-identify, nvme-smart: the two NVMe admin commands of the disk
//     checks (CAP_SYS_ADMIN) on a controller named nvmeN;
//   - dm-verity: the verity targets of the device-mapper tables
//     (CAP_SYS_ADMIN), on the device-mapper control node only;
//   - lvm: `lvm vgs` or `lvm lvs` with the disk check's report arguments
//     only (the block devices and the control node), from an lvm binary
//     that root owns and only root may change;
//   - scan: the protected-path scan of NodeTampered (CAP_DAC_READ_SEARCH:
//     modes, owners and digests, never contents).
//
// One request per connection: the client writes a JSON request and shuts
// its side down; the helper answers with one JSON response (and at most
// one descriptor) and closes.
package privileged

import (
	"errors"
	"io/fs"
	"syscall"
	"time"

	"github.com/syself/autopilot-health/internal/hostio"
)

// DefaultSocket is where the helper's socket unit listens.
const DefaultSocket = "/run/autopilot-health-privileged/helper.sock"

// The operations.
const (
	OpKmsg         = "kmsg"
	OpNVMeIdentify = "nvme-identify"
	OpNVMeSMART    = "nvme-smart"
	OpDMVerity     = "dm-verity"
	OpLVM          = "lvm"
	OpScan         = "scan"
)

// maxRequest bounds a request (a scan's patterns are the largest part).
const maxRequest = 1 << 20

// maxResponse bounds a response: a scan at its cap (hostio.MaxEntries) is
// a few MiB.
const maxResponse = 64 << 20

type request struct {
	Op string `json:"op"`
	// Ctrl is an NVMe controller (nvme0).
	Ctrl string `json:"ctrl,omitempty"`
	// Path is the device-mapper control node.
	Path string `json:"path,omitempty"`
	// LVM, Timeout, Command and Args: an LVM report.
	LVM     string        `json:"lvm,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
	Command string        `json:"command,omitempty"`
	Args    []string      `json:"args,omitempty"`
	// Spec is a scan's.
	Spec *hostio.Spec `json:"spec,omitempty"`
}

type response struct {
	// Error, with Errno and Sentinel for errors.Is on the daemon's side.
	Error    string `json:"error,omitempty"`
	Errno    int    `json:"errno,omitempty"`
	Sentinel string `json:"sentinel,omitempty"`
	// Data: an NVMe page, an LVM report (also with an Error: a report of
	// what lvm could read).
	Data    []byte                `json:"data,omitempty"`
	Verity  []hostio.VerityTarget `json:"verity,omitempty"`
	Entries []hostio.Entry        `json:"entries,omitempty"`
	Limit   *hostio.LimitError    `json:"limit,omitempty"`
	// Notes: what a scan skipped of its host input.
	Notes *hostio.ScanNotes `json:"notes,omitempty"`
	// FD: a descriptor rides with the response.
	FD bool `json:"fd,omitempty"`
}

// ErrRefused is the answer of a helper that refuses to start (its command
// line, Refuse): every start refuses it again, until its unit is fixed.
var ErrRefused = errors.New("the privileged helper refuses to start")

// sentinels are the errors the daemon tells apart, by name on the wire.
var sentinels = map[string]error{
	"refused":          ErrRefused,
	"no-device-mapper": hostio.ErrNoDeviceMapper,
	"not-exist":        fs.ErrNotExist,
	"permission":       fs.ErrPermission,
	"not-regular":      hostio.ErrNotRegular,
	"nvme-status":      hostio.ErrNVMeStatus,
}

func errorResponse(err error) response {
	r := response{Error: err.Error()}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		r.Errno = int(errno)
	}
	for name, s := range sentinels {
		if errors.Is(err, s) {
			r.Sentinel = name
			break
		}
	}
	var le *hostio.LimitError
	if errors.As(err, &le) {
		r.Limit = le
	}
	return r
}

// RemoteError is an error the helper answered with: its text, and what
// errors.Is and errors.As find in it on the daemon's side (the errno, a
// sentinel such as hostio.ErrNoDeviceMapper, a *hostio.LimitError).
type RemoteError struct {
	Msg   string
	errs  []error
	limit *hostio.LimitError
}

func (e *RemoteError) Error() string { return e.Msg }

// Unwrap returns the errno and sentinel the helper named.
func (e *RemoteError) Unwrap() []error {
	out := append([]error(nil), e.errs...)
	if e.limit != nil {
		out = append(out, e.limit)
	}
	return out
}

func (r response) err() error {
	if r.Error == "" {
		return nil
	}
	e := &RemoteError{Msg: r.Error, limit: r.Limit}
	if r.Errno != 0 {
		e.errs = append(e.errs, syscall.Errno(r.Errno))
	}
	if s, ok := sentinels[r.Sentinel]; ok {
		e.errs = append(e.errs, s)
	}
	return e
}
