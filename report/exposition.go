package report

import (
	"bytes"
	"hash/maphash"
	"log"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Handler serves every metric on /metrics. A scrape in the Prometheus text
// format (what Prometheus asks for unless told otherwise, and curl) does not
// gather or encode again what did not change: the versioned families
// (Metrics, ~480 of ~540 series: the conditions, problem counters, check
// runs and durations, loop progress) are gathered and encoded only when a
// change moved their version; the go_* and process_* families, which
// change every scrape, are read in the scraping goroutine and their values
// written into text made once (runtimeCollector); of the rest (Registry:
// the kernel log, Kubernetes, repair and unit metrics), each family's text
// is kept with a hash of what it shows (labels, values, buckets,
// quantiles), and only a family whose hash changed is encoded again. A gzip response compresses
// only the parts of the page whose text changed (gzipper). Other formats
// (protobuf; OpenMetrics, which promhttp answers in text as it is not enabled) are promhttp's, unchanged. Measured by
// BenchmarkScrape (README, Cost).
func (m *Metrics) Handler(errorLog *log.Logger) http.Handler {
	return newExposition(m.Registry, m.runtime, m.families, m.Gatherer(), errorLog)
}

type exposition struct {
	reg *Registry
	// runtime write their families' text themselves, every scrape.
	runtime  []runtimeCollector
	families func() []*family
	// all gathers every registry (Gatherers); fallback is promhttp's
	// handler over it.
	all      prometheus.Gatherer
	fallback http.Handler
	errorLog *log.Logger
	seed     maphash.Seed
	gzipper  gzipper

	mu    sync.Mutex
	cache map[string]*familyText // by format and family name
	// famText: each versioned family's text by format, and the version
	// it was gathered at.
	famText map[famKey]*versionedText
	// orderKeys are the last scrape's texts as gathered, and order the
	// order that sorts them.
	orderKeys []orderKey
	order     []int
	// checkedNames: the names of the last page whose families all
	// passed the Gatherers' checks across registries.
	checkedNames []string
}

type orderKey struct{ name, part string }

type famKey struct {
	format expfmt.Format
	f      *family
}

type familyText struct {
	hash uint64
	text []byte
	seen bool // in the last scrape (a family gone is dropped from the cache)
}

type versionedText struct {
	version uint64
	parts   []namedText // its families, by name
}

type namedText struct {
	name string
	// part: for a family that is one part of a metric family (one
	// check's durations), what orders it among the others (family.part).
	part string
	text []byte
	// versioned: one part of a versioned family, merged with the other
	// parts of the same name.
	versioned bool
}

// body is the text without its leading comments (# HELP and # TYPE): what a
// part adds to the part before it of the same metric family.
func (n namedText) body() []byte {
	b := n.text
	for len(b) > 0 && b[0] == '#' {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil
		}
		b = b[i+1:]
	}
	return b
}

func newExposition(reg *Registry, runtime []runtimeCollector, families func() []*family, all prometheus.Gatherer, errorLog *log.Logger) *exposition {
	var opts promhttp.HandlerOpts
	if errorLog != nil {
		opts.ErrorLog = errorLog
	}
	return &exposition{reg: reg, runtime: runtime, families: families, all: all, fallback: promhttp.HandlerFor(all, opts), errorLog: errorLog, seed: maphash.MakeSeed(),
		gzipper: newGzipper(), cache: map[string]*familyText{}, famText: map[famKey]*versionedText{}}
}

