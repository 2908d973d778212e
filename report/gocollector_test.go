package report

import (
	"bytes"
	"math"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// values is every value of a family's one series, in the order the text
// format writes them (a summary's quantiles, sum and count).
func values(mf *dto.MetricFamily) []float64 {
	m := mf.GetMetric()[0]
	switch {
	case m.Counter != nil:
		return []float64{m.GetCounter().GetValue()}
	case m.Gauge != nil:
		return []float64{m.GetGauge().GetValue()}
	case m.Summary != nil:
		var v []float64
		for _, q := range m.GetSummary().GetQuantile() {
			v = append(v, q.GetValue())
		}
		return append(v, m.GetSummary().GetSampleSum(), float64(m.GetSummary().GetSampleCount()))
	}
	return nil
}

// shape is what a family shows but its values: name, help, type, unit,
// label names and values, and a summary's quantiles.
func shape(mf *dto.MetricFamily) string {
	var b strings.Builder
	b.WriteString(mf.GetName() + "|" + mf.GetHelp() + "|" + mf.GetType().String() + "|" + mf.GetUnit())
	for _, m := range mf.GetMetric() {
		b.WriteString("|")
		for _, l := range m.GetLabel() {
			b.WriteString(l.GetName() + "=" + l.GetValue() + ",")
		}
		for _, q := range m.GetSummary().GetQuantile() {
			b.WriteString("q" + expfmtValue(q.GetQuantile()) + ",")
		}
	}
	return b.String()
}

func expfmtValue(f float64) string { return string(appendValue(nil, f)) }

// The daemon's Go collector serves what client_golang's default one
// (collectors.NewGoCollector()) does: the same families with the same
// help, type, unit and labels, and values from the same sources. With the
// garbage collector off between the reads, ours (read between two of
// client_golang's) lies within what moved between those two, plus what the
// reads themselves allocate.
func TestGoCollectorMatchesClientGolang(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	theirsC := collectors.NewGoCollector()
	oursC := newGoCollector()
	gatherOne(t, oursC) // the first reads allocate what later ones reuse
	gatherOne(t, theirsC)
	before := gatherOne(t, theirsC)
	ours := gatherOne(t, oursC)
	after := gatherOne(t, theirsC)
	if len(ours) != len(before) || len(ours) < 29 { // 5 base, 3 runtime/metrics, 21 go_memstats_*
		t.Fatalf("%d families, client_golang %d", len(ours), len(before))
	}
	for name, want := range before {
		got, ok := ours[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if shape(got) != shape(want) {
			t.Errorf("served  %s\nclient_golang %s", shape(got), shape(want))
			continue
		}
		// What may move between two reads, beyond what moved between
		// client_golang's two.
		slack := 0.0
		switch {
		case name == "go_goroutines":
			slack = 2
		case name == "go_threads":
			slack = 1
		case strings.HasSuffix(name, "_bytes") || strings.HasSuffix(name, "_bytes_total"):
			slack = 1 << 20
		case name == "go_memstats_heap_objects" || name == "go_memstats_mallocs_total" || name == "go_memstats_frees_total":
			slack = 1 << 12
		}
		g, w1, w2 := values(got), values(want), values(after[name])
		for i := range g {
			lo, hi := min(w1[i], w2[i]), max(w1[i], w2[i])
			if span := hi - lo; g[i] < lo-span-slack || g[i] > hi+span+slack {
				t.Errorf("%s value %d = %v, client_golang %v and %v", name, i, g[i], w1[i], w2[i])
			}
		}
	}
}

// What a text scrape writes of the go_* and process_* families is, byte for
// byte, what the text encoder makes of what Collect sends, for the same
// read.
func TestRuntimeTextMatchesEncoder(t *testing.T) {
	g := newGoCollector()
	g.mu.Lock()
	g.read()
	compareText(t, g.fams, g.vals, g.present)
	g.mu.Unlock()
	p := newProcessCollector()
	p.mu.Lock()
	p.readValues()
	compareText(t, p.fams, p.vals, p.present)
	// A value that could not be read leaves its family out of both.
	p.present[procOpenFDs] = false
	compareText(t, p.fams, p.vals, p.present)
	p.mu.Unlock()
}

func compareText(t *testing.T, fams []runtimeFamily, vals []float64, present []bool) {
	t.Helper()
	ch := make(chan prometheus.Metric, len(vals))
	collectFamilies(fams, vals, present, ch)
	close(ch)
	var want bytes.Buffer
	var names []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		var name string
		for _, f := range fams {
			if f.desc == m.Desc() {
				name = f.name
			}
		}
		help, typ := helpAndType(t, fams, name)
		names = append(names, name)
		if _, err := expfmt.MetricFamilyToText(&want, &dto.MetricFamily{Name: &name, Help: &help, Type: &typ, Metric: []*dto.Metric{&pb}}); err != nil {
			t.Fatal(err)
		}
	}
	b, named := appendFamilies(nil, nil, fams, vals, present)
	if string(b) != want.String() {
		t.Fatalf("written:\n%s\nthe encoder writes:\n%s", b, want.String())
	}
	var got []string
	for _, n := range named {
		got = append(got, n.name)
		if !bytes.HasPrefix(n.text, []byte("# HELP "+n.name+" ")) {
			t.Errorf("%s: text %q", n.name, n.text)
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("named %v, sent %v", got, names)
	}
}

func helpAndType(t *testing.T, fams []runtimeFamily, name string) (string, dto.MetricType) {
	t.Helper()
	for _, f := range fams {
		if f.name == name {
			typ := map[valueKind]dto.MetricType{kindGauge: dto.MetricType_GAUGE, kindCounter: dto.MetricType_COUNTER, kindSummary: dto.MetricType_SUMMARY}[f.kind]
			return f.help, typ
		}
	}
	t.Fatalf("no family %s", name)
	return "", 0
}

// A value is written as the text encoder writes it.
func TestAppendValueMatchesEncoder(t *testing.T) {
	desc := prometheus.NewDesc("v", "h", nil, nil)
	for _, f := range []float64{0, math.Copysign(0, -1), 1, -1, 2, 0.25, 1e-9, 1.5e-7, 123456789, 1e21, 1e20, 12345678901234567890,
		math.MaxUint64, math.MaxFloat64, math.SmallestNonzeroFloat64, 1.7e9 + 0.123, -3.5, math.NaN(), math.Inf(1), math.Inf(-1)} {
		var pb dto.Metric
		if err := prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, f).Write(&pb); err != nil {
			t.Fatal(err)
		}
		name, help, typ := "v", "h", dto.MetricType_GAUGE
		var b bytes.Buffer
		if _, err := expfmt.MetricFamilyToText(&b, &dto.MetricFamily{Name: &name, Help: &help, Type: &typ, Metric: []*dto.Metric{&pb}}); err != nil {
			t.Fatal(err)
		}
		want := strings.TrimSuffix(b.String()[strings.LastIndexByte(strings.TrimSuffix(b.String(), "\n"), ' ')+1:], "\n")
		if got := expfmtValue(f); got != want {
			t.Errorf("%v: %q, the encoder writes %q", f, got, want)
		}
	}
}
