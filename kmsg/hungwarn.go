package kmsg

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"
)

// hungWarnings follows kernel.hung_task_warnings: how many hung-task
// reports ("INFO: task X:PID blocked for more than N seconds.") the kernel
// still prints in this boot (kernel/hung_task.c decrements it before each
// report; -1 is unlimited, 10 the default). At 0 the kernel prints none: a
// hung kubelet is never logged and KernelDeadlock stays False for the rest
// of the boot. The value is read at the start, after each hung-task record
// the monitor handles (the kernel counts it down before printing one), and
// on the reader's ticks at most once a minute, whatever it was: the kernel
// is not the only one to change it (an operator's `sysctl -w
// kernel.hung_task_warnings=0`, a `sysctl --system` of a new sysctl.d file),
// and a report the ring buffer overwrote before it was read was counted
// down unseen; read only while 0, the gauge kept the value of the start
// and AutopilotHealthKernelHungTaskReportsExhausted never fired. No wake-up
// of its own.
type hungWarnings struct {
	path string // "" : not read (a replay of another host's lines)
	log  *slog.Logger
	// set and clear the gauge (see Metrics).
	set   func(float64)
	clear func()
	// known: the last read gave a value, value it; warned: the 0 was
	// logged; readAt: when the last read was; lastErr: the last read's
	// error, logged once per change.
	known   bool
	value   int64
	warned  bool
	readAt  time.Time
	lastErr string
}

// hungWarningsPath is the sysctl under the host's procfs.
const hungWarningsPath = "sys/kernel/hung_task_warnings"

// attrMax bounds a read of a sysctl or a sysfs attribute: the kernel's
// own bound is a page.
const attrMax = 4096

// hungWarningsRecheck is how often the ticks read the value.
const hungWarningsRecheck = time.Minute

func newHungWarnings(proc string, log *slog.Logger, m *Metrics) hungWarnings {
	// The series is looked up at each set: Reset drops it from the vector.
	h := hungWarnings{log: log, set: func(v float64) { m.hungTaskWarnings.WithLabelValues().Set(v) }, clear: m.hungTaskWarnings.Reset}
	if proc != "" {
		h.path = filepath.Join(proc, hungWarningsPath)
	}
	return h
}

var (
	hungPrefix = []byte("INFO: task ")
	hungAnchor = []byte(" blocked for more than ")
)

// isHungReport says whether a message (unescaped) is a hung-task report.
func isHungReport(msg []byte) bool {
	return bytes.HasPrefix(msg, hungPrefix) && bytes.Contains(msg, hungAnchor)
}

// tick reads the value again when the last read is a minute old or more.
// A read that fails again logs nothing new (lastErr).
func (h *hungWarnings) tick(now time.Time) {
	if now.Sub(h.readAt) >= hungWarningsRecheck {
		h.read(now)
	}
}

// read reads the value, sets the gauge (absent when it cannot be read),
// and logs the first read that finds it 0.
func (h *hungWarnings) read(now time.Time) {
	if h.path == "" {
		return
	}
	h.readAt = now
	v, err := readHungWarnings(h.path)
	if err != nil {
		h.known = false
		h.clear()
		// A warning: with the gauge absent the shipped rules fire
		// AutopilotHealthKernelDeadlockUndetectable, and this line says
		// why.
		if e := err.Error(); e != h.lastErr {
			h.lastErr = e
			if errors.Is(err, fs.ErrNotExist) {
				h.log.Warn("kernel.hung_task_warnings does not exist: this kernel has no hung-task detector (CONFIG_DETECT_HUNG_TASK) and reports no hung task, so KernelDeadlock can never turn True on this node (autopilot_health_kernel_hung_task_warnings absent)",
					"path", h.path)
			} else {
				h.log.Warn("kernel.hung_task_warnings not readable: how many hung-task reports the kernel still prints is not known, and KernelDeadlock may never turn True (autopilot_health_kernel_hung_task_warnings absent)", "err", err)
			}
		}
		return
	}
	h.lastErr = ""
	h.known, h.value = true, v
	h.set(float64(v))
	switch {
	case v == 0 && !h.warned:
		h.warned = true
		h.log.Warn("kernel.hung_task_warnings is 0: the kernel prints no more hung-task reports in this boot, so a hung kubelet, containerd or runc is not seen and KernelDeadlock stays False; set kernel.hung_task_warnings=-1 (unlimited) in the node image's sysctl.d",
			"path", h.path)
	case v != 0 && h.warned:
		h.warned = false
		h.log.Info("kernel.hung_task_warnings is no longer 0: the kernel prints hung-task reports again", "value", v)
	}
}

// readHungWarnings reads the sysctl's value: -1 (unlimited) or the reports
// left. The read is raw (rawsys.ReadPseudoFile): os.ReadFile registered the
// file, pollable and ready, with the runtime's poller, which woke the
// thread waiting there, once a minute.
func readHungWarnings(path string) (int64, error) {
	b, err := rawsys.ReadPseudoFile(path, attrMax)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < -1 {
		return 0, fmt.Errorf("%s holds %q, not -1 or a count of reports", path, s)
	}
	return v, nil
}
