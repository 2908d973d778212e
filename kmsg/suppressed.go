package kmsg

import (
	"bytes"
	"math"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// The kernel rate-limits many of its messages (printk_ratelimited and the
// like: DEFAULT_RATELIMIT_INTERVAL 5 s, DEFAULT_RATELIMIT_BURST 10), one
// state per call site whatever the device, and at the first call after an
// interval in which it dropped some it prints how many
// (lib/ratelimit.c ___ratelimit, KERN_WARNING):
//
//	blk_print_req_error: 37 callbacks suppressed
//
// "%s: %d callbacks suppressed" in 6.1 and 6.12 ("%u" in later kernels),
// the function that holds the call site (__func__). The block layer's
// "I/O error, dev X, sector ..." lines that DisksFailure counts are such
// a site: a flood of errors on a device the window leaves out (a loop
// device, an NVMe over Fabrics namespace) or on any device hides the
// errors of a disk in the same interval, and the count is then a lower
// bound.

// suppressedSuffix ends the rate limit's line.
const suppressedSuffix = " callbacks suppressed"

// ioErrorSites are the functions whose rate limit drops the block layer's
// I/O error lines (the BlockIOError rule's): blk_print_req_error
// (block/blk-mq.c, 5.18+: Debian 12's 6.1, Debian 13's 6.12),
// print_req_error (block/blk-core.c, 4.13-5.17) and blk_update_request
// (before, which printed the line itself).
var ioErrorSites = []string{"blk_print_req_error", "print_req_error", "blk_update_request"}

// maxSuppressedFunctions bounds the metric's series: the functions after
// that many are counted as suppressedOther.
const (
	maxSuppressedFunctions = 64
	suppressedOther        = "(other)"
)

// parseSuppressed reads the rate limit's line: the function (a C
// identifier) and the count; ok false for any other message.
func parseSuppressed(msg []byte) (fn []byte, n uint64, ok bool) {
	rest, found := bytes.CutSuffix(bytes.TrimRight(msg, " \n"), []byte(suppressedSuffix))
	if !found {
		return nil, 0, false
	}
	i := bytes.IndexByte(rest, ':')
	if i <= 0 || i > 128 || !bytes.HasPrefix(rest[i:], []byte(": ")) {
		return nil, 0, false
	}
	fn = rest[:i]
	for j, c := range fn {
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || j > 0 && '0' <= c && c <= '9') {
			return nil, 0, false
		}
	}
	if n, ok = parseUint(rest[i+2:]); !ok {
		return nil, 0, false
	}
	return fn, n, true
}

// suppression is a count of I/O error lines the kernel dropped, dated by
// the last I/O error line before the count (the dropped lines came after
// the last one the interval printed, and at most the interval after it).
type suppression struct {
	Usec uint64 `json:"usec"`
	N    uint64 `json:"n"`
}

// maxSuppressions bounds the suppressions the window keeps (the oldest
// dropped for room): the kernel prints at most one per site every 5 s.
const maxSuppressions = 256

// countSuppressed counts a rate limit's line in the metric, and, for an
// I/O error site, in the window at usec; it reports whether the window
// changed.
func (mon *Monitor) countSuppressed(fn []byte, n, usec uint64, keep uint64) bool {
	c, ok := mon.suppressedFns[string(fn)] // no allocation for the lookup
	if !ok {
		name := string(fn)
		if len(mon.suppressedFns) >= maxSuppressedFunctions {
			name = suppressedOther
		}
		c = mon.m.suppressed.WithLabelValues(name)
		if name != suppressedOther {
			mon.suppressedFns[name] = c
		}
	}
	c.Add(float64(n))
	if !slices.Contains(ioErrorSites, string(fn)) || n == 0 {
		return false
	}
	at := usec
	if mon.lastSiteUsec != 0 && mon.lastSiteUsec <= usec {
		at = mon.lastSiteUsec
	}
	mon.addSuppressed(suppression{Usec: at, N: n}, keep)
	return true
}

// addSuppressed keeps s, first dropping those more than keep (µs) older
// and, when full, the oldest.
func (mon *Monitor) addSuppressed(s suppression, keep uint64) {
	i := 0
	for i < len(mon.suppressedIO) && s.Usec > mon.suppressedIO[i].Usec && s.Usec-mon.suppressedIO[i].Usec > keep {
		i++
	}
	if len(mon.suppressedIO)-i >= maxSuppressions {
		i = len(mon.suppressedIO) - maxSuppressions + 1
	}
	mon.suppressedIO = append(mon.suppressedIO[i:], s)
}

// suppressedWithin sums the I/O error lines suppressed within span before
// now (as window.count judges the errors), at most the largest uint64: a
// count read back from a state file edited by hand may be any uint64, and
// a sum that wrapped around said a small one.
func (mon *Monitor) suppressedWithin(now, span uint64) uint64 {
	var n uint64
	for _, s := range mon.suppressedIO {
		if s.Usec > now || now-s.Usec <= span {
			if n+s.N < n {
				return math.MaxUint64
			}
			n += s.N
		}
	}
	return n
}

func newSuppressedVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "kernel_suppressed_messages_total",
		Help: `Kernel messages the kernel's rate limit (printk_ratelimited and the like) dropped, by the function that printed them, as its "<function>: N callbacks suppressed" lines say.`,
	}, []string{"function"})
}
