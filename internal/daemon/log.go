package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
)

// NewLogger builds the daemon's logger. Format "journal" writes one line per
// record with a syslog priority prefix (<3> error ... <7> debug) and no
// timestamp, because journald adds both; "auto" picks it when stderr is the
// journal stream (JOURNAL_STREAM), else text.
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
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "journal":
		return slog.New(newJournalHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want auto, journal, text or json", format)
}

// StderrIsJournal reports whether stderr is connected to journald, as
// systemd tells a service in JOURNAL_STREAM=<device>:<inode>.
func StderrIsJournal() bool {
	js := os.Getenv("JOURNAL_STREAM")
	if js == "" {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(2, &st); err != nil {
		return false
	}
	return js == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

type journalHandler struct {
	inner slog.Handler
	st    *journalState
}

type journalState struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   io.Writer
}

func newJournalHandler(w io.Writer, opts *slog.HandlerOptions) *journalHandler {
	st := &journalState{w: w}
	o := *opts
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if opts.ReplaceAttr != nil {
			return opts.ReplaceAttr(groups, a)
		}
		return a
	}
	return &journalHandler{inner: slog.NewTextHandler(&st.buf, &o), st: st}
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	h.st.buf.Reset()
	h.st.buf.WriteString(priority(r.Level))
	if err := h.inner.Handle(ctx, r); err != nil {
		return err
	}
	// The text handler quotes values with newlines, so a record is one line.
	_, err := h.st.w.Write(h.st.buf.Bytes())
	return err
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &journalHandler{inner: h.inner.WithAttrs(as), st: h.st}
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	return &journalHandler{inner: h.inner.WithGroup(name), st: h.st}
}

// priority returns the sd-daemon(3) prefix for a level.
func priority(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "<3>"
	case l >= slog.LevelWarn:
		return "<4>"
	case l >= slog.LevelInfo:
		return "<6>"
	}
	return "<7>"
}
