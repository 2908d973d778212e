package report

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Namespace prefixes the daemon's own metrics. problem_counter and
// problem_gauge keep node-problem-detector's names so existing dashboards and
// alerts work unchanged.
const Namespace = "autopilot_health"

// Check run results, the values of the result label.
const (
	ResultOK      = "ok"      // ran, status False
	ResultProblem = "problem" // ran, status True
	ResultError   = "error"   // the probe returned an error
	ResultTimeout = "timeout"
	ResultPanic   = "panic"
)

// checkResults are the values of check_runs_total's result label.
var checkResults = []string{ResultOK, ResultProblem, ResultError, ResultTimeout, ResultPanic}

// Metrics holds the daemon's Prometheus metrics.
//
// Registry is where other parts register theirs; the go_* and process_*
// families are not on it (runtime). The six families that make
// most of a scrape (problem_counter, problem_gauge, condition_status and the
// check runs, durations and loop progress: ~480 of ~540 series) are not on
// it: each is a family, on a registry of its own, that changes only through
// a method of Metrics, which moves its version; a scrape gathers and encodes
// it again only when its version moved (exposition.go). The check runs and
// durations and the loop progress change at every check run, so each check's
// and each loop's series are a family of their own: a run moves the version
// of its check's and its loop's alone; RemoveCheck and RemoveLoop empty
// them (the family stays, with no series). Gatherer gathers them all.
type Metrics struct {
	Registry *Registry

	famsMu sync.Mutex
	fams   []*family // appended to, never changed

	problemCounter  *prometheus.CounterVec
	problemGauge    *prometheus.GaugeVec
	conditionStatus *prometheus.GaugeVec
	// problemOn is the reason whose problem_gauge series is 1, by
	// condition type: a condition has at most one, whatever reached it
	// (a change, a restore, the Node's word adopted at start).
	problemMu sync.Mutex
	problemOn map[string]Reason
	// checkDuration, checkRuns and loopProgress have no series: they
	// describe the families of checkParts and loopParts, made for each
	// check and loop by its first run.
	checkDuration *prometheus.HistogramVec
	checkRuns     *prometheus.CounterVec
	loopProgress  *prometheus.GaugeVec
	partsMu       sync.Mutex
	checkParts    map[string]*checkPart
	loopParts     map[string]*loopPart
	// versionedAll gathers all the versioned families at once (Gatherer).
	versionedAll *prometheus.Registry
	// runtime are the go_* and process_* collectors, which a text scrape
	// has write their text itself (runtimeCollector); runtimeReg gathers
	// them for Gatherer.
	runtime    []runtimeCollector
	runtimeReg *prometheus.Registry
	// The versions of the families above.
	vProblemCounter, vProblemGauge, vConditionStatus *family
	stateWrites                                      *prometheus.CounterVec
	healthy                                          prometheus.Gauge
	ready                                            prometheus.Gauge
	configReloads                                    *prometheus.CounterVec
	configLastOK                                     prometheus.Gauge
	configLastTime                                   prometheus.Gauge
	// stateBlockedSince: when the state write found blocked in I/O began,
	// in Unix nanoseconds; 0 while none is (StateWriteBlocked).
	stateBlockedSince atomic.Int64
}

// checkPart is one check's runs and durations; loopPart one loop's progress.
type checkPart struct {
	f    *family
	runs *prometheus.CounterVec
	dur  *prometheus.HistogramVec
}

type loopPart struct {
	f *family
	g *prometheus.GaugeVec
}

