package checks

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
)

// pageOfSize is exposition text of exactly n bytes whose last line is the
// sample line; comment lines fill the rest.
func pageOfSize(t *testing.T, n int, sample string) string {
	t.Helper()
	var b strings.Builder
	for b.Len()+len(sample) < n {
		fill := min(n-len(sample)-b.Len(), 200)
		if fill < 2 {
			t.Fatalf("cannot fill %d bytes", fill)
		}
		b.WriteString("#" + strings.Repeat("x", fill-2) + "\n")
	}
	b.WriteString(sample)
	if b.Len() != n {
		t.Fatalf("page of %d bytes, want %d", b.Len(), n)
	}
	return b.String()
}

// A page longer than maxMetricsPage is a page error, not a page cut short
// (where the metric, past the cut, would look absent: a false True). A page
// of exactly maxMetricsPage bytes is read whole, the metric at its end
// included.
func TestScrapeOversizePage(t *testing.T) {
	var page string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(page)) }))
	defer srv.Close()
	url := srv.URL + "/metrics"

	page = pageOfSize(t, maxMetricsPage, "ready 1\n")
	vals, found, err := scrapeGauge(context.Background(), srv.Client(), url, "ready")
	if err != nil || !found || len(vals) != 1 || vals[0] != 1 {
		t.Errorf("page of %d bytes: %v %v %v; want [1] found", len(page), vals, found, err)
	}

	// The first maxMetricsPage bytes end at a line and hold no ready: cut
	// there, the page would parse with the metric absent. One byte over is
	// too long as well.
	for _, p := range []string{pageOfSize(t, maxMetricsPage+1, "ready 1\n"), pageOfSize(t, maxMetricsPage, "# cut here\n") + "ready 1\n"} {
		page = p
		vals, found, err = scrapeGauge(context.Background(), srv.Client(), url, "ready")
		if !isPageError(err) || !strings.Contains(err.Error(), "longer than 4194304 bytes") || found || vals != nil {
			t.Errorf("page of %d bytes: %v %v %v; want a page error", len(page), vals, found, err)
		}
	}

	// Both checks that scrape report the page cut at a line as an error
	// (Unknown), not True ("no ready gauge").
	env := testEnv(t, func(c *config.Config) {
		c.Checks.ProxyNotServing.MetricsURL = url
		c.Checks.TunnelDisconnected.MetricsURL = url
		c.Checks.TunnelDisconnected.ConnectionsMetric = "ready"
	})
	proxy, _ := newProxyCheck(env)
	tunnel, _ := newTunnelCheck(env)
	for name, c := range map[string]Check{"ProxyNotServing": proxy, "TunnelDisconnected": tunnel} {
		if r, err := c.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "longer than") || r.Status != report.Status("") {
			t.Errorf("%s on an oversize page: %+v %v; want an error", name, r, err)
		}
	}
}

// otherSeriesPage is a page of about maxMetricsPage bytes: the ready gauge,
// then distinct series of another program's metrics.
func otherSeriesPage() []byte {
	var sb strings.Builder
	sb.WriteString("# TYPE ready gauge\nready 1\n")
	for i := 0; sb.Len() < maxMetricsPage-100; i++ {
		fmt.Fprintf(&sb, "other_series_total{id=\"%d\",path=\"/var/lib/kubelet/pods/%d\"} %d\n", i, i, i)
	}
	return []byte(sb.String())
}

// The series of other metrics on a page are checked line by line and
// dropped, not parsed: a scrape of a 4 MiB page of them made expfmt's
// parser allocate 1.47 million times (37 MB), every 30 s
// (BenchmarkParseMetricLargePage). A line among them that is not
// exposition text is still a page error, naming its line.
func TestLargePageOfOtherSeriesIsNotParsed(t *testing.T) {
	page := otherSeriesPage()
	if n := testing.AllocsPerRun(2, func() {
		if vals, found, err := parsePage(page, "ready"); err != nil || !found || len(vals) != 1 {
			t.Fatal(vals, found, err)
		}
	}); n > 100 {
		t.Errorf("%.0f allocations for a page of %d bytes, want at most 100", n, len(page))
	}
	bad := append(bytes.Clone(page), "<html>502 Bad Gateway</html>\n"...)
	lines := bytes.Count(bad, []byte("\n"))
	if _, _, err := parsePage(bad, "ready"); !isPageError(err) || !strings.Contains(err.Error(), fmt.Sprintf("line %d:", lines)) {
		t.Errorf("a garbage last line: %v, want a page error naming line %d", err, lines)
	}
}

