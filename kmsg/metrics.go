package kmsg

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// Metrics of the kernel log monitor.
type Metrics struct {
	records     prometheus.Counter
	matchedVec  *prometheus.CounterVec
	lost        prometheus.Counter
	parseErrors prometheus.Counter
	up          prometheus.Gauge
	reopens     prometheus.Counter
	// hungTaskWarnings has no labels: its one series is absent while the
	// sysctl cannot be read (Reset).
	hungTaskWarnings *prometheus.GaugeVec
	// suppressed counts the kernel's "<function>: N callbacks
	// suppressed" lines by function (see countSuppressed).
	suppressed *prometheus.CounterVec
}

// NewMetrics creates the monitor's metrics and registers them on reg (may
// be nil); the match counters' series are those of the monitor's rules
// (series).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	matched := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "kmsg_matches_total",
		Help: "Kernel log records matched, by rule.",
	}, []string{"rule"})
	m := &Metrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "kmsg_records_total",
			Help: "Kernel log records read from /dev/kmsg.",
		}),
		matchedVec: matched,
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "kmsg_lost_records_total",
			Help: "Kernel log records overwritten in the ring buffer before the monitor read them (EPIPE sequence gaps).",
		}),
		parseErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "kmsg_parse_errors_total",
			Help: "Kernel log records that were not in the /dev/kmsg format and were skipped.",
		}),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: report.Namespace, Name: "kmsg_reader_up",
			Help: "1 while /dev/kmsg is open and being read.",
		}),
		reopens: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "kmsg_reopens_total",
			Help: "Times /dev/kmsg was reopened after a read error.",
		}),
		hungTaskWarnings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: report.Namespace, Name: "kernel_hung_task_warnings",
			Help: "kernel.hung_task_warnings: hung-task reports the kernel still prints in this boot (-1 unlimited; at 0 a hung critical task is not logged and KernelDeadlock cannot be set). Absent where it cannot be read.",
		}, nil),
		suppressed: newSuppressedVec(),
	}
	if reg != nil {
		reg.MustRegister(m.records, matched, m.lost, m.parseErrors, m.up, m.reopens, m.hungTaskWarnings, m.suppressed)
	}
	return m
}

// series returns the match counter of each rule of rules (created at 0 for
// a new rule, the same series for a rule already counted).
func (m *Metrics) series(rules *RuleSet) map[string]prometheus.Counter {
	out := map[string]prometheus.Counter{}
	if rules != nil {
		for _, r := range rules.rules {
			out[r.Name] = m.matchedVec.WithLabelValues(r.Name)
		}
	}
	return out
}

// ReaderUp reports whether the reader has /dev/kmsg open and is reading.
func (m *Metrics) ReaderUp() bool { return report.Value(m.up) == 1 }

// Records returns the number of records read so far.
func (m *Metrics) Records() float64 { return report.Value(m.records) }

// Lost returns the number of records lost to ring buffer overruns so far.
func (m *Metrics) Lost() float64 { return report.Value(m.lost) }

// Reopens returns how often the device was reopened after a read error.
func (m *Metrics) Reopens() float64 { return report.Value(m.reopens) }