// NewMetrics creates and registers every metric on a fresh registry.
func NewMetrics(version string) *Metrics {
	r := NewRegistry()
	m := &Metrics{
		Registry: r,
		problemCounter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "problem_counter",
			Help: "Number of times a specific type of problem has occurred (events, and conditions turning True or True with a new reason).",
		}, []string{"reason"}),
		problemGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "problem_gauge",
			Help: "Whether a specific type of problem is affecting the node (1) or not (0).",
		}, []string{"type", "reason"}),
		conditionStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "condition_status",
			Help: "Current status of each condition the daemon owns: 1 for the status it has, 0 for the others.",
		}, []string{"condition", "status"}),
		checkDuration: newCheckDuration(),
		checkRuns:     newCheckRuns(),
		loopProgress:  newLoopProgress(),
		stateWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "state_writes_total",
			Help: "Writes of the local state file, by result.",
		}, []string{"result"}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "healthy",
			Help: "1 while every loop of the daemon makes progress (what /healthz reports), else 0.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "ready",
			Help: "1 once every check has run once since the daemon started.",
		}),
	}
	m.configReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "config_reloads_total",
		Help: "Reloads of the configuration file (SIGHUP, systemctl reload), by result: ok (applied, or nothing changed), error (refused; the running configuration stays).",
	}, []string{"result"})
	m.configLastOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "config_last_reload_successful",
		Help: "1 when the last load of the configuration file (at start or by a reload) succeeded, 0 when the last reload was refused.",
	})
	m.configLastTime = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "config_last_reload_success_timestamp_seconds",
		Help: "Unix time the configuration in effect was loaded (at start, or by the last successful reload).",
	})
	m.configReloads.WithLabelValues("ok")
	m.configReloads.WithLabelValues("error")
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Build information; the value is always 1.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	// Both results exist from the start, so that increase() in an alert
	// sees the first failed write.
	m.stateWrites.WithLabelValues("ok")
	m.stateWrites.WithLabelValues("error")
	m.vProblemCounter = m.family("", m.problemCounter)
	m.vProblemGauge = m.family("", m.problemGauge)
	m.vConditionStatus = m.family("", m.conditionStatus)
	m.checkParts = map[string]*checkPart{}
	m.loopParts = map[string]*loopPart{}
	m.versionedAll = prometheus.NewRegistry()
	m.versionedAll.MustRegister(m.problemCounter, m.problemGauge, m.conditionStatus, partsCollector{m})
	stateBlocked := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "state_write_blocked_seconds",
		Help: "How long the write of the local state file found blocked in I/O has not returned (a failing or hung disk under the state directory); 0 while no write is blocked.",
	}, func() float64 {
		since := m.stateBlockedSince.Load()
		if since == 0 {
			return 0
		}
		return time.Since(time.Unix(0, since)).Seconds()
	})
	r.MustRegister(m.stateWrites, stateBlocked, m.healthy, m.ready, m.configReloads, m.configLastOK, m.configLastTime, buildInfo)
	m.runtime = []runtimeCollector{newGoCollector(), newProcessCollector()}
	m.runtimeReg = prometheus.NewRegistry()
	for _, c := range m.runtime {
		m.runtimeReg.MustRegister(c)
	}
	return m
}

// family is metric families that change only through the methods of
// Metrics: each change moves version after it is made, so a scrape that
// read the version before gathering and finds it unchanged later may serve
// the text it encoded then.
type family struct {
	reg *prometheus.Registry
	// part: for one check's or loop's series, the value of their first
	// label, which orders them among the other parts of their metric
	// families; else "".
	part    string
	version atomic.Uint64
}

// family registers cs on a registry of their own, versioned.
func (m *Metrics) family(part string, cs ...prometheus.Collector) *family {
	f := &family{reg: prometheus.NewRegistry(), part: part}
	f.reg.MustRegister(cs...)
	m.famsMu.Lock()
	m.fams = append(m.fams, f)
	m.famsMu.Unlock()
	return f
}

// families are the versioned families made so far.
func (m *Metrics) families() []*family {
	m.famsMu.Lock()
	defer m.famsMu.Unlock()
	return m.fams[:len(m.fams):len(m.fams)]
}

// checkPart is check's runs and durations, made by its first run.
func (m *Metrics) checkPart(check string) *checkPart {
	m.partsMu.Lock()
	defer m.partsMu.Unlock()
	p := m.checkParts[check]
	if p == nil {
		p = &checkPart{runs: newCheckRuns(), dur: newCheckDuration()}
		p.f = m.family(check, p.dur, p.runs)
		m.checkParts[check] = p
	}
	return p
}

// loopPart is loop's progress, made by its first.
func (m *Metrics) loopPart(loop string) *loopPart {
	m.partsMu.Lock()
	defer m.partsMu.Unlock()
	p := m.loopParts[loop]
	if p == nil {
		p = &loopPart{g: newLoopProgress()}
		p.f = m.family(loop, p.g)
		m.loopParts[loop] = p
	}
	return p
}

// changed records a change made to f's metrics.
func (f *family) changed() { f.version.Add(1) }

// Gatherer gathers every metric: Registry's, the go_* and process_*
// families' and the versioned families', the latter through one registry of
// their own (versionedAll), not the registries of each part (one per check
// and per loop): protobuf scrapes and tests gather this way.
func (m *Metrics) Gatherer() prometheus.Gatherer {
	return prometheus.Gatherers{m.Registry, m.runtimeReg, m.versionedAll}
}

// partsCollector collects the series of every check's and loop's part.
type partsCollector struct{ m *Metrics }

func (p partsCollector) Describe(ch chan<- *prometheus.Desc) {
	p.m.checkDuration.Describe(ch)
	p.m.checkRuns.Describe(ch)
	p.m.loopProgress.Describe(ch)
}

func (p partsCollector) Collect(ch chan<- prometheus.Metric) {
	p.m.partsMu.Lock()
	var cs []prometheus.Collector
	for _, c := range p.m.checkParts {
		cs = append(cs, c.runs, c.dur)
	}
	for _, l := range p.m.loopParts {
		cs = append(cs, l.g)
	}
	p.m.partsMu.Unlock()
	for _, c := range cs {
		c.Collect(ch)
	}
}

