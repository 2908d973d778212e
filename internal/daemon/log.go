package daemon

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syself/autopilot-health/internal/journallog"
	"github.com/syself/autopilot-health/report"
)

// NewLogger builds the daemon's logger. Format "journal" writes one line per
// record with a syslog priority prefix (<3> error ... <7> debug) and no
// timestamp, because journald adds both (journallog); "auto" picks it when
// stderr is the journal stream (JOURNAL_STREAM), else text.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	if format == "auto" {
		format = "text"
		if StderrIsJournal() {
			format = "journal"
		}
	}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(printableJSON{w}, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "journal":
		return slog.New(journallog.NewHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want auto, journal, text or json", format)
}

// StderrIsJournal reports whether stderr is connected to journald, as
// systemd tells a service in JOURNAL_STREAM=<device>:<inode>.
func StderrIsJournal() bool { return journallog.StderrIsJournal() }

// printableJSON writes each record of slog's JSON handler (one Write per
// record) with the characters that are not printable and that
// encoding/json leaves raw (DEL, the C1 controls, the bidi overrides) as
// \u escapes: a value anyone chose (a protected file's name) reaches the
// journal and a terminal as text, as the text and journal formats quote it.
type printableJSON struct{ w io.Writer }

func (p printableJSON) Write(b []byte) (int, error) {
	if _, err := p.w.Write(report.PrintableJSON(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// registerLogDropped exposes autopilot_health_log_lines_dropped_total: the
// log lines the daemon's log writer (logsink) dropped because stderr did
// not take them (journald stopped or stuck), at 0 from the start.
func registerLogDropped(reg prometheus.Registerer, dropped func() uint64) {
	if reg == nil {
		return
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: report.Namespace, Name: "log_lines_dropped_total",
		Help: "Log lines dropped because stderr (the journal's stream) did not take them: journald stopped, or stuck on its disk. The log's writer never blocks the daemon's loops; once stderr takes lines again one line says how many were dropped.",
	}, func() float64 {
		if dropped == nil {
			return 0
		}
		return float64(dropped())
	}))
}
