package kube

import (
	"errors"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// Write kinds, the values of the kind label.
const (
	KindStatus      = "status"
	KindEvent       = "event"
	KindEventCount  = "event_count"
	KindAnnotations = "annotations"
	KindRead        = "read"
)

// kinds are the write kinds: the values of the kind label.
var kinds = []string{KindStatus, KindEvent, KindEventCount, KindAnnotations, KindRead}

// results are the values of the result label (resultOf), ok first.
var results = []string{"ok", "forbidden", "not_found", "error"}

// Why event occurrences were dropped, the values of events_dropped_total's
// reason label.
const (
	// DropQueueFull: the queue was full.
	DropQueueFull = "queue_full"
	// DropTableFull: the aggregation table was full.
	DropTableFull = "table_full"
	// DropRefused: the API server refused the Event for what it is.
	DropRefused = "refused"
	// DropNotAsWritten: the state file held them not as the daemon writes
	// them (an edited file).
	DropNotAsWritten = "not_as_written"
	// DropAnotherNode: the credentials name another node than node_name,
	// or Events kept in the state file are of an earlier node_name; no
	// Event goes about a node that is not the credentials' own, nor this
	// one's.
	DropAnotherNode = "another_node"
)

// dropReasons are the values of the reason label.
var dropReasons = []string{DropQueueFull, DropTableFull, DropRefused, DropNotAsWritten, DropAnotherNode}

// Metrics are the reporter's Prometheus metrics.
type Metrics struct {
	writes    *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	dropped   *prometheus.CounterVec
	coalesced prometheus.Counter
	reporting prometheus.Gauge
	lastOK    prometheus.Gauge
	// overwritten counts the daemon's conditions found on the Node changed
	// by another writer (Reporter.overwrittenLocked).
	overwritten prometheus.Counter
	// leftOut counts, per domain, the report refreshes that wrote the
	// domain's document as a stub because it did not fit on the Node
	// beside its other annotations (fitReport).
	leftOut *prometheus.CounterVec

	// What status shows: per kind of call, the last success and the last
	// error; whether a change of the conditions waits to be written; the
	// events queued.
	mu            sync.Mutex
	calls         map[string]*CallStatus
	statusPending bool
	queue         *EventQueue
	// eventsWaiting: occurrences the event writer holds that are not on
	// the API server yet (setEventsWaiting).
	eventsWaiting int
	// leftOutNow, tamperAsIs: what the last refresh that landed left out
	// (setLeftOut).
	leftOutNow []string
	tamperAsIs bool
	// node: the conditions' writes to the Node failed in a row, if any
	// (nodewrites.go); wake is called when that is said or ends (SetWake).
	node nodeWrites
	wake func()
}

// CallStatus is what happened to one kind of API call.
type CallStatus struct {
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	LastError   string    `json:"lastError,omitempty"`
	LastErrorAt time.Time `json:"lastErrorAt,omitzero"`
	// Failing: the last call of this kind failed.
	Failing bool `json:"failing"`
}

// Reporting is the state of the Kubernetes reporting, for status.
type Reporting struct {
	// Calls by kind (status, event, event_count, annotations, read).
	Calls map[string]CallStatus `json:"calls"`
	// StatusPending: a change of the conditions is not on the Node yet (a
	// change of messages alone waits for the next heartbeat).
	StatusPending bool `json:"statusPending"`
	// EventsQueued: event occurrences not on the API server yet: those
	// queued, and those the event writer holds in Events not created yet
	// or counts not patched yet (an outage of the events API).
	EventsQueued int `json:"eventsQueued"`
	// ReportLeftOut: the report domains the last refresh that landed left
	// out for want of room on the Node (a stub in their place, or none);
	// absent when it wrote the whole report.
	ReportLeftOut []string `json:"reportLeftOut,omitempty"`
	// TamperAnnotationAsIs: that refresh left the Node's tamper annotation
	// as it was (not even its stub fit): its updatedAt stands still while
	// the daemon runs.
	TamperAnnotationAsIs bool `json:"tamperAnnotationAsIs,omitempty"`
	// NodeNotUpdated: no write of the conditions has landed on the Node
	// for NodeStaleAfter or longer while they were tried (absent
	// otherwise, and standalone).
	NodeNotUpdated *NodeNotUpdated `json:"nodeNotUpdated,omitempty"`
}

// NewMetrics creates the API metrics and registers them on reg (may be nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		calls: map[string]*CallStatus{},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "api_writes_total",
			Help: "Kubernetes API calls by kind (status, event, event_count, annotations, read) and result (ok, forbidden, not_found, error).",
		}, []string{"kind", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: report.Namespace, Name: "api_write_duration_seconds",
			Help:    "Latency of Kubernetes API calls by kind.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 15},
		}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "events_dropped_total",
			Help: "Event occurrences not sent to the API server, by reason: queue_full (the queue was full), table_full (the aggregation table was full), refused (the API server refused the Event itself: invalid, too large), not_as_written (the state file held them not as the daemon writes them), another_node (the credentials name another node than node_name, or Events kept in the state file under an earlier node_name: the daemon speaks about no other node).",
		}, []string{"reason"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "events_aggregated_total",
			Help: "Event occurrences folded into the count of an existing Event instead of a new one.",
		}),
		reporting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: report.Namespace, Name: "kubernetes_reporting",
			Help: "1 when the daemon reports to Kubernetes (a kubeconfig was found), 0 when it runs standalone.",
		}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: report.Namespace, Name: "api_last_success_timestamp_seconds",
			Help: "Unix time of the last successful Kubernetes API call.",
		}),
		overwritten: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "condition_overwrites_total",
			Help: "The daemon's conditions found on the Node changed by another writer (another status, reason or transition time than it wrote, one removed, one it does not evaluate there added, a second entry of one); each is put right by the next write.",
		}),
		leftOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: report.Namespace, Name: "report_documents_left_out_total",
			Help: "Report refreshes that left a domain's document out, by domain: it did not fit beside the Node's other annotations (256 KiB together), and was written as a small one saying so, or, where not even those fit, taken off the Node (tamper's left as it was).",
		}, []string{"domain"}),
	}
	// Every domain's series is there at 0 from the start, so that
	// increase() sees the first document left out.
	for _, dm := range report.Domains {
		m.leftOut.WithLabelValues(dm.Name)
	}
	// Every kind's series of every result is there at 0 from the start:
	// increase() and rate() do not see a series that first appears at 1.
	// The alert on failing calls (AutopilotHealthAPIWritesFailing) takes a
	// kind whose ok count did not rise in 15 minutes for failing: the
	// Node's read, made once per start and retried while the API server
	// cannot be reached, would count as failing for 15 minutes after it
	// worked. And it takes a kind whose failures rose for failing: a
	// failure series born at 1 hid the first failure of its kind and
	// result (a kind made rarely, an Event refused once, was never seen
	// failing; a kind failing every call was seen a call later).
	for _, kind := range kinds {
		for _, res := range results {
			m.writes.WithLabelValues(kind, res)
		}
	}
	// Every reason's series too: the first drop of a reason is an increase.
	for _, reason := range dropReasons {
		m.dropped.WithLabelValues(reason)
	}
	if reg != nil {
		reg.MustRegister(m.writes, m.latency, m.dropped, m.coalesced, m.reporting, m.lastOK, m.overwritten, m.leftOut)
	}
	return m
}

