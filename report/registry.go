package report

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
)

// Registry is the registry other parts of the daemon register their metrics
// on: a prometheus.Registry (which checks each registration, and gathers for
// protobuf scrapes and tests) that also keeps the collectors registered, so
// that a text scrape can gather them itself (gatherText): one goroutine
// sending every collector's metrics over a small channel to the scraping
// goroutine, where prometheus.(*Registry).Gather starts collector goroutines,
// makes two channels of 1,000 metrics (32 KB) and hashes each series to
// check it, every scrape.
type Registry struct {
	*prometheus.Registry

	mu         sync.Mutex // guards collectors and unregistered
	collectors []prometheus.Collector
	// unregistered: a collector was unregistered (nothing in the daemon
	// does): gatherText gathers through the prometheus.Registry from then on.
	unregistered bool

	// gatherMu serializes gatherText and guards what follows; a
	// registration does not wait for a gathering's collectors.
	gatherMu sync.Mutex
	descs    map[*prometheus.Desc]descText
	// validated: the families (name and type) of the last gathering whose
	// families the prometheus.Registry found consistent.
	validated []famShape
}

type descText struct{ name, help string }

type famShape struct {
	name string
	typ  dto.MetricType
}

// NewRegistry is an empty Registry.
func NewRegistry() *Registry {
	return &Registry{Registry: prometheus.NewRegistry(), descs: map[*prometheus.Desc]descText{}}
}