func (e *exposition) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
	if format.FormatType() != expfmt.TypeTextPlain || (r.URL != nil && r.URL.Query().Has("name[]")) {
		e.fallback.ServeHTTP(w, r)
		return
	}
	// A gathering that fails is answered by promhttp (gathering again):
	// its status, its error as it words it (through the Gatherers of every
	// registry, naming the one that failed) and its log line.
	mfs, err := e.reg.gatherText()
	if err != nil {
		e.fallback.ServeHTTP(w, r)
		return
	}
	// The go_* and process_* families, which change every scrape, are
	// read and written as text here, in this goroutine.
	rt := getText()
	defer putText(rt)
	var rtNamed []namedText
	for _, c := range e.runtime {
		*rt, rtNamed = c.appendText(*rt, rtNamed)
	}
	// The caches are shared; the texts in them are never modified (a
	// changed family gets a new one), so the response is written from them
	// after the lock is released: a slow client does not hold up the next
	// scrape.
	fams := e.families()
	e.mu.Lock()
	named := make([]namedText, 0, len(mfs)+len(rtNamed)+2*len(fams))
	named = append(named, rtNamed...)
	prefix := string(format) + "\x00"
	for _, mf := range mfs {
		key := prefix + mf.GetName()
		h := e.hash(mf)
		ft := e.cache[key]
		if ft == nil || ft.hash != h {
			text, err := e.encode(mf, format)
			if err != nil {
				continue
			}
			ft = &familyText{hash: h, text: text}
			e.cache[key] = ft
		}
		ft.seen = true
		named = append(named, namedText{name: mf.GetName(), text: ft.text})
	}
	for k, ft := range e.cache {
		if !ft.seen && strings.HasPrefix(k, prefix) {
			delete(e.cache, k)
		}
		ft.seen = false
	}
	for _, f := range fams {
		// The version before the gathering: a change made meanwhile
		// moves it past what is kept, and the next scrape gathers again.
		v := f.version.Load()
		key := famKey{format, f}
		vt := e.famText[key]
		if vt == nil || vt.version != v {
			fmfs, err := f.reg.Gather()
			if err != nil {
				e.mu.Unlock()
				e.fallback.ServeHTTP(w, r)
				return
			}
			vt = &versionedText{version: v}
			for _, mf := range fmfs {
				if text, err := e.encode(mf, format); err == nil {
					vt.parts = append(vt.parts, namedText{name: mf.GetName(), part: f.part, text: text, versioned: true})
				}
			}
			e.famText[key] = vt
		}
		named = append(named, vt.parts...)
	}
	named = e.sorted(named)
	if !e.consistent(named) {
		e.mu.Unlock()
		e.fallback.ServeHTTP(w, r)
		return
	}
	e.mu.Unlock()
	for i := 1; i < len(named); i++ {
		if named[i].name == named[i-1].name {
			named[i].text = named[i].body()
		}
	}
	size := 0
	for _, n := range named {
		size += len(n.text)
	}

	hdr := w.Header()
	hdr.Set("Content-Type", string(format))
	hdr.Add("Vary", "Accept")
	hdr.Add("Vary", "Accept-Encoding")
	// The response is written with one write: net/http would send the
	// parts in chunks of its 4 KB buffer, each a system call.
	body := getBuf()
	defer putBuf(body)
	body.Grow(size)
	for _, n := range named {
		body.Write(n.text)
	}
	if acceptsGzip(r.Header) {
		hdr.Set("Content-Encoding", "gzip")
		plain := body
		body = getBuf()
		defer putBuf(body)
		e.gzipper.gzip(body, plain.Bytes())
	}
	hdr.Set("Content-Length", strconv.Itoa(body.Len()))
	w.Write(body.Bytes())
}

// sorted is named in the order of the names, as promhttp serves them, and
// the parts of a metric family in the order of their first label's value
// (the order of its series in promhttp's). The texts are gathered in the
// same order scrape after scrape, so the order found by the last sort is
// used again until they are not.
func (e *exposition) sorted(named []namedText) []namedText {
	same := len(named) == len(e.orderKeys)
	for i := 0; same && i < len(named); i++ {
		same = named[i].name == e.orderKeys[i].name && named[i].part == e.orderKeys[i].part
	}
	if !same {
		e.orderKeys, e.order = e.orderKeys[:0], e.order[:0]
		for i, n := range named {
			e.orderKeys = append(e.orderKeys, orderKey{n.name, n.part})
			e.order = append(e.order, i)
		}
		slices.SortFunc(e.order, func(a, b int) int {
			ka, kb := e.orderKeys[a], e.orderKeys[b]
			if c := strings.Compare(ka.name, kb.name); c != 0 {
				return c
			}
			return strings.Compare(ka.part, kb.part)
		})
	}
	out := make([]namedText, len(named))
	for i, j := range e.order {
		out[i] = named[j]
	}
	return out
}