// Describe sends the descriptors of every metric: Registry's, the go_* and
// process_* families' and the versioned families' (a vector with no series
// yet included).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.Registry.Describe(ch)
	m.runtimeReg.Describe(ch)
	m.versionedAll.Describe(ch)
}

// InitConditions creates the series of the conditions that apply to this
// node at zero, so that alerts can tell "no problem" from "no data", and
// problem_counter's of their problem reasons, so that increase() sees the
// first time one turns True (a series that first appears at 1 is no
// increase to Prometheus). node-problem-detector does the same for every
// rule's reason. A series that exists keeps its value: a condition the
// store kept while it did not apply (held True, or set aside as not
// applicable) applies again after a change of the node's role or GPU, and
// its gauges say what the store holds.
func (m *Metrics) InitConditions(types []string) {
	for _, t := range types {
		d, ok := Lookup(t)
		if !ok {
			continue
		}
		for _, r := range d.ProblemReasons {
			m.problemGauge.WithLabelValues(t, string(r))
			m.problemCounter.WithLabelValues(string(r))
		}
		for _, st := range []Status{StatusTrue, StatusFalse, StatusUnknown} {
			m.conditionStatus.WithLabelValues(t, string(st))
		}
	}
	m.vProblemCounter.changed()
	m.vProblemGauge.changed()
	m.vConditionStatus.changed()
}

// InitEvents creates the problem_counter series of the given event reasons
// at zero, but for an operator's action (EventDesc.Operator), which is no
// problem.
func (m *Metrics) InitEvents(reasons []string) {
	for _, r := range reasons {
		if operatorEvent(r) {
			continue
		}
		m.problemCounter.WithLabelValues(r)
	}
	m.vProblemCounter.changed()
}

// ConditionChanged implements Observer. problem_counter counts a condition
// turning True, and one that stays True with another reason (another
// problem occurred), as node-problem-detector does; a new message alone is
// no new occurrence.
func (m *Metrics) ConditionChanged(prev *Condition, cur Condition) {
	if cur.Status == StatusTrue && (prev == nil || prev.Status != StatusTrue || prev.Reason != cur.Reason) {
		m.problemCounter.WithLabelValues(string(cur.Reason)).Inc()
		m.vProblemCounter.changed()
	}
	m.setStatus(cur)
}

// ConditionRestored implements Observer: the gauges show the restored state;
// problem_counter does not count it again.
func (m *Metrics) ConditionRestored(c Condition) { m.setStatus(c) }

func (m *Metrics) setStatus(c Condition) {
	m.problemMu.Lock()
	if on, ok := m.problemOn[c.Type]; ok && (c.Status != StatusTrue || on != c.Reason) {
		m.problemGauge.WithLabelValues(c.Type, string(on)).Set(0)
		delete(m.problemOn, c.Type)
	}
	if c.Status == StatusTrue {
		m.problemGauge.WithLabelValues(c.Type, string(c.Reason)).Set(1)
		if m.problemOn == nil {
			m.problemOn = map[string]Reason{}
		}
		m.problemOn[c.Type] = c.Reason
	}
	m.problemMu.Unlock()
	for _, st := range []Status{StatusTrue, StatusFalse, StatusUnknown} {
		m.conditionStatus.WithLabelValues(c.Type, string(st)).Set(b2f(st == c.Status))
	}
	m.vProblemGauge.changed()
	m.vConditionStatus.changed()
}

// ConditionRemoved implements Remover: the condition's series are dropped,
// problem_counter's of its problem reasons (no other condition or event has
// them) included, as for a condition that does not apply to this node
// (InitConditions never created them).
func (m *Metrics) ConditionRemoved(c Condition) {
	m.problemMu.Lock()
	delete(m.problemOn, c.Type)
	m.problemGauge.DeletePartialMatch(prometheus.Labels{"type": c.Type})
	m.problemMu.Unlock()
	if d, ok := Lookup(c.Type); ok {
		for _, r := range d.ProblemReasons {
			m.problemCounter.DeleteLabelValues(string(r))
		}
	}
	m.conditionStatus.DeletePartialMatch(prometheus.Labels{"condition": c.Type})
	m.vProblemCounter.changed()
	m.vProblemGauge.changed()
	m.vConditionStatus.changed()
}

// operatorEvent reports whether reason is the event of an operator's
// action (EventDesc.Operator), not a problem.
func operatorEvent(reason string) bool {
	d, ok := LookupEvent(reason)
	return ok && d.Operator
}

