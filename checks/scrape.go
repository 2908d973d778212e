package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/syself/autopilot-health/internal/rawsys"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxMetricsPage bounds what a check reads from a metrics endpoint. A
// longer page is a page error, not a page cut short: the metric could be in
// the part not read, and "absent" would be a false True.
const maxMetricsPage = 4 << 20

// pageError: the endpoint answered, but its page is not exposition text
// with the metric as a gauge. Any other error of scrapeGauge is the endpoint
// not answering (a failed connection, a timeout, a status other than 200).
type pageError struct{ err error }

func (e *pageError) Error() string { return "metrics page: " + e.err.Error() }
func (e *pageError) Unwrap() error { return e.err }

// isPageError reports whether err says that the endpoint answered with a
// page that is not valid (not that it did not answer).
func isPageError(err error) bool {
	var pe *pageError
	return errors.As(err, &pe)
}

// keptClient is the HTTP client of a check that GETs a local page every run
// (KubeletUnhealthy's /healthz, ProxyNotServing's and TunnelDisconnected's
// metrics): one connection kept between runs (a run every 10 or 30 s uses
// it long before keptConnIdle; a new one each time cost a connect and the
// transport's goroutines), read and written raw (rawsys: a run does not
// wake the runtime's monitor thread). The page is asked for uncompressed:
// on the node's loopback, gzip costs both ends CPU and saves nothing. An
// endpoint that restarted between two runs is not taken for one that is
// down: net/http makes the GET again on a new connection. A DialContext of
// its own turns net/http's HTTP/2 over TLS off unless asked for (an https
// URL): ForceAttemptHTTP2.
func keptClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: probeTimeout(timeout), Transport: &http.Transport{
		DialContext: rawsys.Dial, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 1, IdleConnTimeout: keptConnIdle, DisableCompression: true}}
}

// scrapeGauge fetches a Prometheus text page and returns the values of the
// metric name (gauge, counter or untyped; one per series). found is false
// when the page has no such metric. A page that is not valid exposition
// text is an error (a *pageError, see isPageError), never a panic; the
// checks that scrape (ProxyNotServing, TunnelDisconnected) share it.
func scrapeGauge(ctx context.Context, client *http.Client, url, name string) (values []float64, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsPage+1))
	if err != nil {
		return nil, false, fmt.Errorf("GET %s: reading the page: %w", url, err)
	}
	if len(page) > maxMetricsPage {
		return nil, false, &pageError{fmt.Errorf("longer than %d bytes, the most a check reads", maxMetricsPage)}
	}
	return parseMetric(bytes.NewReader(page), name)
}

// parseMetric reads Prometheus text exposition and returns the values of one metric.
func parseMetric(r io.Reader, name string) ([]float64, bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, false, &pageError{err}
	}
	f, ok := fams[name]
	if !ok {
		return nil, false, nil
	}
	var out []float64
	for _, m := range f.GetMetric() {
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			out = append(out, m.GetGauge().GetValue())
		case dto.MetricType_COUNTER:
			out = append(out, m.GetCounter().GetValue())
		case dto.MetricType_UNTYPED:
			out = append(out, m.GetUntyped().GetValue())
		default:
			return nil, true, &pageError{fmt.Errorf("metric %s is a %s, not a gauge", name, f.GetType())}
		}
	}
	return out, true, nil
}