// consistent reports whether the page's families, gathered from several
// registries, are what the Gatherers of them all would serve without merging
// or refusing any: no name twice but among the parts of versioned families
// (a family of the main registry named as a go_*, process_* or versioned
// one the Gatherers merge, or refuse for its help, type or a series twice),
// and, whenever the set of names changes, no collision the Gatherers find
// across registries (a summary's or histogram's suffix). Where it is not,
// promhttp answers. e.mu is held; named is sorted.
func (e *exposition) consistent(named []namedText) bool {
	for i := 1; i < len(named); i++ {
		if named[i].name == named[i-1].name && !(named[i].versioned && named[i-1].versioned) {
			return false
		}
	}
	j := 0
	same := true
	for i, n := range named {
		if i > 0 && n.name == named[i-1].name {
			continue
		}
		if j >= len(e.checkedNames) || e.checkedNames[j] != n.name {
			same = false
			break
		}
		j++
	}
	if same && j == len(e.checkedNames) {
		return true
	}
	if _, err := e.all.Gather(); err != nil {
		return false
	}
	e.checkedNames = e.checkedNames[:0]
	for i, n := range named {
		if i == 0 || n.name != named[i-1].name {
			e.checkedNames = append(e.checkedNames, n.name)
		}
	}
	return true
}

// textBufs hold the text of the runtime families of a scrape.
var textBufs sync.Pool

func getText() *[]byte {
	if b, _ := textBufs.Get().(*[]byte); b != nil {
		return b
	}
	b := make([]byte, 0, 16<<10)
	return &b
}

func putText(b *[]byte) {
	if cap(*b) <= 1<<20 {
		*b = (*b)[:0]
		textBufs.Put(b)
	}
}

// respBufs are the response buffers, reused across scrapes.
var respBufs sync.Pool

func getBuf() *bytes.Buffer {
	if buf, _ := respBufs.Get().(*bytes.Buffer); buf != nil {
		return buf
	}
	return new(bytes.Buffer)
}

func putBuf(buf *bytes.Buffer) {
	if buf.Cap() <= 1<<20 { // a scrape is ~50 KB; an outsized one is not kept
		buf.Reset()
		respBufs.Put(buf)
	}
}

// encode is the text of a family in format.
func (e *exposition) encode(mf *dto.MetricFamily, format expfmt.Format) ([]byte, error) {
	var b bytes.Buffer
	if err := expfmt.NewEncoder(&b, format).Encode(mf); err != nil {
		if e.errorLog != nil {
			e.errorLog.Println("error encoding metric family:", err)
		}
		return nil, err
	}
	return b.Bytes(), nil
}

// acceptsGzip reports whether the request's Accept-Encoding allows gzip: a
// gzip entry whose weight is not 0, or, with no gzip entry, a "*" entry
// whose weight is not 0 ("*" stands for every coding not listed, RFC 9110
// §12.5.3). A weight of 0 is a refusal (§12.4.2): its name in any case,
// its value in any spelling of 0 (0, 0.0, 0.00, 0.000). "identity" alone,
// or no header, is no gzip. The field sent on several lines is their
// values joined by commas (§5.3), every line read, not the first alone.
func acceptsGzip(hdr http.Header) bool {
	star := false
	for part := range strings.SplitSeq(strings.Join(hdr.Values("Accept-Encoding"), ","), ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		coding = strings.TrimSpace(coding)
		isGzip := strings.EqualFold(coding, "gzip")
		if !isGzip && coding != "*" {
			continue
		}
		accepted := true
		for p := range strings.SplitSeq(params, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
			if strings.EqualFold(strings.TrimSpace(k), "q") {
				if q, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && q <= 0 {
					accepted = false
				}
			}
		}
		if isGzip {
			return accepted
		}
		star = accepted
	}
	return star
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
