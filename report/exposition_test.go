package report

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func scrape(t *testing.T, h http.Handler, accept, encoding string) (string, http.Header) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", w.Code, w.Body)
	}
	body := w.Body.Bytes()
	if w.Header().Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return string(body), w.Header()
}

// stable blanks the values of the go_ and process_ families, which change
// between any two reads; their names, help, types and labels stay, so a
// family left out or misnamed still shows.
func stable(text string) string {
	var b strings.Builder
	for line := range strings.SplitAfterSeq(text, "\n") {
		if (strings.HasPrefix(line, "go_") || strings.HasPrefix(line, "process_")) && strings.LastIndexByte(line, ' ') > 0 {
			line = line[:strings.LastIndexByte(line, ' ')] + " _\n"
		}
		b.WriteString(line)
	}
	return b.String()
}

// The cached exposition serves what promhttp serves, byte for byte, plain
// and gzipped, before and after metrics change, appear and disappear: a
// family that changed is encoded again, one that did not is reused.
func TestExpositionMatchesPromhttp(t *testing.T) {
	m := NewMetrics("v1")
	m.InitConditions([]string{"KubeletUnhealthy", "DiskUsageHigh"})
	m.InitEvents([]string{"OOMKilling"})
	extra := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extra", Help: "a family that comes and goes"}, []string{"k"})
	m.Registry.MustRegister(extra)
	ours := m.Handler(nil)
	theirs := promhttp.HandlerFor(m.Gatherer(), promhttp.HandlerOpts{})
	check := func(step string) {
		t.Helper()
		want, _ := scrape(t, theirs, "", "")
		for _, enc := range []string{"", "gzip", "gzip;q=1.0, identity;q=0.5"} {
			got, hdr := scrape(t, ours, "", enc)
			if stable(got) != stable(want) {
				t.Fatalf("%s, Accept-Encoding %q: served\n%s\npromhttp serves\n%s", step, enc, stable(got), stable(want))
			}
			if wantGzip := enc != ""; (hdr.Get("Content-Encoding") == "gzip") != wantGzip {
				t.Errorf("%s, Accept-Encoding %q: Content-Encoding %q", step, enc, hdr.Get("Content-Encoding"))
			}
			if !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain; version=0.0.4") {
				t.Errorf("Content-Type %q", hdr.Get("Content-Type"))
			}
		}
		if !strings.Contains(want, "problem_gauge") || !strings.Contains(want, "process_start_time_seconds") {
			t.Fatalf("%s: the registry lacks families:\n%s", step, want)
		}
	}
	check("start")
	check("nothing changed")
	m.ConditionChanged(nil, Condition{Type: "KubeletUnhealthy", Status: StatusTrue, Reason: "KubeletHealthzFailed"})
	m.CheckRun("KubeletUnhealthy", ResultProblem, 20*time.Millisecond)
	check("a condition turned True and a check ran")
	m.CheckRun("KubeletUnhealthy", ResultProblem, 20*time.Millisecond)
	check("the same check ran again")
	// Each check's and loop's series are a family of their own, merged
	// into one metric family in the order of their labels.
	for _, c := range []string{"NodeTampered", "ClockNotSynchronized", "ZZZ", "AAA"} {
		m.CheckRun(c, ResultOK, time.Millisecond)
		m.CheckRun(c, ResultTimeout, 30*time.Second)
		m.LoopProgress("check/"+c, time.Unix(1700000000, 0))
		check("the first run of " + c)
	}
	m.CheckRun("AAA", ResultError, 2*time.Second)
	check("a check ran again")
	m.LoopProgress("check/KubeletUnhealthy", time.Unix(1700000000, 0))
	check("a loop made progress")
	m.EventEmitted(Event{Reason: "OOMKilling"})
	check("an event")
	m.ConditionChanged(&Condition{Type: "KubeletUnhealthy", Status: StatusTrue, Reason: "KubeletHealthzFailed"}, Condition{Type: "KubeletUnhealthy", Status: StatusFalse, Reason: "KubeletHealthy"})
	check("the condition turned False")
	m.ConditionRestored(Condition{Type: "DiskUsageHigh", Status: StatusTrue, Reason: "DiskSpaceLow"})
	check("a condition restored True")
	m.ConditionRemoved(Condition{Type: "DiskUsageHigh"})
	check("a condition removed")
	m.InitConditions([]string{"DiskUsageHigh"})
	m.InitEvents([]string{"KernelOops"})
	check("a condition and an event reason created again")
	// Changes while scraping: once they stop, the next scrape serves
	// the last of them.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			m.CheckRun("DiskUsageHigh", ResultOK, time.Duration(i)*time.Millisecond)
			m.LoopProgress("check/DiskUsageHigh", time.Unix(int64(1700000000+i), 0))
		}
	}()
	for range 20 {
		scrape(t, ours, "", "")
		scrape(t, ours, "", "gzip")
	}
	<-done
	check("after changes made while scraping")
	extra.WithLabelValues("a").Set(1)
	check("a family appeared")
	// A family kept by the hash of what it shows: a new value is a new
	// text.
	extra.WithLabelValues("a").Set(2)
	check("a value of a family kept by its hash changed")
	extra.DeleteLabelValues("a")
	check("the family is gone")
	if got, _ := scrape(t, ours, "", ""); strings.Contains(got, "extra") {
		t.Errorf("a gone family is still served:\n%s", got)
	}
}

