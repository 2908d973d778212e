package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
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
// URL): ForceAttemptHTTP2. A redirect is followed only on this host
// (onThisHost). A localhost name is dialled without a lookup (dialLocal).
func keptClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: probeTimeout(timeout), CheckRedirect: onThisHost, Transport: &http.Transport{
		DialContext: dialLocal, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 1, IdleConnTimeout: keptConnIdle, DisableCompression: true}}
}

// dialLocal is the probes' dial: rawsys.Dial, a localhost name dialled as
// loopback without a lookup (rawsys.DialLocal;
// TestProbeReachesLocalhostWithoutALookup,
// TestDialLocalDoesNotWaitOutABlackholedLoopback).
var dialLocal = rawsys.DialLocal(rawsys.Dial)

// isLocalhostName is rawsys.IsLocalhostName: localhost or a name under
// .localhost, always loopback (RFC 6761 §6.3).
func isLocalhostName(host string) bool { return rawsys.IsLocalhostName(host) }

// onThisHost is the CheckRedirect of the probes that GET a local page: a
// redirect is followed where it stays on this host (the host the URL
// configured names, localhost, a loopback address: the tunnel agent's
// admin port redirects /metrics to its health port), and is an error
// naming where it pointed otherwise. A local endpoint that sends the probe
// off the node is not the service answering, and the daemon asks nothing
// of a place off the node: before, net/http's default followed it (a DNS
// lookup, a GET there) and that place's answer was taken for the local
// service's (TestScrapeRedirectStaysOnThisHost).
func onThisHost(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		// A Location without a scheme, "localhost:8093/metrics" (the
		// tunnel agent's admin port before it wrote "//host:port/path"),
		// parses as the scheme "localhost": no place this client can ask,
		// on this host or off it (TestScrapeRedirectOfTheTunnelAgentsAdminPort).
		return fmt.Errorf("a redirect to %s, not an http or https URL, is not followed", req.URL.Redacted())
	}
	h := req.URL.Hostname()
	if ip := net.ParseIP(h); (ip != nil && ip.IsLoopback()) || strings.EqualFold(h, "localhost") || strings.EqualFold(h, via[0].URL.Hostname()) {
		return nil
	}
	return fmt.Errorf("a redirect to %s, off this host, is not followed", req.URL.Redacted())
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
		return nil, false, withoutLocalAddr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsPage+1))
	if err != nil {
		return nil, false, fmt.Errorf("GET %s: reading the page: %w", url, withoutLocalAddr(err))
	}
	if len(page) > maxMetricsPage {
		return nil, false, &pageError{fmt.Errorf("longer than %d bytes, the most a check reads", maxMetricsPage)}
	}
	return parsePage(page, name)
}

