package report

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// runtimeCollector is a collector of families that change every scrape (the
// go_* and process_* ones) whose text a text-format scrape writes straight
// into its buffer (appendText), in the scraping goroutine: no
// Registry.Gather (its collector goroutines and channels), no Metric, dto or
// encoder per value. Collect serves the same values to a registry (protobuf
// and OpenMetrics scrapes, tests). Both read a snapshot of the values into
// vals, present[i] false where one could not be read.
type runtimeCollector interface {
	prometheus.Collector
	// appendText appends the text of each family read now to b and one
	// namedText per family to named.
	appendText(b []byte, named []namedText) ([]byte, []namedText)
}

// valueKind is what a runtimeFamily is.
type valueKind int

const (
	kindGauge valueKind = iota
	kindCounter
	// kindSummary: a summary of go_gc_duration_seconds' shape; its values
	// are the quantiles 0, .25, .5, .75, 1, then the sum and the count.
	kindSummary
)

// summaryQuantiles are the quantiles of a kindSummary family.
var summaryQuantiles = [...]float64{0, 0.25, 0.5, 0.75, 1}

// runtimeFamily is one family of a runtimeCollector: how Collect sends it
// and the text around its values. Its values are vals[at:at+n] of the
// collector's snapshot.
type runtimeFamily struct {
	name string
	help string
	desc *prometheus.Desc
	kind valueKind
	at   int
	// segs: the family's text is segs[0] value[0] "\n" segs[1] value[1]
	// "\n" ... as the text encoder writes it (segs[0] begins with the
	// # HELP and # TYPE lines).
	segs [][]byte
}

func (f *runtimeFamily) n() int {
	if f.kind == kindSummary {
		return len(summaryQuantiles) + 2
	}
	return 1
}

// newRuntimeFamily makes a family and its text template: the text the
// encoder of github.com/prometheus/common writes for it, with every value
// 0, cut before each value.
func newRuntimeFamily(name, help string, kind valueKind, at int, desc *prometheus.Desc) runtimeFamily {
	f := runtimeFamily{name: name, help: help, desc: desc, kind: kind, at: at}
	zeros := make([]float64, f.n())
	var m prometheus.Metric
	switch kind {
	case kindGauge:
		m = prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, 0)
	case kindCounter:
		m = prometheus.MustNewConstMetric(desc, prometheus.CounterValue, 0)
	case kindSummary:
		m = summaryMetric(desc, zeros)
	}
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		panic(err)
	}
	typ := map[valueKind]dto.MetricType{kindGauge: dto.MetricType_GAUGE, kindCounter: dto.MetricType_COUNTER, kindSummary: dto.MetricType_SUMMARY}[kind]
	var b bytes.Buffer
	if _, err := expfmt.MetricFamilyToText(&b, &dto.MetricFamily{Name: &name, Help: &help, Type: &typ, Metric: []*dto.Metric{&pb}}); err != nil {
		panic(err)
	}
	text := b.Bytes()
	var seg []byte
	for len(text) > 0 {
		i := bytes.IndexByte(text, '\n')
		line := text[:i+1]
		text = text[i+1:]
		if line[0] == '#' {
			seg = append(seg, line...)
			continue
		}
		v, ok := bytes.CutSuffix(line, []byte(" 0\n"))
		if !ok {
			panic(fmt.Sprintf("%s: a sample line %q does not end in its value 0", name, line))
		}
		f.segs = append(f.segs, append(append(seg, v...), ' '))
		seg = nil
	}
	if len(f.segs) != f.n() {
		panic(fmt.Sprintf("%s: %d sample lines, want %d", name, len(f.segs), f.n()))
	}
	return f
}

// summaryMetric is a kindSummary family's metric from its values.
func summaryMetric(desc *prometheus.Desc, v []float64) prometheus.Metric {
	q := make(map[float64]float64, len(summaryQuantiles))
	for i, qq := range summaryQuantiles {
		q[qq] = v[i]
	}
	n := len(summaryQuantiles)
	return prometheus.MustNewConstSummary(desc, uint64(v[n+1]), v[n], q)
}

// runtimeSnapshot is what the two runtime collectors (goCollector,
// processCollector) share: their families, the snapshot of their values, and
// Describe, Collect and appendText, each of which takes a snapshot (take, set
// by the collector: fills vals and present, with mu held) and sends or writes
// it.
type runtimeSnapshot struct {
	fams []runtimeFamily
	take func()

	mu      sync.Mutex
	vals    []float64
	present []bool
}

// Describe implements prometheus.Collector.
func (s *runtimeSnapshot) Describe(ch chan<- *prometheus.Desc) {
	for i := range s.fams {
		ch <- s.fams[i].desc
	}
}

// Collect implements prometheus.Collector. A value that cannot be read is
// left out, as client_golang's collectors do.
func (s *runtimeSnapshot) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.take()
	collectFamilies(s.fams, s.vals, s.present, ch)
}

func (s *runtimeSnapshot) appendText(b []byte, named []namedText) ([]byte, []namedText) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.take()
	return appendFamilies(b, named, s.fams, s.vals, s.present)
}

// collectFamilies sends the families whose values are present.
func collectFamilies(fams []runtimeFamily, vals []float64, present []bool, ch chan<- prometheus.Metric) {
	for i := range fams {
		f := &fams[i]
		if !present[f.at] {
			continue
		}
		switch f.kind {
		case kindGauge:
			ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, vals[f.at])
		case kindCounter:
			ch <- prometheus.MustNewConstMetric(f.desc, prometheus.CounterValue, vals[f.at])
		case kindSummary:
			ch <- summaryMetric(f.desc, vals[f.at:f.at+f.n()])
		}
	}
}

// appendFamilies appends the text of the families whose values are present.
func appendFamilies(b []byte, named []namedText, fams []runtimeFamily, vals []float64, present []bool) ([]byte, []namedText) {
	for i := range fams {
		f := &fams[i]
		if !present[f.at] {
			continue
		}
		start := len(b)
		for j, seg := range f.segs {
			b = append(b, seg...)
			b = appendValue(b, vals[f.at+j])
			b = append(b, '\n')
		}
		named = append(named, namedText{name: f.name, text: b[start:len(b):len(b)]})
	}
	return b, named
}

// appendValue appends f as the text format writes a value (expfmt's
// writeFloat): 1, 0 (-0 too), -1, NaN, +Inf, -Inf, else strconv's shortest
// 'g' form.
func appendValue(b []byte, f float64) []byte {
	switch {
	case f == 1:
		return append(b, '1')
	case f == 0:
		return append(b, '0')
	case f == -1:
		return append(b, "-1"...)
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, +1):
		return append(b, "+Inf"...)
	case math.IsInf(f, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}
