package report

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

func textOf(t *testing.T, mfs []*dto.MetricFamily) string {
	t.Helper()
	var b bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// badCollector sends what it is told: series twice, a metric that fails to
// write.
type badCollector struct {
	desc *prometheus.Desc
	ms   []prometheus.Metric
}

func (c badCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c badCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.ms {
		ch <- m
	}
}

type panicking struct{ desc *prometheus.Desc }

func (c panicking) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c panicking) Collect(chan<- prometheus.Metric)    { panic("collector bug") }

type failingMetric struct{ desc *prometheus.Desc }

func (m failingMetric) Desc() *prometheus.Desc  { return m.desc }
func (m failingMetric) Write(*dto.Metric) error { return errors.New("cannot write") }

// A text scrape's own gathering of the registry gathers what
// prometheus.(*Registry).Gather does: the same families, help, types, series
// and order, byte for byte once encoded; and where Gather fails, it fails
// with Gather's error.
func TestRegistryGatherTextMatchesGather(t *testing.T) {
	r := NewRegistry()
	check := func(step string) {
		t.Helper()
		want, werr := r.Registry.Gather()
		got, gerr := r.gatherText()
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("%s: error %v, Gather's %v", step, gerr, werr)
		}
		if g, w := textOf(t, got), textOf(t, want); g != w {
			t.Fatalf("%s: gathered\n%s\nGather gathers\n%s", step, g, w)
		}
	}
	check("empty")
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "a \\ help\nwith \"escapes\""}, []string{"b", "a"})
	gv := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g", Help: "gauge", ConstLabels: prometheus.Labels{"k": "v"}}, []string{"x"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h_seconds", Help: "hist", Buckets: []float64{.1, 1}}, []string{"check"})
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "s", Help: "sum", Objectives: map[float64]float64{0.5: 0.05}})
	u := prometheus.NewUntypedFunc(prometheus.UntypedOpts{Name: "u", Help: "untyped"}, func() float64 { return 3 })
	gf := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "a_first", Help: "func", Unit: "bytes"}, func() float64 { return 1e21 })
	r.MustRegister(vec, gv, h, s, u, gf)
	check("vectors without series")
	for _, lv := range [][2]string{{"z", "1"}, {"a", "2"}, {"m", "0"}, {"a", "1"}, {"", "x"}} {
		vec.WithLabelValues(lv[0], lv[1]).Add(float64(len(lv[0]) + 1))
	}
	gv.WithLabelValues("y").Set(-1)
	gv.WithLabelValues("b").Set(0.25)
	h.WithLabelValues("Z").Observe(0.5)
	h.WithLabelValues("A").Observe(5)
	s.Observe(2)
	check("series in every kind of family")
	gv.DeleteLabelValues("y")
	gv.DeleteLabelValues("b")
	check("a family emptied")

	// Where Gather fails, so does it, with Gather's error; the registry
	// serves again once the collector is gone.
	d := prometheus.NewDesc("dup", "twice", []string{"l"}, nil)
	twice := badCollector{d, []prometheus.Metric{
		prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 1, "a"),
		prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 2, "a"),
	}}
	r.MustRegister(twice)
	if _, err := r.gatherText(); err == nil {
		t.Fatal("a series twice: no error")
	}
	check("a series twice")
	r.Unregister(twice)
	check("after an unregistration")

	r2 := NewRegistry()
	fd := prometheus.NewDesc("fails", "fails", nil, nil)
	r2.MustRegister(badCollector{fd, []prometheus.Metric{failingMetric{fd}}})
	if _, err := r2.gatherText(); err == nil {
		t.Fatal("a metric that fails to write: no error")
	}
	// A collector that panics: an error, as Gather makes it, not a crash.
	r4 := NewRegistry()
	r4.MustRegister(panicking{prometheus.NewDesc("p", "p", nil, nil)}, prometheus.NewGauge(prometheus.GaugeOpts{Name: "ok", Help: "ok"}))
	if _, err := r4.gatherText(); err == nil || !strings.Contains(err.Error(), "panic") {
		t.Fatalf("a collector that panics: error %v", err)
	}
	// A family whose name collides with another's series (x and
	// x_count of a summary x): Gather's error (which of the two it names
	// first depends on the order Gather collects in).
	r3 := NewRegistry()
	r3.MustRegister(prometheus.NewSummary(prometheus.SummaryOpts{Name: "x", Help: "x"}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x_count", Help: "x count"}, func() float64 { return 1 }))
	_, werr := r3.Registry.Gather()
	if _, err := r3.gatherText(); werr == nil || err == nil || !strings.Contains(err.Error(), "collides with previously collected") {
		t.Fatalf("a suffix collision: error %v, Gather's %v", err, werr)
	}
}

// A registration does not wait for a text scrape's collectors: a collector
// that waits on a registration made meanwhile does not hang the scrape.
func TestRegistrationDuringGatherText(t *testing.T) {
	r := NewRegistry()
	var once sync.Once
	registered := make(chan struct{})
	r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "waits", Help: "waits on a registration"}, func() float64 {
		once.Do(func() {
			go func() {
				r.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "late", Help: "registered while gathering"}))
				close(registered)
			}()
			<-registered
		})
		return 1
	}))
	done := make(chan error, 1)
	go func() {
		_, err := r.gatherText()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a bound on a hang, not a wait for a condition
		t.Fatal("the gathering and the registration wait on each other")
	}
	mfs, err := r.gatherText()
	if err != nil || len(mfs) != 2 {
		t.Fatalf("after the registration: %d families, error %v", len(mfs), err)
	}
}