// A page of maxMetricsPage bytes of distinct series (another program's
// metrics beside the one a check reads): what a scrape allocates, parsed
// whole by expfmt (as before) and by parsePage, which keeps only the
// metric's family for expfmt.
func BenchmarkParseMetricLargePage(b *testing.B) {
	page := otherSeriesPage() // as scrapeGauge has read it
	b.Run("expfmt-whole", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			p := expfmt.NewTextParser(model.UTF8Validation)
			if _, err := p.TextToMetricFamilies(bytes.NewReader(page)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parsePage", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if vals, found, err := parsePage(page, "ready"); err != nil || !found || len(vals) != 1 {
				b.Fatal(vals, found, err)
			}
		}
	})
}

// expfmt's parser takes a metric's name anywhere in its braces, plain or
// quoted, and a quoted name before them: a page with such lines is one it
// takes whole, and parseMetric must find what it finds (never refuse it,
// never drop a line of the metric). FuzzParseMetric found "{A}00" refused.
func TestNamesAnywhereInTheBracesAreRead(t *testing.T) {
	for _, tc := range []struct {
		page  string
		found bool
		vals  int
	}{
		{"{A}00\n", false, 0},
		{"{other} 1\n# TYPE ready gauge\nready 0\n", true, 1},
		{"{ready} 1\n", true, 1},
		{"{ready,a=\"b\"} 1\n", true, 1},
		{"{a=\"b\", ready} 1\n", true, 1},
		{"{a=\"b\",\"ready\"} 1\n", true, 1},
		{"\"ready\" 1\n", true, 1},
		{"\"ready\"{a=\"b\"} 1\nready{a=\"c\"} 0\n", true, 2},
		{"# TYPE \"ready\" gauge\n{\"ready\"} 1\n", true, 1},
	} {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(tc.page))
		if err != nil || (fams["ready"] != nil) != tc.found || len(fams["ready"].GetMetric()) != tc.vals {
			t.Fatalf("%q: expfmt's parser: %v, %v; the test expects it to take the page", tc.page, fams, err)
		}
		vals, found, err := parseMetric(strings.NewReader(tc.page), "ready")
		if err != nil || found != tc.found || len(vals) != tc.vals {
			t.Errorf("%q: %v %v %v, want found %v with %d values", tc.page, vals, found, err, tc.found, tc.vals)
		}
	}
}

// resettingPeer reads each request on l and resets the connection (RST,
// SO_LINGER 0): before answering ("before"), or after the header and part
// of a body ("mid-body").
func resettingPeer(t *testing.T, l net.Listener, when string) {
	t.Helper()
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil && when == "mid-body" {
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n# HELP ready")
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
}

// An endpoint that resets every connection fails each run with the same
// message: the connection's local port, new at every run, is left out of
// it ("read tcp 127.0.0.1:9587: read: connection reset by peer"). Before,
// the message named it ("read tcp 127.0.0.1:41234->127.0.0.1:9587: ..."),
// and a condition whose message changes at every run is a write of the
// Node's status (and a look at systemd's state) at every run, every 30 s.
func TestScrapeFailureMessageStaysTheSame(t *testing.T) {
	for _, when := range []string{"before", "mid-body"} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		resettingPeer(t, l, when)
		url := "http://" + l.Addr().String() + "/metrics"
		env := testEnv(t, func(c *config.Config) {
			c.Checks.ProxyNotServing.MetricsURL = url
			c.Checks.TunnelDisconnected.MetricsURL = url
		})
		proxy, _ := newProxyCheck(env)
		tunnel, _ := newTunnelCheck(env)
		for name, c := range map[string]Check{"ProxyNotServing": proxy, "TunnelDisconnected": tunnel} {
			var msgs []string
			for range 3 {
				r, err := c.Probe(context.Background())
				if err != nil || r.Status != report.StatusTrue || !strings.Contains(r.Message, "connection reset by peer") {
					t.Fatalf("%s, reset %s: %+v %v", name, when, r, err)
				}
				msgs = append(msgs, r.Message)
			}
			if msgs[0] != msgs[1] || msgs[1] != msgs[2] || strings.Contains(msgs[0], "->") {
				t.Errorf("%s, reset %s: the messages name the local port or change:\n%s", name, when, strings.Join(msgs, "\n"))
			}
			c.(Closer).Close()
		}
	}
}

