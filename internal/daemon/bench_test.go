package daemon

import (
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// scrapeDaemon is a daemon (not running) whose metrics hold what a node's
// have after a while: every condition of the catalog, a run of every check,
// every loop's progress.
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
		d.metrics.CheckRun(c.Type, report.ResultOK, 3*time.Millisecond)
		d.metrics.LoopProgress("check/"+c.Type, now)
	}
	return d
}

// BenchmarkScrape is one GET /metrics as Prometheus makes it (gzip) and as
// curl makes it (plain text), with nothing changed since the last scrape
// but the go_* and process_* families, and ("after runs") after the two
// 10 s checks ran, as between two scrapes 15 s apart on an idle node.
// README, Cost: CPU per scrape.
func BenchmarkScrape(b *testing.B) {
	d := scrapeDaemon(b)
	h := d.Handler()
	for _, runs := range []bool{false, true} {
		for _, enc := range []string{"gzip", "identity"} {
			name := enc
			if runs {
				name += ",after_runs"
			}
			b.Run(name, func(b *testing.B) {
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.Header.Set("Accept-Encoding", enc)
				req.Header.Set("Accept", "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")
				size, i := 0, 0
				for b.Loop() {
					if runs {
						i++
						d.metrics.CheckRun("KubeletUnhealthy", report.ResultOK, time.Duration(i%50)*time.Millisecond)
						d.metrics.CheckRun("ContainerRuntimeUnhealthy", report.ResultOK, time.Duration(i%70)*time.Millisecond)
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("HTTP %d", w.Code)
					}
					size = w.Body.Len()
				}
				b.ReportMetric(float64(size), "bytes/resp")
			})
		}
	}
}
