package daemon

import (
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/kmsg"
)

// What a scraper gets from the real daemon, however it asks: plain, gzip,
// Prometheus' own Accept header (OpenMetrics first) or OpenMetrics alone
// (answered in the text format, which the Content-Type says: OpenMetrics is
// not offered), each page parsed by client_golang's text parser; a label
// value from the configuration (a kernel log rule's name, with `"`, `\`, a
// newline, NUL and ESC) escaped as the format says; problem_counter and
// problem_gauge as the spec names them, with HELP and TYPE.
func TestScrapeFormatsParse(t *testing.T) {
	cfg := testConfig(t)
	cfg.Kmsg.Enabled = true
	odd := "a\"b\\c\nd\x00e\x1b[2J"
	cfg.Kmsg.Rules = []config.KmsgRule{{Name: odd, Kind: "temp", Reason: "IOError", Pattern: "zzzq"}}
	_, url := metricsDaemon(t, cfg)
	prometheusAccept := "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
	for _, tc := range []struct{ accept, enc string }{
		{"", "identity"}, {"", "gzip"}, {prometheusAccept, "gzip"}, {prometheusAccept, "identity"},
		{"application/openmetrics-text", "identity"},
	} {
		req, _ := http.NewRequest("GET", url, nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		req.Header.Set("Accept-Encoding", tc.enc)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		var r io.Reader = resp.Body
		if ce := resp.Header.Get("Content-Encoding"); ce != map[string]string{"gzip": "gzip", "identity": ""}[tc.enc] {
			t.Errorf("Accept-Encoding %s: Content-Encoding %q", tc.enc, ce)
		} else if ce == "gzip" {
			if r, err = gzip.NewReader(resp.Body); err != nil {
				t.Fatal(err)
			}
		}
		page, err := io.ReadAll(r)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%q %s: %s, %v", tc.accept, tc.enc, resp.Status, err)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4; charset=utf-8") {
			t.Errorf("%q: Content-Type %q", tc.accept, ct)
		}
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(string(page)))
		if err != nil {
			t.Fatalf("%q %s: the page does not parse: %v", tc.accept, tc.enc, err)
		}
		for name, typ := range map[string]dto.MetricType{"problem_counter": dto.MetricType_COUNTER, "problem_gauge": dto.MetricType_GAUGE} {
			if f := fams[name]; f == nil || f.GetType() != typ || f.GetHelp() == "" || len(f.Metric) == 0 {
				t.Errorf("%s: %v, want a %v with help and series", name, f, typ)
			}
		}
		found := false
		for _, m := range fams["autopilot_health_kmsg_matches_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == "rule" && l.GetValue() == odd
			}
		}
		if !found {
			t.Errorf("%q %s: no series of rule %q", tc.accept, tc.enc, odd)
		}
	}
}

// metricsDaemon runs a daemon of cfg on a quiet kernel log with its metrics
// listener on a free port of 127.0.0.1, and returns it and its page's URL.
func metricsDaemon(t *testing.T, cfg *config.Config) (*Daemon, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, quietLog(), Options{Version: "test", Listener: ln, KmsgOpen: func(context.Context, string) (kmsg.Device, error) { return &quietKmsg{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	return d, "http://" + ln.Addr().String() + "/metrics"
}
