package checks

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/report"
)

// JournalFallbackReason says why a run of KubeletHeartbeatFailed read the
// journal with journalctl instead of natively: a small fixed set, the label
// of autopilot_health_journal_fallbacks_total (never a file name or an
// error's words, which the log line has).
type JournalFallbackReason string

const (
	// FallbackCompression: a file, or a value in it, compressed with XZ
	// or LZ4 (journald's default is zstd).
	FallbackCompression JournalFallbackReason = "compression"
	// FallbackNotKeyedHash: a file hashed with Jenkins' hash, not keyed
	// (written by systemd before 246, or with SYSTEMD_JOURNAL_KEYED_HASH=0).
	FallbackNotKeyedHash JournalFallbackReason = "not-keyed-hash"
	// FallbackUnknownFormat: a file with incompatible flags this reader
	// does not know (a newer systemd's format).
	FallbackUnknownFormat JournalFallbackReason = "unknown-format"
	// FallbackCursor: a saved cursor not of journalctl's form, or one
	// whose boot another sequence's file holds but no file its entry
	// (sd-journal seeks that file by monotonic time).
	FallbackCursor JournalFallbackReason = "cursor"
	// FallbackLayout: journal directories journalctl reads otherwise than
	// this reader (a file outside a machine directory, several machines'
	// directories, /etc/machine-id not read).
	FallbackLayout JournalFallbackReason = "layout"
	// FallbackOrder: the same entry in two files, or files whose entries'
	// order depends on the directory's order.
	FallbackOrder JournalFallbackReason = "order"
	// FallbackInconsistent: a file that breaks the format's rules (torn,
	// truncated, being created, a corrupt value).
	FallbackInconsistent JournalFallbackReason = "inconsistent"
	// FallbackError: the files could not be read (permissions, I/O).
	FallbackError JournalFallbackReason = "error"
)

// JournalFallbackReasons are all the reasons, in the order of their series.
var JournalFallbackReasons = []JournalFallbackReason{FallbackCompression, FallbackNotKeyedHash, FallbackUnknownFormat,
	FallbackCursor, FallbackLayout, FallbackOrder, FallbackInconsistent, FallbackError}

// nativeUnsupported is an errJournalUnsupported with its reason.
type nativeUnsupported struct {
	reason JournalFallbackReason
	err    error
}

func (e *nativeUnsupported) Error() string { return e.err.Error() }
func (e *nativeUnsupported) Unwrap() error { return e.err }

// fallbackReason is the reason for a native reader's error.
func fallbackReason(err error) JournalFallbackReason {
	if u := (*nativeUnsupported)(nil); errors.As(err, &u) {
		return u.reason
	}
	if errors.Is(err, errJournalCorrupt) {
		return FallbackInconsistent
	}
	return FallbackError
}

// JournalFallbacks counts the runs of KubeletHeartbeatFailed that read the
// journal with journalctl, by reason
// (autopilot_health_journal_fallbacks_total); a nil one counts nothing (the
// one-shot check).
type JournalFallbacks struct {
	runs *prometheus.CounterVec
}

// NewJournalFallbacks returns the counter, every reason's series at 0 (so
// increase() sees the first fallback), registered with reg where it is not
// nil.
func NewJournalFallbacks(reg prometheus.Registerer) *JournalFallbacks {
	f := &JournalFallbacks{runs: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "journal_fallbacks_total",
		Help: "Runs of KubeletHeartbeatFailed that read the journal with journalctl because the native reader of journald's files could not, by reason (compression, not-keyed-hash, unknown-format, cursor, layout, order, inconsistent, error).",
	}, []string{"reason"})}
	for _, r := range JournalFallbackReasons {
		f.runs.WithLabelValues(string(r))
	}
	if reg != nil {
		reg.MustRegister(f.runs)
	}
	return f
}

func (f *JournalFallbacks) add(r JournalFallbackReason) {
	if f != nil {
		f.runs.WithLabelValues(string(r)).Inc()
	}
}
