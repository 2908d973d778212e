package report

import (
	"bytes"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// answer is all a client and the log see of one scrape.
type answer struct {
	code                        int
	contentType, encoding, body string
	logged                      string
}

func answerOf(h http.Handler, logged *bytes.Buffer, encoding string) answer {
	logged.Reset()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	a := answer{code: w.Code, contentType: w.Header().Get("Content-Type"), encoding: w.Header().Get("Content-Encoding"), logged: logged.String()}
	a.body, _ = scrape(&testing.T{}, http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		for k, v := range w.Header() {
			rw.Header()[k] = v
		}
		rw.Write(w.Body.Bytes())
	}), "", "")
	if w.Code != http.StatusOK {
		a.body = w.Body.String()
	}
	return a
}

// untraced is s without the stack traces of a panic's error (each
// gathering's own goroutines and addresses).
func untraced(s string) string {
	for {
		i := strings.Index(s, "stack trace=")
		if i < 0 {
			return s
		}
		j := strings.Index(s[i:], "\n* ")
		if j < 0 {
			return s[:i]
		}
		s = s[:i] + s[i+j:]
	}
}

// compareAnswers scrapes the daemon's handler and promhttp's over the same
// Gatherer, plain and gzip, and wants the same answer from both: status,
// headers, the page (the go_* and process_* values blanked) or the error, and
// what is logged.
func compareAnswers(t *testing.T, step string, m *Metrics) {
	t.Helper()
	var ourLog, theirLog bytes.Buffer
	ours := m.Handler(log.New(&ourLog, "", 0))
	theirs := promhttp.HandlerFor(m.Gatherer(), promhttp.HandlerOpts{ErrorLog: log.New(&theirLog, "", 0)})
	for range 2 { // the second scrape, with what the first one kept
		for _, enc := range []string{"", "gzip"} {
			got, want := answerOf(ours, &ourLog, enc), answerOf(theirs, &theirLog, enc)
			got.body, want.body = untraced(stable(got.body)), untraced(stable(want.body))
			got.logged, want.logged = untraced(got.logged), untraced(want.logged)
			if got != want {
				t.Errorf("%s, Accept-Encoding %q:\nserved   %+v\npromhttp %+v", step, enc, got, want)
				return
			}
		}
	}
}

// A scrape whose gathering fails answers as promhttp does: its status, its
// wording of the error (which names the Gatherer that failed) and its log
// line.
func TestExpositionFailsAsPromhttp(t *testing.T) {
	twice := func() prometheus.Collector {
		d := prometheus.NewDesc("dup", "twice", []string{"l"}, nil)
		return badCollector{d, []prometheus.Metric{
			prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 1, "a"),
			prometheus.MustNewConstMetric(d, prometheus.GaugeValue, 2, "a"),
		}}
	}
	fd := prometheus.NewDesc("fails", "fails", nil, nil)
	for step, c := range map[string]prometheus.Collector{
		"a series twice":               twice(),
		"a metric that does not write": badCollector{fd, []prometheus.Metric{failingMetric{fd}}},
		"a collector that panics":      panicking{prometheus.NewDesc("p", "p", nil, nil)},
	} {
		m := NewMetrics("v1")
		m.Registry.MustRegister(c)
		compareAnswers(t, step, m)
	}
	// After an Unregister the registry is gathered by Gather itself.
	m := NewMetrics("v1")
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gone", Help: "unregistered"})
	m.Registry.MustRegister(g)
	m.Registry.Unregister(g)
	m.Registry.MustRegister(twice())
	compareAnswers(t, "a series twice after an Unregister", m)
}

// A family of the main registry named as a go_*, process_* or versioned
// family, or colliding with one by a summary's suffix: each scrape answers
// as promhttp does (an error where the Gatherers refuse the pair, one
// family where they merge it), never two families of one name on a page.
func TestExpositionSameNameAsPromhttp(t *testing.T) {
	gauge := func(name, help string) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return 7 })
	}
	labelled := func(name, help string) prometheus.Collector {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"x"})
		v.WithLabelValues("a").Set(3)
		return v
	}
	for step, c := range map[string]prometheus.Collector{
		// (A family whose value does not move: Gatherers' error names
		// the series it found twice, with its value.)
		"process_start_time_seconds, the same help":  gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
		"go_goroutines, another help":                gauge("go_goroutines", "other"),
		"process_open_fds with a label":              labelled("process_open_fds", "Number of open file descriptors."),
		"problem_gauge, another help":                gauge("problem_gauge", "other"),
		"the check runs, with a label":               labelled("autopilot_health_check_runs_total", "x"),
		"a suffix of go_gc_duration_seconds' series": gauge("go_gc_duration_seconds_count", "x"),
	} {
		m := NewMetrics("v1")
		m.InitConditions([]string{"KubeletUnhealthy"})
		m.CheckRun("KubeletUnhealthy", ResultOK, time.Millisecond)
		m.Registry.MustRegister(c)
		compareAnswers(t, step, m)
	}
}