// EventEmitted implements Observer: a problem's event counts in
// problem_counter; an operator's action (a tamper clear) does not.
func (m *Metrics) EventEmitted(e Event) {
	if operatorEvent(e.Reason) {
		return
	}
	m.problemCounter.WithLabelValues(e.Reason).Inc()
	m.vProblemCounter.changed()
}

// InitCheck creates check's run series of every result at 0: the runner
// starts the check. increase() and rate() do not see a series that first
// appears at 1, so the first run of each result (the first ok, the first
// timeout) would not show.
func (m *Metrics) InitCheck(check string) {
	p := m.checkPart(check)
	for _, res := range checkResults {
		p.runs.WithLabelValues(check, res)
	}
	p.f.changed()
}

// CheckRun records one run of a check.
func (m *Metrics) CheckRun(check, result string, d time.Duration) {
	p := m.checkPart(check)
	p.runs.WithLabelValues(check, result).Inc()
	p.dur.WithLabelValues(check).Observe(d.Seconds())
	p.f.changed()
}

// LoopProgress records that a loop made progress.
func (m *Metrics) LoopProgress(loop string, t time.Time) {
	p := m.loopPart(loop)
	p.g.WithLabelValues(loop).Set(float64(t.UnixNano()) / 1e9)
	p.f.changed()
}

// RemoveCheck drops a check's runs and durations: the check stopped (a
// reload disabled it, or the node's role or GPU no longer has it), and
// leaves the metrics as a check not run at start. Its part stays, empty,
// among the versioned families (a scrape shows none of its series once
// the version moved); the check started again makes its series anew, at 0
// (InitCheck).
func (m *Metrics) RemoveCheck(check string) {
	m.partsMu.Lock()
	p := m.checkParts[check]
	m.partsMu.Unlock()
	if p == nil {
		return
	}
	p.runs.Reset()
	p.dur.Reset()
	p.f.changed()
}

// RemoveLoop drops a loop's progress: the loop ended on purpose (a check
// that stopped). A later progress of the loop makes its series anew.
func (m *Metrics) RemoveLoop(loop string) {
	m.partsMu.Lock()
	p := m.loopParts[loop]
	m.partsMu.Unlock()
	if p == nil {
		return
	}
	p.g.Reset()
	p.f.changed()
}

// StateWrite records a write of the state file.
func (m *Metrics) StateWrite(err error) {
	if err != nil {
		m.stateWrites.WithLabelValues("error").Inc()
		return
	}
	m.stateWrites.WithLabelValues("ok").Inc()
}

// StateWriteBlocked records that the state write begun at since is blocked
// in I/O; the zero time: no write is (it returned).
func (m *Metrics) StateWriteBlocked(since time.Time) {
	if since.IsZero() {
		m.stateBlockedSince.Store(0)
		return
	}
	m.stateBlockedSince.Store(since.UnixNano())
}

// ConfigLoaded records the configuration loaded at start.
func (m *Metrics) ConfigLoaded(now time.Time) {
	m.configLastOK.Set(1)
	m.configLastTime.Set(float64(now.UnixNano()) / 1e9)
}

// ConfigReload records a reload of the configuration: err nil, applied
// (or nothing changed) at now; else refused.
func (m *Metrics) ConfigReload(err error, now time.Time) {
	if err != nil {
		m.configReloads.WithLabelValues("error").Inc()
		m.configLastOK.Set(0)
		return
	}
	m.configReloads.WithLabelValues("ok").Inc()
	m.ConfigLoaded(now)
}

// SetHealthy records the daemon's own health.
func (m *Metrics) SetHealthy(ok bool) { m.healthy.Set(b2f(ok)) }

// SetReady records that the first full pass completed.
func (m *Metrics) SetReady(ok bool) { m.ready.Set(b2f(ok)) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Value returns the current value of a counter or gauge (for status lines
// and tests); 0 for other kinds.
func Value(m prometheus.Metric) float64 {
	var pb dto.Metric
	if m.Write(&pb) != nil {
		return 0
	}
	switch {
	case pb.Counter != nil:
		return pb.GetCounter().GetValue()
	case pb.Gauge != nil:
		return pb.GetGauge().GetValue()
	}
	return 0
}

// StateWritesFor returns the counter of state file writes with a result
// ("ok" or "error").
func (m *Metrics) StateWritesFor(result string) prometheus.Counter {
	return m.stateWrites.WithLabelValues(result)
}

func newCheckDuration() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "check_duration_seconds",
		Help:    "Duration of check runs.",
		Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30},
	}, []string{"check"})
}

func newCheckRuns() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "check_runs_total",
		Help: "Check runs by result: ok, problem, error, timeout, panic.",
	}, []string{"check", "result"})
}

func newLoopProgress() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "loop_last_progress_timestamp_seconds",
		Help: "Unix time each of the daemon's loops last made progress.",
	}, []string{"loop"})
}