// labelled is a gauge that writes the labels it is given, in that order,
// whatever its descriptor says (a Metric of its own, as a collector may
// have).
type labelled struct {
	desc   *prometheus.Desc
	labels [][2]string
}

func (m labelled) Desc() *prometheus.Desc { return m.desc }
func (m labelled) Write(pb *dto.Metric) error {
	for _, l := range m.labels {
		pb.Label = append(pb.Label, &dto.LabelPair{Name: new(l[0]), Value: new(l[1])})
	}
	pb.Gauge = &dto.Gauge{Value: new(1.0)}
	return nil
}

// later sends good, and bad too once on.
type later struct {
	good, bad []prometheus.Metric
	on        *bool
}

func (c later) Describe(chan<- *prometheus.Desc) {}
func (c later) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.good {
		ch <- m
	}
	if *c.on {
		for _, m := range c.bad {
			ch <- m
		}
	}
}

// A series whose labels Gather refuses (a name twice, an invalid name, a
// value that is not UTF-8, a summary's own quantile label) or puts in order
// (written out of order), appearing in a family set already checked: the text scrape's gathering is still
// Gather's, its error or its order.
func TestRegistryGatherTextChecksSeriesAsGather(t *testing.T) {
	g := prometheus.NewDesc("g", "g", nil, nil)
	good := []prometheus.Metric{labelled{g, [][2]string{{"a", "x"}, {"b", "y"}}}, prometheus.MustNewConstSummary(prometheus.NewDesc("s", "s", nil, nil), 1, 1, nil)}
	for step, bad := range map[string]prometheus.Metric{
		"a label name twice":         labelled{g, [][2]string{{"a", "1"}, {"a", "2"}}},
		"a reserved label name":      labelled{g, [][2]string{{"__a", "1"}, {"b", "2"}}},
		"a label value not UTF-8":    labelled{g, [][2]string{{"a", "\xff"}, {"b", "2"}}},
		"labels out of order":        labelled{g, [][2]string{{"b", "2"}, {"a", "1"}}},
		"a summary's quantile label": prometheus.MustNewConstSummary(prometheus.NewDesc("s", "s", []string{"quantile"}, nil), 1, 1, nil, "0.5"),
	} {
		r := NewRegistry()
		on := false
		r.MustRegister(later{good, []prometheus.Metric{bad}, &on})
		if _, err := r.gatherText(); err != nil { // the family set checked
			t.Fatal(err)
		}
		on = true
		want, werr := r.Registry.Gather()
		got, gerr := r.gatherText()
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Errorf("%s: error %v, Gather's %v", step, gerr, werr)
			continue
		}
		if g, w := textOf(t, got), textOf(t, want); g != w {
			t.Errorf("%s: gathered\n%s\nGather gathers\n%s", step, g, w)
		}
	}
}
