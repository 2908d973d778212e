package checks

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// MalformedReader names a reader of host input that skips a line it
// cannot parse, the reader label of
// autopilot_health_malformed_lines_total: a fixed set, each at 0 from the
// start.
type MalformedReader string

const (
	// MalformedMountWatch is NodeTampered's mount watcher
	// (tamper.MountWatcher): lines of /proc/self/mountinfo whose mount
	// point may be relevant and that do not split.
	MalformedMountWatch MalformedReader = "mountinfo-watch"
	// MalformedMountScan is NodeTampered's scan, which reads the mount
	// table for the mounts the sandbox hides (hostio.ScanNotes): lines
	// that may be one and do not split.
	MalformedMountScan MalformedReader = "mountinfo-scan"
	// MalformedAuditLog is APIServerSourceIPUnavailable's reader of
	// kube-apiserver's audit log.
	MalformedAuditLog MalformedReader = "audit-log"
	// MalformedJournalctl is KubeletHeartbeatFailed's reader of
	// journalctl's output (where the journal is read with journalctl).
	MalformedJournalctl MalformedReader = "journalctl"
	// MalformedMountKmsg is the kernel log monitor's pod volume lookup
	// (kmsg.Options.MalformedMountinfo): lines of /proc/self/mountinfo
	// that do not split, at each lookup of a read-only line's device.
	MalformedMountKmsg MalformedReader = "mountinfo-kmsg"
)

// MalformedReaders are the reader label's values, in the order README
// lists them.
var MalformedReaders = []MalformedReader{MalformedMountWatch, MalformedMountScan, MalformedAuditLog, MalformedJournalctl, MalformedMountKmsg}

// MalformedLines counts the lines of host input that a reader skipped
// because it could not parse them (autopilot_health_malformed_lines_total);
// a nil one counts nothing (the one-shot check).
type MalformedLines struct {
	lines *prometheus.CounterVec
}

// NewMalformedLines returns the counter, every reader's series at 0 (so
// increase() sees the first malformed line), registered with reg where it
// is not nil.
func NewMalformedLines(reg prometheus.Registerer) *MalformedLines {
	m := &MalformedLines{lines: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "malformed_lines_total",
		Help: "Lines of host input that a reader could not parse and skipped, by reader (mountinfo-watch, mountinfo-scan, audit-log, journalctl, mountinfo-kmsg).",
	}, []string{"reader"})}
	for _, r := range MalformedReaders {
		m.lines.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(m.lines)
	}
	return m
}

// Add counts n malformed lines of reader r.
func (m *MalformedLines) Add(r MalformedReader, n int) {
	if m != nil && n > 0 {
		m.lines.WithLabelValues(string(r)).Add(float64(n))
	}
}

// Counter returns reader r's series, for a reader outside this package
// (the kernel log monitor's, which cannot import it); nil where m is.
func (m *MalformedLines) Counter(r MalformedReader) prometheus.Counter {
	if m == nil {
		return nil
	}
	return m.lines.WithLabelValues(string(r))
}

// Value returns the count of reader r (for tests and status).
func (m *MalformedLines) Value(r MalformedReader) float64 {
	if m == nil {
		return 0
	}
	return report.Value(m.lines.WithLabelValues(string(r)))
}