// Register implements prometheus.Registerer.
func (r *Registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.collectors = append(r.collectors, c)
	r.mu.Unlock()
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *Registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer.
func (r *Registry) Unregister(c prometheus.Collector) bool {
	if !r.Registry.Unregister(c) {
		return false
	}
	r.mu.Lock()
	r.unregistered = true
	r.mu.Unlock()
	return true
}

// gatherText gathers what a text scrape shows of the registry's metrics:
// the families Gather returns, with the same names, help, types, series and
// order. Where Gather would find something wrong (a collector that panics,
// a metric that does not write, families that disagree, a series twice, a
// family set it has not checked), it is what gathers, and its error is
// returned.
func (r *Registry) gatherText() ([]*dto.MetricFamily, error) {
	r.gatherMu.Lock()
	defer r.gatherMu.Unlock()
	r.mu.Lock()
	unregistered, cs := r.unregistered, r.collectors[:len(r.collectors):len(r.collectors)]
	r.mu.Unlock()
	if unregistered {
		return r.Registry.Gather()
	}
	ch := make(chan prometheus.Metric, 64)
	var panicked atomic.Bool
	go func() {
		defer close(ch)
		for _, c := range cs {
			// A collector that panics is an error of the scrape, as
			// Gather makes it, not the daemon's end.
			func() {
				defer func() {
					if recover() != nil {
						panicked.Store(true)
					}
				}()
				c.Collect(ch)
			}()
		}
	}()
	byName := map[string]*dto.MetricFamily{}
	ok := true
	for m := range ch {
		if !ok {
			continue // drained
		}
		ok = r.add(byName, m)
	}
	if !ok || panicked.Load() {
		return r.Registry.Gather()
	}
	mfs := make([]*dto.MetricFamily, 0, len(byName))
	for _, mf := range byName {
		if len(mf.Metric) > 0 {
			mfs = append(mfs, mf)
		}
	}
	slices.SortFunc(mfs, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	for _, mf := range mfs {
		slices.SortFunc(mf.Metric, compareMetrics)
		for i := 1; i < len(mf.Metric); i++ {
			if sameLabels(mf.Metric[i-1], mf.Metric[i]) {
				return r.Registry.Gather() // a series twice: Gather's error
			}
		}
	}
	// The family set (names and types) Gather checks across families
	// (suffix collisions): checked by Gather whenever it changes.
	same := len(mfs) == len(r.validated)
	for i := 0; same && i < len(mfs); i++ {
		same = mfs[i].GetName() == r.validated[i].name && mfs[i].GetType() == r.validated[i].typ
	}
	if !same {
		if _, err := r.Registry.Gather(); err != nil {
			return r.Registry.Gather()
		}
		r.validated = r.validated[:0]
		for _, mf := range mfs {
			r.validated = append(r.validated, famShape{mf.GetName(), mf.GetType()})
		}
	}
	return mfs, nil
}

// add adds m to its family, as Gather does; false where Gather would fail.
func (r *Registry) add(byName map[string]*dto.MetricFamily, m prometheus.Metric) bool {
	desc := m.Desc()
	dt, ok := r.descs[desc]
	if !ok {
		if dt, ok = parseDesc(desc); !ok {
			return false
		}
		if len(r.descs) >= 1024 {
			clear(r.descs) // bounded: a collector making descriptors as it collects
		}
		r.descs[desc] = dt
	}
	pb := &dto.Metric{}
	if m.Write(pb) != nil {
		return false
	}
	// Gather's checks of a series' labels (checkMetricConsistency): a
	// name twice, an invalid or reserved name, a summary's own quantile
	// label, a value that is not UTF-8; and labels written out of order,
	// which Gather puts in order. Where it would refuse or reorder, it
	// gathers.
	prev := ""
	for i, lp := range pb.Label {
		name := lp.GetName()
		if i > 0 && name <= prev || !model.UTF8Validation.IsValidLabelName(name) || strings.HasPrefix(name, "__") ||
			pb.Summary != nil && name == "quantile" || !utf8.ValidString(lp.GetValue()) {
			return false
		}
		prev = name
	}
	var typ dto.MetricType
	switch {
	case pb.Gauge != nil:
		typ = dto.MetricType_GAUGE
	case pb.Counter != nil:
		typ = dto.MetricType_COUNTER
	case pb.Summary != nil:
		typ = dto.MetricType_SUMMARY
	case pb.Untyped != nil:
		typ = dto.MetricType_UNTYPED
	case pb.Histogram != nil:
		typ = dto.MetricType_HISTOGRAM
	default:
		return false
	}
	mf := byName[dt.name]
	if mf == nil {
		mf = &dto.MetricFamily{Name: &dt.name, Help: &dt.help, Type: &typ}
		byName[dt.name] = mf
	} else if mf.GetHelp() != dt.help || mf.GetType() != typ {
		return false
	}
	mf.Metric = append(mf.Metric, pb)
	return true
}

// parseDesc reads a descriptor's name and help from its String (Desc has
// no getters): `Desc{fqName: "...", help: "...", ...}`, each quoted by %q.
func parseDesc(d *prometheus.Desc) (descText, bool) {
	s, ok := strings.CutPrefix(d.String(), "Desc{fqName: ")
	if !ok {
		return descText{}, false
	}
	qn, err := strconv.QuotedPrefix(s)
	if err != nil {
		return descText{}, false
	}
	s, ok = strings.CutPrefix(s[len(qn):], ", help: ")
	if !ok {
		return descText{}, false
	}
	qh, err := strconv.QuotedPrefix(s)
	if err != nil {
		return descText{}, false
	}
	name, err1 := strconv.Unquote(qn)
	help, err2 := strconv.Unquote(qh)
	if err1 != nil || err2 != nil || name == "" {
		return descText{}, false
	}
	return descText{name, help}, true
}

// compareMetrics orders a family's series as client_golang's MetricSorter
// does: by the number of labels, then by label values in order, then by
// timestamp (none last).
func compareMetrics(a, b *dto.Metric) int {
	if len(a.Label) != len(b.Label) {
		return len(a.Label) - len(b.Label)
	}
	for i, lp := range a.Label {
		if c := strings.Compare(lp.GetValue(), b.Label[i].GetValue()); c != 0 {
			return c
		}
	}
	switch {
	case a.TimestampMs == nil && b.TimestampMs == nil:
		return 0
	case a.TimestampMs == nil:
		return 1
	case b.TimestampMs == nil:
		return -1
	}
	return cmp.Compare(a.GetTimestampMs(), b.GetTimestampMs())
}

// sameLabels: the same label values, as Gather's check of a series seen
// twice compares them (the names are the family's).
func sameLabels(a, b *dto.Metric) bool {
	if len(a.Label) != len(b.Label) {
		return false
	}
	for i, lp := range a.Label {
		if lp.GetName() != b.Label[i].GetName() || lp.GetValue() != b.Label[i].GetValue() {
			return false
		}
	}
	return true
}