// observe counts a call of kind that started at start and ended with err,
// and its latency, unless it never reached the API server because the
// kubeconfig's files did not answer (ErrFilesHung: its time is the look's
// wait, lookWait, not the API server's).
func (m *Metrics) observe(kind string, start time.Time, err error) {
	m.writes.WithLabelValues(kind, resultOf(err)).Inc()
	if !errors.Is(err, ErrFilesHung) {
		m.latency.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
	if err == nil {
		m.lastOK.SetToCurrentTime()
	}
	m.called(kind, err)
}

// called records the outcome of a call of kind for status (its last
// success, its last error), not counted: a status write that carries the
// report refresh is counted once, as status, and is the refresh's call too.
func (m *Metrics) called(kind string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.calls[kind]
	if c == nil {
		c = &CallStatus{}
		m.calls[kind] = c
	}
	if err == nil {
		c.LastSuccess, c.Failing = time.Now(), false
	} else {
		c.LastError, c.LastErrorAt, c.Failing = err.Error(), time.Now(), true
	}
}

func (m *Metrics) setStatusPending(p bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.statusPending = p
}

// Reporting returns the state of the reporting now.
func (m *Metrics) Reporting() Reporting {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := Reporting{Calls: make(map[string]CallStatus, len(m.calls)), StatusPending: m.statusPending}
	for k, c := range m.calls {
		r.Calls[k] = *c
	}
	r.EventsQueued = m.eventsWaiting
	r.ReportLeftOut, r.TamperAnnotationAsIs = slices.Clone(m.leftOutNow), m.tamperAsIs
	if n, ok := m.nodeNotUpdatedLocked(); ok {
		r.NodeNotUpdated = &n
	}
	if m.queue != nil {
		r.EventsQueued += len(m.queue.ch)
	}
	return r
}

// setLeftOut records what the last refresh that landed left out (none:
// the whole report), for status.
func (m *Metrics) setLeftOut(left []string, asIs bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leftOutNow, m.tamperAsIs = slices.Clone(left), asIs
}

// setEventsWaiting records the occurrences the event writer holds that are
// not on the API server yet.
func (m *Metrics) setEventsWaiting(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.eventsWaiting = n
}

func resultOf(err error) string {
	var se apierrors.APIStatus
	switch {
	case err == nil:
		return "ok"
	case apierrors.IsForbidden(err):
		return "forbidden"
	case apierrors.IsNotFound(err):
		return "not_found"
	case errors.As(err, &se):
		return "error"
	}
	return "error"
}

// drop counts n event occurrences dropped for reason.
func (m *Metrics) drop(reason string, n float64) { m.dropped.WithLabelValues(reason).Add(n) }

// Dropped returns the event occurrences dropped for reason.
func (m *Metrics) Dropped(reason string) float64 {
	return report.Value(m.dropped.WithLabelValues(reason))
}

// droppedTotal returns the event occurrences dropped for any reason.
func (m *Metrics) droppedTotal() float64 {
	var n float64
	for _, reason := range dropReasons {
		n += m.Dropped(reason)
	}
	return n
}

// Overwrites returns the number of the daemon's conditions found changed
// on the Node by another writer.
func (m *Metrics) Overwrites() float64 { return report.Value(m.overwritten) }

// LeftOut returns how many report refreshes left the domain's document
// out for room.
func (m *Metrics) LeftOut(domain string) float64 {
	return report.Value(m.leftOut.WithLabelValues(domain))
}

// SetReporting records whether the daemon reports to Kubernetes.
func (m *Metrics) SetReporting(on bool) {
	if on {
		m.reporting.Set(1)
	} else {
		m.reporting.Set(0)
	}
}

// Failures returns the number of failed API calls so far (for tests and
// status lines).
func (m *Metrics) Failures() float64 {
	var n float64
	for _, kind := range kinds {
		for _, res := range results[1:] {
			n += report.Value(m.writes.WithLabelValues(kind, res))
		}
	}
	return n
}

// Forbidden returns the number of API calls refused as forbidden.
func (m *Metrics) Forbidden() float64 {
	var n float64
	for _, kind := range kinds {
		n += report.Value(m.writes.WithLabelValues(kind, "forbidden"))
	}
	return n
}
