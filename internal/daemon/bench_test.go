package daemon

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// scrapeDaemon is a daemon (not running) whose metrics hold what a node's
// have after a while: every condition of the catalog, every check started
// (its runs' series of every result) and run once, every loop's progress.
func scrapeDaemon(b testing.TB) *Daemon {
	cfg := testConfig(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "bench", Listener: ln})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	var types []string
	for _, c := range report.Conditions {
		types = append(types, c.Type)
	}
	d.metrics.InitConditions(types)
	now := time.Now()
	for _, c := range report.Conditions {
		// The runner makes every result's series at a check's start.
		d.metrics.InitCheck(c.Type)
		d.metrics.CheckRun(c.Type, report.ResultOK, 3*time.Millisecond)
		d.metrics.LoopProgress("check/"+c.Type, now)
	}
	return d
}

// BenchmarkScrape is one GET /metrics as Prometheus makes it (gzip; its
// Accept header, text by default, protobuf with native histograms on) and as
// curl makes it (plain text), with nothing changed since the last scrape
// but the go_* and process_* families, and ("after runs") after the two
// 10 s checks ran, as between two scrapes 15 s apart on an idle node.
// README, Cost: CPU per scrape.
func BenchmarkScrape(b *testing.B) {
	d := scrapeDaemon(b)
	h := d.Handler()
	const (
		text     = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
		protobuf = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6," + text
	)
	for _, runs := range []bool{false, true} {
		for _, enc := range []string{"gzip", "identity", "protobuf"} {
			name := enc
			if runs {
				name += ",after_runs"
			}
			b.Run(name, func(b *testing.B) {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.Header.Set("Accept-Encoding", enc)
				req.Header.Set("Accept", text)
				if enc == "protobuf" {
					req.Header.Set("Accept-Encoding", "gzip")
					req.Header.Set("Accept", protobuf)
				}
				size, i := 0, 0
				for b.Loop() {
					if runs {
						i++
						for _, c := range []string{"KubeletUnhealthy", "ContainerRuntimeUnhealthy"} {
							d.metrics.CheckRun(c, report.ResultOK, time.Duration(i%50)*time.Millisecond)
							d.metrics.LoopProgress("check/"+c, time.Now())
						}
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("HTTP %d", w.Code)
					}
					size = w.Body.Len()
				}
				b.ReportMetric(float64(size), "bytes/resp")
				if enc == "identity" {
					// The series on the page (README, Cost: the
					// scrape's series count).
					b.ReportMetric(float64(textSeries(b, h)), "series/resp")
				}
			})
		}
	}
}

// textSeries counts the series of one plain-text scrape of h: its lines
// that are not comments.
func textSeries(b testing.TB, h http.Handler) int {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept-Encoding", "identity")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		b.Fatalf("HTTP %d", w.Code)
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(w.Body.Bytes()))
	for sc.Scan() {
		if line := sc.Text(); line != "" && line[0] != '#' {
			n++
		}
	}
	return n
}
