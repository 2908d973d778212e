package checks

import (
	"log/slog"

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
)

// MalformedReaders are the reader label's values, in the order README
// lists them.
var MalformedReaders = []MalformedReader{MalformedMountWatch, MalformedMountScan, MalformedAuditLog, MalformedJournalctl}

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
		Help: "Lines of host input that a reader could not parse and skipped, by reader (mountinfo-watch, mountinfo-scan, audit-log, journalctl).",
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

// Value returns the count of reader r (for tests and status).
func (m *MalformedLines) Value(r MalformedReader) float64 {
	if m == nil {
		return 0
	}
	return report.Value(m.lines.WithLabelValues(string(r)))
}

// malformedSaid logs a reader's skipped lines once per change, not per
// reading: a reading with malformed lines whose first differs from the
// one said last is logged; a reading without any clears what was said, so
// malformed lines coming back are logged again.
type malformedSaid struct {
	said string
}

// reading notes one reading of the input: n malformed lines, key what
// names the first of them from reading to reading (its text, not its
// number, which moves as lines come and go before it). It logs msg with
// attrs where that is a change.
func (s *malformedSaid) reading(log *slog.Logger, n int, key, msg string, attrs ...any) {
	if n == 0 {
		s.said = ""
		return
	}
	if key == s.said {
		return
	}
	s.said = key
	if log != nil {
		log.Warn(msg, append(attrs, "lines", n)...)
	}
}
