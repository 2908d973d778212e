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
func scrapeDaemon(b *testing.B) *Daemon {
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
// curl makes it (plain text). README, Cost: CPU per scrape.
func BenchmarkScrape(b *testing.B) {
	d := scrapeDaemon(b)
	h := d.Handler()
	for _, enc := range []string{"gzip", "identity"} {
		b.Run(enc, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			req.Header.Set("Accept-Encoding", enc)
			req.Header.Set("Accept", "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("HTTP %d", w.Code)
				}
			}
		})
	}
}