// Prometheus asking for protobuf or OpenMetrics gets what promhttp serves.
func TestExpositionOtherFormatsArePromhttps(t *testing.T) {
	m := NewMetrics("v1")
	const proto = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"
	_, hdr := scrape(t, m.Handler(nil), proto, "")
	if !strings.HasPrefix(hdr.Get("Content-Type"), "application/vnd.google.protobuf") {
		t.Errorf("Content-Type %q for %s", hdr.Get("Content-Type"), proto)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for h, want := range map[string]bool{
		"": false, "gzip": true, "GZIP": true, "deflate, gzip;q=0.5": true, "gzip;q=0": false, "gzip; q=0": false,
		"identity": false, "x-gzip": false, "zstd,gzip": true,
		"gzip;Q=0": false, "gzip ; q=0.000": false, "gzip;q=0.001": true, "gzip;level=1;q=0": false,
		// RFC 9110 §12.4.2 and §12.5.3: the weight's name in any case, its
		// 0 in any of its spellings, and "*" for every coding not listed.
		"GZIP;q=0": false, "gzip; q=0.000": false, "gzip;q=0.0": false, "gzip;q=0.00": false, "gzip;q=0.": false,
		"gzip;q=1": true, "gzip;q=1.000": true,
		"*": true, "*;q=0.5": true, "*;q=0": false, "*;Q=0.0": false, "identity, *;q=0": false,
		"*, gzip;q=0": false, "gzip;q=0, *": false, "*;q=0, gzip": true, "identity;q=0, *": true,
		// A gzip entry decides, wherever "*" is and whatever its weight;
		// a gzip entry whose weight is empty (malformed) is listed, not
		// refused; no entry at all is no gzip.
		"*;q=0, gzip;q=0.5": true, "gzip;q=0.5, *;q=0": true, "gzip;q=": true, "gzip;q=, *;q=0": true,
		" ": false, ",": false, ";q=1": false,
	} {
		if got := acceptsGzip(http.Header{"Accept-Encoding": {h}}); got != want {
			t.Errorf("acceptsGzip(%q) = %v", h, got)
		}
	}
	// RFC 9110 §5.3: the field on several lines is their values joined by
	// commas. Before, only the first line was read: gzip on the second
	// was not served, and its refusal there not heeded behind a "*".
	for _, tc := range []struct {
		lines []string
		want  bool
	}{
		{[]string{"identity", "gzip"}, true},
		{[]string{"", "gzip"}, true},
		{[]string{"deflate", "gzip;q=0"}, false},
		{[]string{"*", "gzip;q=0"}, false},
		{[]string{"*;q=0", "gzip"}, true},
		{[]string{"identity", "*"}, true},
		{[]string{"gzip", "*;q=0"}, true},
		{[]string{"identity", "deflate"}, false},
		{nil, false},
	} {
		h := http.Header{}
		for _, l := range tc.lines {
			h.Add("Accept-Encoding", l)
		}
		if got := acceptsGzip(h); got != tc.want {
			t.Errorf("acceptsGzip of the lines %q = %v", tc.lines, got)
		}
	}
}
