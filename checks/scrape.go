package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	return parsePage(page, name)
}

// parseMetric reads Prometheus text exposition and returns the values of one metric.
//
// The page is read line by line first (family): every line must look like
// exposition text (a comment, or a sample: a metric name, labels, a
// number), and only the lines of the metric's family (its name, or its
// name and a suffix: a histogram's or a summary's series) are kept for
// expfmt's parser, which checks them in full. Parsed whole, a page of 4 MiB
// of distinct series cost about 100 MB of heap at every scrape; its lines
// of other families are now looked at and dropped.
func parseMetric(r io.Reader, name string) ([]float64, bool, error) {
	page, err := io.ReadAll(r)
	if err != nil {
		return nil, false, &pageError{err}
	}
	return parsePage(page, name)
}

// parsePage is parseMetric of a page read.
func parsePage(page []byte, name string) ([]float64, bool, error) {
	lines, err := family(page, name)
	if err != nil {
		return nil, false, &pageError{err}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(lines))
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

// family returns the lines of page that name the metric name or a name
// that starts with it (# HELP and # TYPE lines, samples), as they are. Any
// line that is not a comment, a blank line or a sample (a metric name,
// possibly quoted in braces, labels in braces, a number, possibly a
// timestamp) is an error naming the line: the page is not exposition
// text. It is never stricter than expfmt's parser on a page that parser
// takes (FuzzParseMetric).
func family(page []byte, name string) ([]byte, error) {
	var out []byte
	for n := 1; len(page) > 0; n++ {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		text := bytes.TrimLeft(bytes.TrimRight(line, "\n"), " \t")
		var metric []byte
		switch {
		case len(text) == 0:
			continue
		case text[0] == '#':
			kind, rest := field(text[1:])
			if string(kind) != "HELP" && string(kind) != "TYPE" {
				continue // a comment
			}
			if metric, _ = field(rest); len(metric) == 0 {
				continue
			}
		default:
			var err error
			if metric, err = sampleName(text); err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
		}
		if bytes.HasPrefix(metric, []byte(name)) {
			out = append(out, line...)
		}
	}
	return out, nil
}

// field returns the first blank-separated field of b and what follows it.
func field(b []byte) (f, rest []byte) {
	b = bytes.TrimLeft(b, " \t")
	i := bytes.IndexAny(b, " \t")
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i:]
}

// sampleName checks that text (a line without its leading blanks and
// newline) is a sample line and returns its metric name.
func sampleName(text []byte) ([]byte, error) {
	var name []byte
	rest := text
	if text[0] != '{' {
		i := 0
		for i < len(text) && isNameByte(text[i], i == 0) {
			i++
		}
		if i == 0 {
			return nil, fmt.Errorf("%q does not start with a metric name", clip(text))
		}
		name, rest = text[:i], bytes.TrimLeft(text[i:], " \t")
	}
	if len(rest) > 0 && rest[0] == '{' {
		end, quoted, err := labelsEnd(rest)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", clip(text), err)
		}
		if name == nil {
			if quoted == nil {
				return nil, fmt.Errorf("%q has no metric name", clip(text))
			}
			name = quoted
		}
		rest = rest[end:]
	} else if name == nil {
		return nil, fmt.Errorf("%q does not start with a metric name", clip(text))
	}
	value, rest := field(rest)
	_, more := field(rest) // a timestamp may follow: expfmt's parser checks it where it counts
	if len(value) == 0 || len(bytes.TrimSpace(more)) > 0 {
		return nil, fmt.Errorf("%q: not a metric name and a value", clip(text))
	}
	if bytes.ContainsAny(value, "pP_") || !isFloat(value) {
		return nil, fmt.Errorf("%q: the value %q is not a number", clip(text), value)
	}
	return name, nil
}

// isFloat reports whether b is a number strconv.ParseFloat takes, without
// making a string of it when it is a plain decimal number (the usual case).
func isFloat(b []byte) bool {
	plain := len(b) > 0
	for _, c := range b {
		if (c < '0' || c > '9') && c != '.' && c != '-' && c != '+' && c != 'e' && c != 'E' {
			plain = false
			break
		}
	}
	if plain && len(b) < 24 {
		var buf [24]byte
		_, err := strconv.ParseFloat(string(append(buf[:0], b...)), 64)
		return err == nil
	}
	_, err := strconv.ParseFloat(string(b), 64)
	return err == nil
}

// labelsEnd returns the length of the label set at the start of b ("{"
// to the matching "}", skipping quoted strings with their escapes) and the
// quoted metric name that may lead it ({"name", ...}).
func labelsEnd(b []byte) (end int, quotedName []byte, err error) {
	first := true
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '}':
			return i + 1, quotedName, nil
		case '"':
			j := i + 1
			for ; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			if j >= len(b) {
				return 0, nil, errors.New("a quoted string is not closed")
			}
			if first {
				// A quoted name followed by "," or "}": the metric's.
				k := j + 1
				for k < len(b) && (b[k] == ' ' || b[k] == '\t') {
					k++
				}
				if k < len(b) && (b[k] == ',' || b[k] == '}') {
					if u, err := strconv.Unquote(string(b[i : j+1])); err == nil {
						quotedName = []byte(u)
					}
				}
			}
			first = false
			i = j
		case ' ', '\t':
		default:
			first = false
		}
	}
	return 0, nil, errors.New("the labels' braces are not closed")
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9')
}

// clip shortens a line for an error message.
func clip(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}