// A page that gives one series twice (the same name and labels) is not
// valid exposition text (Prometheus refuses such a scrape, "duplicate
// sample"): it says two things of one value, so it is a page error,
// Unknown, not one of its two answers. Before, expfmt's parser took both
// samples: "ready 1\nready 0" was ProxyNotReady (True), and the tunnel
// agent's one series given twice was counted twice. Series that differ in
// a label are distinct and all read, in any order of their labels.
func TestScrapeSeriesTwiceIsAPageError(t *testing.T) {
	for _, page := range []string{
		"ready 1\nready 0\n",
		"# TYPE ready gauge\nready 1\nready 1\n",
		"ready{a=\"x\",b=\"y\"} 1\nready{b=\"y\",a=\"x\"} 0\n",
		"ready{a=\"x\"} 1 1700000000\nready{a=\"x\"} 0 1700000001\n",
		// A label whose value is empty is no label (Prometheus' data
		// model; its scrape drops it): ready{a=""} is the series ready.
		"ready{a=\"\"} 1\nready 0\n",
		"ready{a=\"x\",b=\"\"} 1\nready{a=\"x\"} 0\n",
	} {
		vals, found, err := parseMetric(strings.NewReader(page), "ready")
		if err == nil || !isPageError(err) || !strings.Contains(err.Error(), "twice") {
			t.Errorf("page %q: %v %v %v; want a page error naming the series given twice", page, vals, found, err)
		}
	}
	vals, _, err := parseMetric(strings.NewReader("ready{a=\"x\"} 1\nready{a=\"y\"} 0\nready 2\n"), "ready")
	if err != nil || len(vals) != 3 {
		t.Errorf("three distinct series: %v %v; want their three values", vals, err)
	}
}

// What is not one series given twice stays read as before: the buckets of
// a histogram whose name starts with the metric's (the same name, another
// le), a page that ends in OpenMetrics' "# EOF" (a comment to the text
// parser), a summary's quantiles beside the gauge; a second # TYPE line is
// the parser's own page error, not a series given twice.
func TestScrapeSeriesNotGivenTwice(t *testing.T) {
	for _, page := range []string{
		"# TYPE ready_seconds histogram\nready_seconds_bucket{le=\"1\"} 1\nready_seconds_bucket{le=\"+Inf\"} 2\nready_seconds_sum 3\nready_seconds_count 2\nready 1\n",
		"# TYPE ready gauge\nready 1\n# EOF\n",
		"# TYPE ready_lag summary\nready_lag{quantile=\"0.5\"} 1\nready_lag{quantile=\"0.9\"} 2\nready_lag_sum 3\nready_lag_count 2\n# TYPE ready gauge\nready 1\n",
	} {
		if vals, found, err := parseMetric(strings.NewReader(page), "ready"); err != nil || !found || len(vals) != 1 || vals[0] != 1 {
			t.Errorf("page %q: %v %v %v; want [1]", page, vals, found, err)
		}
	}
	page := "# TYPE ready gauge\nready 1\n# TYPE ready gauge\nready{a=\"x\"} 1\n"
	if _, _, err := parseMetric(strings.NewReader(page), "ready"); !isPageError(err) || strings.Contains(err.Error(), "twice") {
		t.Errorf("page %q: %v; want expfmt's page error for the second TYPE line", page, err)
	}
}