// withoutLocalAddr returns err with the local address of a connection's
// read or write error left out: "read tcp 127.0.0.1:41234->127.0.0.1:9587:
// read: connection reset by peer" says "read tcp 127.0.0.1:9587: ...". The
// local port is new with each connection, and the error is a condition's
// message: one that changed at every run was a write of the Node's status
// at every run. err is the call's own (net/http and rawsys make a new one
// for each failure), so its *net.OpError is changed in place.
func withoutLocalAddr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Addr != nil {
		oe.Source = nil
	}
	return err
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
	seen := make(map[string]bool, len(f.GetMetric()))
	for _, m := range f.GetMetric() {
		// One series given twice says two things of one value: the
		// exposition format requires each name and label set once (its
		// ingestion is "undefined" otherwise), and expfmt's parser takes
		// both (TestScrapeSeriesTwiceIsAPageError).
		k := seriesKey(m)
		if seen[k] {
			return nil, true, &pageError{fmt.Errorf("the series %s%s is given twice", name, k)}
		}
		seen[k] = true
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

// seriesKey is a series' labels, sorted, as {"a"="x","b"="y"} ("" for
// none; the names quoted too, as they may hold any character): two
// samples with the same key are the same series. A label whose value is
// empty is left out: in Prometheus' data model it is no label, so
// ready{a=""} is the series ready; before, the two were taken for two
// series and both read (TestScrapeSeriesTwiceIsAPageError).
func seriesKey(m *dto.Metric) string {
	var pairs []string
	for _, l := range m.GetLabel() {
		if l.GetValue() != "" {
			pairs = append(pairs, strconv.Quote(l.GetName())+"="+strconv.Quote(l.GetValue()))
		}
	}
	if len(pairs) == 0 {
		return ""
	}
	sort.Strings(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}

// family returns the lines of page that name the metric name or a name
// that starts with it (# HELP and # TYPE lines, samples), as they are, and
// those whose name it cannot tell for sure (quoted), which expfmt's parser
// reads. Any line that is not a comment, a blank line or a sample (a metric
// name, possibly quoted, possibly in the braces, labels in braces, a
// number, possibly a timestamp) is an error naming the line: the page is
// not exposition text. It is never stricter than expfmt's parser on a page
// that parser takes (FuzzParseMetric, TestNamesAnywhereInTheBracesAreRead).
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
			if metric[0] == '"' {
				metric = nil // a quoted name (it may hold blanks): expfmt's to read
			}
		default:
			var err error
			if metric, err = sampleName(text); err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
		}
		// A line whose name is not plain to see here (nil: a quoted name
		// outside the braces, an escape in a quoted one) is kept for
		// expfmt's parser: dropped, it could be a line of the metric.
		if metric == nil || bytes.HasPrefix(metric, []byte(name)) {
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
// newline) is a sample line and returns its metric name: the name that
// starts it, or the element of its braces that is not a label (expfmt's
// parser takes the name anywhere there, quoted or not: {"name", a="b"},
// {a="b", name}). A name it cannot tell for sure (quoted outside the
// braces, or a quoted one it cannot unquote) is nil, with no error.
func sampleName(text []byte) ([]byte, error) {
	var name []byte
	rest := text
	unsure := false
	if text[0] != '{' {
		i := 0
		for i < len(text) && isNameByte(text[i], i == 0) {
			i++
		}
		switch {
		case i < len(text) && text[i] == '"':
			// A quoted name, or a quoted part of one (a"b"):
			// expfmt's parser reads it.
			unsure = true
			j := quotedEnd(text, i)
			if j < 0 {
				return nil, fmt.Errorf("%q: a quoted string is not closed", clip(text))
			}
			// The name ends at the closing quote: expfmt's parser
			// reads the value right after it, blank or not ("ready"1
			// is ready, 1; A""0 is A, 0: FuzzParseMetric's inputs
			// e5108752be176b1a and f5a83a53d19ed105, refused as "not a
			// metric name and a value" before).
			i = j
		case i == 0:
			return nil, fmt.Errorf("%q does not start with a metric name", clip(text))
		}
		name, rest = text[:i], bytes.TrimLeft(text[i:], " \t")
	}
	if len(rest) > 0 && rest[0] == '{' {
		end, inner, innerUnsure, err := labelsEnd(rest)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", clip(text), err)
		}
		if name == nil {
			if inner == nil && !innerUnsure {
				return nil, fmt.Errorf("%q has no metric name", clip(text))
			}
			name, unsure = inner, innerUnsure
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
	if unsure {
		return nil, nil
	}
	return name, nil
}

// quotedEnd returns the index just past the quoted string that starts at
// b[i] (a '"'), skipping escapes; -1 if it is not closed.
func quotedEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// isFloat reports whether b is a number strconv.ParseFloat takes. The
// conversion does not escape: a short value is converted on the stack.
func isFloat(b []byte) bool {
	_, err := strconv.ParseFloat(string(b), 64)
	return err == nil
}

// labelsEnd returns the length of the label set at the start of b ("{"
// to the matching "}", skipping quoted strings with their escapes) and the
// metric name it holds: its first element that is not a label (no "="
// outside quotes), plain or quoted ({"name", a="b"}, {a="b", name}).
// unsure: that element is one whose name is not plain to see here (a
// quoted string strconv cannot unquote, a mix of quoted and plain).
func labelsEnd(b []byte) (end int, name []byte, unsure bool, err error) {
	start, label := 1, false // the element being read, and whether it has a '='
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '}', ',':
			if !label && name == nil && !unsure {
				name, unsure = elementName(b[start:i])
			}
			if b[i] == '}' {
				return i + 1, name, unsure, nil
			}
			start, label = i+1, false
		case '=':
			label = true
		case '"':
			j := quotedEnd(b, i)
			if j < 0 {
				return 0, nil, false, errors.New("a quoted string is not closed")
			}
			i = j - 1
		}
	}
	return 0, nil, false, errors.New("the labels' braces are not closed")
}

// elementName is the metric name an element of a label set without "="
// names: a plain name, or a quoted one (unquoted); unsure where it is
// neither (nil for an empty element, which expfmt's parser refuses).
func elementName(e []byte) (name []byte, unsure bool) {
	e = bytes.Trim(e, " \t")
	if len(e) == 0 {
		return nil, false
	}
	if e[0] == '"' && quotedEnd(e, 0) == len(e) {
		if u, err := strconv.Unquote(string(e)); err == nil {
			return []byte(u), false
		}
		return nil, true
	}
	for i, c := range e {
		if !isNameByte(c, i == 0) {
			return nil, true
		}
	}
	return e, false
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
