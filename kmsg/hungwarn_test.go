package kmsg

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/report"
)

// hungWarnHost is a host's procfs holding kernel.hung_task_warnings, and a
// monitor that reads it, logging to a buffer.
type hungWarnHost struct {
	proc, file string
	reg        *prometheus.Registry
	log        *bytes.Buffer
	mon        *Monitor
}

func newHungWarnHost(t *testing.T, value string) *hungWarnHost {
	t.Helper()
	h := &hungWarnHost{proc: t.TempDir(), reg: prometheus.NewRegistry(), log: &bytes.Buffer{}}
	h.file = filepath.Join(h.proc, "sys", "kernel", "hung_task_warnings")
	if err := os.MkdirAll(filepath.Dir(h.file), 0o755); err != nil {
		t.Fatal(err)
	}
	if value != "" {
		h.set(t, value)
	}
	o := opts(t, report.NewStore("b"))
	o.Proc, o.Registerer = h.proc, h.reg
	o.Log = slog.New(slog.NewTextHandler(h.log, nil))
	h.mon = NewMonitor(o)
	return h
}

// set writes the sysctl as the kernel shows it (a line).
func (h *hungWarnHost) set(t *testing.T, v string) {
	t.Helper()
	if err := os.WriteFile(h.file, []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

const hungGauge = "autopilot_health_kernel_hung_task_warnings"

// gauge returns the gauge's exposition ("" when absent).
func (h *hungWarnHost) gauge(t *testing.T) string {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == hungGauge {
			var vals []string
			for _, m := range mf.GetMetric() {
				vals = append(vals, strconv.FormatFloat(m.GetGauge().GetValue(), 'g', -1, 64))
			}
			return strings.Join(vals, ",")
		}
	}
	return ""
}

func (h *hungWarnHost) warnings() int {
	return strings.Count(h.log.String(), "kernel.hung_task_warnings=-1")
}

var hungLine = "INFO: task containerd-shim:4242 blocked for more than 120 seconds."

// The kernel prints kernel.hung_task_warnings hung-task reports per boot
// (10 by default), then none: KernelDeadlock would stay False for the rest
// of the boot with no sign. The gauge shows what is left, read at the start
// and after each hung-task record; reaching 0 is logged once.
func TestHungTaskWarningsGaugeAndWarning(t *testing.T) {
	h := newHungWarnHost(t, "2")
	h.mon.Start(t0, t0)
	if g := h.gauge(t); g != "2" {
		t.Fatalf("after the start: gauge %q, want 2", g)
	}
	// The kernel decrements it before it prints the report: the monitor
	// reads it after the record.
	h.set(t, "1")
	h.mon.Handle(rec(1, hungLine), t0)
	if g := h.gauge(t); g != "1" {
		t.Fatalf("after a hung-task record: gauge %q, want 1", g)
	}
	if h.warnings() != 0 {
		t.Fatalf("warned while reports are left:\n%s", h.log)
	}
	// A record that is no hung-task report does not read it.
	h.set(t, "0")
	h.mon.Handle(rec(2, "EXT4-fs (sda1): mounted filesystem"), t0)
	if g := h.gauge(t); g != "1" {
		t.Fatalf("after another record: gauge %q, want 1 (not read again)", g)
	}
	h.mon.Handle(rec(3, hungLine), t0)
	if g := h.gauge(t); g != "0" {
		t.Fatalf("after the last report: gauge %q, want 0", g)
	}
	if h.warnings() != 1 {
		t.Fatalf("want one warning at 0, got:\n%s", h.log)
	}
	for _, want := range []string{"level=WARN", "sys/kernel/hung_task_warnings", "KernelDeadlock", "sysctl.d"} {
		if !strings.Contains(h.log.String(), want) {
			t.Errorf("the warning does not say %q:\n%s", want, h.log)
		}
	}
	// Still 0 (a hung task read again after, from the boot's backlog): no
	// second line.
	h.mon.Handle(rec(4, hungLine), t0)
	h.mon.Tick(4, t0.Add(time.Hour))
	if h.warnings() != 1 {
		t.Fatalf("warning repeated:\n%s", h.log)
	}
}

// The ticks read the value again at most once a minute, whatever it was:
// the kernel's count-down is not the only change. An operator's `sysctl -w
// kernel.hung_task_warnings=0` (or a `sysctl --system` of a new sysctl.d
// file), or a hung-task report the ring buffer overwrote before it was
// read, leaves the kernel at 0 with no record to read it after; read only
// while 0, the gauge stayed at its start value and
// AutopilotHealthKernelHungTaskReportsExhausted never fired.
func TestHungTaskWarningsReadOnTicksOnceAMinute(t *testing.T) {
	h := newHungWarnHost(t, "10")
	h.mon.Start(t0, t0)
	h.set(t, "0") // sysctl -w kernel.hung_task_warnings=0
	h.mon.Tick(1, t0.Add(59*time.Second))
	if g := h.gauge(t); g != "10" {
		t.Fatalf("read again within a minute: gauge %q", g)
	}
	h.mon.Tick(1, t0.Add(time.Minute))
	if g := h.gauge(t); g != "0" || h.warnings() != 1 {
		t.Fatalf("set to 0 while 10 were left: a minute after, gauge %q, want 0, warned once; log:\n%s", g, h.log)
	}

	h = newHungWarnHost(t, "0")
	h.mon.Start(t0, t0)
	if g := h.gauge(t); g != "0" || h.warnings() != 1 {
		t.Fatalf("0 at the start: gauge %q, log:\n%s", g, h.log)
	}
	h.set(t, "-1")
	h.mon.Tick(1, t0.Add(59*time.Second))
	if g := h.gauge(t); g != "0" {
		t.Fatalf("read again within a minute: gauge %q", g)
	}
	h.mon.Tick(1, t0.Add(time.Minute))
	if g := h.gauge(t); g != "-1" {
		t.Fatalf("a minute after, at 0: gauge %q, want -1", g)
	}
	// Exhausted again (set to 1, one report): warned again.
	h.set(t, "0")
	h.mon.Handle(rec(2, hungLine), t0.Add(2*time.Minute))
	if g := h.gauge(t); g != "0" || h.warnings() != 2 {
		t.Fatalf("exhausted again: gauge %q, log:\n%s", g, h.log)
	}

	// A file that cannot be read is read again too, and its warning is
	// not repeated while the error stays the same.
	h = newHungWarnHost(t, "")
	h.mon.Start(t0, t0)
	h.mon.Tick(1, t0.Add(time.Minute))
	if g, n := h.gauge(t), strings.Count(h.log.String(), "does not exist"); g != "" || n != 1 {
		t.Fatalf("no file, read again: gauge %q, %d warnings, want absent and 1:\n%s", g, n, h.log)
	}
	h.set(t, "4")
	h.mon.Tick(1, t0.Add(2*time.Minute))
	if g := h.gauge(t); g != "4" {
		t.Fatalf("the file there a minute after: gauge %q, want 4", g)
	}
}

// Where the file cannot be read (no hung-task detector in the kernel, a
// replay of another host's lines: Proc ""), the gauge is absent, not a
// value; a value that is not a number is an error, not 0.
func TestHungTaskWarningsAbsentWhereUnreadable(t *testing.T) {
	h := newHungWarnHost(t, "")
	h.mon.Start(t0, t0)
	if g := h.gauge(t); g != "" {
		t.Fatalf("no file: gauge %q, want absent", g)
	}
	h.set(t, "3")
	h.mon.Handle(rec(1, hungLine), t0)
	if g := h.gauge(t); g != "3" {
		t.Fatalf("file there: gauge %q\n%s", g, h.log)
	}
	h.set(t, "lots")
	h.mon.Handle(rec(2, hungLine), t0)
	if g := h.gauge(t); g != "" {
		t.Fatalf("a value that is no number: gauge %q, want absent", g)
	}
	if h.warnings() != 0 || !strings.Contains(h.log.String(), "lots") {
		t.Fatalf("the bad value is not named, or taken for 0:\n%s", h.log)
	}

	reg := prometheus.NewRegistry()
	o := opts(t, report.NewStore("b"))
	o.Registerer = reg // Proc "": a replay
	mon := NewMonitor(o)
	mon.Start(t0, t0)
	mon.Handle(rec(1, hungLine), t0)
	if n, err := testutil.GatherAndCount(reg, hungGauge); err != nil || n != 0 {
		t.Fatalf("replay: %d series (%v), want none", n, err)
	}
}

// A kernel without the hung-task detector (CONFIG_DETECT_HUNG_TASK) has no
// /proc/sys/kernel/hung_task_warnings and never prints a hung-task report:
// KernelDeadlock can never turn True. The start says so as a warning, once,
// naming the condition and the kernel option, not as an Info line an
// operator filters out.
func TestHungTaskWarningsMissingFileIsAWarning(t *testing.T) {
	h := newHungWarnHost(t, "")
	h.mon.Start(t0, t0)
	log := h.log.String()
	if n := strings.Count(log, "level=WARN"); n != 1 {
		t.Fatalf("no hung_task_warnings file: %d warnings, want 1:\n%s", n, log)
	}
	for _, want := range []string{"CONFIG_DETECT_HUNG_TASK", "KernelDeadlock can never turn True", h.file} {
		if !strings.Contains(log, want) {
			t.Errorf("the warning does not name %q:\n%s", want, log)
		}
	}
	// A value that is no number: a warning too (the gauge is absent and
	// AutopilotHealthKernelDeadlockUndetectable fires), naming the value.
	h.set(t, "lots")
	h.mon.Handle(rec(1, hungLine), t0)
	if n := strings.Count(h.log.String(), "level=WARN"); n != 2 || !strings.Contains(h.log.String(), `\"lots\"`) {
		t.Fatalf("a value that is no number: want a second warning naming it:\n%s", h.log)
	}
}
