package report

import (
	"bytes"
	"compress/gzip"
	"hash/maphash"
	"log"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Handler serves the registry on /metrics. A scrape in the Prometheus text
// format (what Prometheus asks for unless told otherwise, and curl) does not
// re-encode what did not change: each metric family's text is kept with a
// hash of what the text shows (labels, values, buckets, quantiles), and
// only a family whose hash changed is encoded again. Most of the ~450
// series (conditions, counters of runs and events, the check histograms)
// change only when state changes; the process_* and go_* families change
// every scrape. gzip is at the fastest level (a scrape is ~45 KB of text
// that compresses ~10:1 even so). Other formats (protobuf, OpenMetrics)
// are promhttp's, unchanged. Measured by BenchmarkScrape (README, Cost).
func (m *Metrics) Handler(errorLog *log.Logger) http.Handler {
	return newExposition(m.Registry, errorLog)
}

type exposition struct {
	reg      prometheus.Gatherer
	fallback http.Handler
	errorLog *log.Logger
	seed     maphash.Seed

	mu    sync.Mutex
	cache map[string]*familyText // by format and family name
	buf   bytes.Buffer           // the text of a scrape
	zbuf  bytes.Buffer           // and compressed
	gz    *gzip.Writer
}

type familyText struct {
	hash uint64
	text []byte
	seen bool // in the last scrape (a family gone is dropped from the cache)
}

func newExposition(reg prometheus.Gatherer, errorLog *log.Logger) *exposition {
	var opts promhttp.HandlerOpts
	if errorLog != nil {
		opts.ErrorLog = errorLog
	}
	return &exposition{reg: reg, fallback: promhttp.HandlerFor(reg, opts), errorLog: errorLog, seed: maphash.MakeSeed(), cache: map[string]*familyText{}}
}

func (e *exposition) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
	if format.FormatType() != expfmt.TypeTextPlain || (r.URL != nil && r.URL.Query().Has("name[]")) {
		e.fallback.ServeHTTP(w, r)
		return
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		// promhttp's default (HTTPErrorOnError) for a failed collection.
		if e.errorLog != nil {
			e.errorLog.Println("error gathering metrics:", err)
		}
		http.Error(w, "An error has occurred while serving metrics:\n\n"+err.Error(), http.StatusInternalServerError)
		return
	}
	// The cache is shared; the texts in it are never modified (a changed
	// family gets a new one), so the response is written from them after
	// the lock is released: a slow client does not hold up the next scrape.
	e.mu.Lock()
	parts := make([][]byte, 0, len(mfs))
	size := 0
	prefix := string(format) + "\x00"
	for _, mf := range mfs {
		key := prefix + mf.GetName()
		h := e.hash(mf)
		ft := e.cache[key]
		if ft == nil || ft.hash != h {
			var b bytes.Buffer
			if err := expfmt.NewEncoder(&b, format).Encode(mf); err != nil {
				if e.errorLog != nil {
					e.errorLog.Println("error encoding metric family:", err)
				}
				continue
			}
			ft = &familyText{hash: h, text: b.Bytes()}
			e.cache[key] = ft
		}
		ft.seen = true
		parts = append(parts, ft.text)
		size += len(ft.text)
	}
	for k, ft := range e.cache {
		if !ft.seen && strings.HasPrefix(k, prefix) {
			delete(e.cache, k)
		}
		ft.seen = false
	}
	e.mu.Unlock()

	hdr := w.Header()
	hdr.Set("Content-Type", string(format))
	hdr.Add("Vary", "Accept")
	hdr.Add("Vary", "Accept-Encoding")
	if !acceptsGzip(r.Header.Get("Accept-Encoding")) {
		hdr.Set("Content-Length", strconv.Itoa(size))
		for _, p := range parts {
			if _, err := w.Write(p); err != nil {
				return
			}
		}
		return
	}
	hdr.Set("Content-Encoding", "gzip")
	gz, _ := gzipWriters.Get().(*gzip.Writer)
	if gz == nil {
		gz, _ = gzip.NewWriterLevel(w, gzip.BestSpeed)
	} else {
		gz.Reset(w)
	}
	defer gzipWriters.Put(gz)
	for _, p := range parts {
		if _, err := gz.Write(p); err != nil {
			return
		}
	}
	gz.Close()
}

// gzipWriters are reused across scrapes (a flate compressor is ~1 MB of
// state to allocate).
var gzipWriters sync.Pool

// acceptsGzip reports whether an Accept-Encoding header allows gzip (and
// does not refuse it with q=0).
func acceptsGzip(h string) bool {
	for part := range strings.SplitSeq(h, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		q := strings.ReplaceAll(params, " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}

// hash covers all that the text format shows of a family: its name, help
// and type, and per metric the labels, the timestamp and the values
// (counter, gauge, untyped; summary count, sum and quantiles; histogram
// count, sum and buckets).
func (e *exposition) hash(mf *dto.MetricFamily) uint64 {
	var h maphash.Hash
	h.SetSeed(e.seed)
	str := func(s string) { h.WriteString(s); h.WriteByte(0) }
	num := func(f float64) {
		var b [8]byte
		u := math.Float64bits(f)
		for i := range b {
			b[i] = byte(u >> (8 * i))
		}
		h.Write(b[:])
	}
	str(mf.GetName())
	str(mf.GetHelp())
	num(float64(mf.GetType()))
	for _, m := range mf.GetMetric() {
		h.WriteByte(1)
		for _, l := range m.GetLabel() {
			str(l.GetName())
			str(l.GetValue())
		}
		if m.TimestampMs != nil {
			num(float64(m.GetTimestampMs()))
		}
		if m.Counter != nil {
			num(m.Counter.GetValue())
		}
		if m.Gauge != nil {
			num(m.Gauge.GetValue())
		}
		if m.Untyped != nil {
			num(m.Untyped.GetValue())
		}
		if s := m.Summary; s != nil {
			num(float64(s.GetSampleCount()))
			num(s.GetSampleSum())
			for _, q := range s.GetQuantile() {
				num(q.GetQuantile())
				num(q.GetValue())
			}
		}
		if hg := m.Histogram; hg != nil {
			num(float64(hg.GetSampleCount()))
			num(hg.GetSampleCountFloat())
			num(hg.GetSampleSum())
			for _, b := range hg.GetBucket() {
				num(b.GetUpperBound())
				num(float64(b.GetCumulativeCount()))
				num(b.GetCumulativeCountFloat())
			}
		}
	}
	return h.Sum64()
}
