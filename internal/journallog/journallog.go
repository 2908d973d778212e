// Package journallog formats log records for journald: one line per record
// with an sd-daemon(3) priority prefix (<3> error ... <7> debug) and no
// timestamp, because journald adds both. The daemon and its privileged
// helper log through it when their stderr is the journal stream.
package journallog

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

// Handler writes each record as one text line with its priority prefix and
// without its time. Without the prefix journald files every line at the
// unit's SyslogLevel= (info): a warning would not show under
// journalctl -p warning, and a debug line would read as info.
type Handler struct {
	inner slog.Handler
	st    *state
}

type state struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   io.Writer
}

// NewHandler returns a Handler writing to w; opts as slog's text handler's.
func NewHandler(w io.Writer, opts *slog.HandlerOptions) *Handler {
	st := &state{w: w}
	var o slog.HandlerOptions
	if opts != nil {
		o = *opts
	}
	user := o.ReplaceAttr
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if user != nil {
			return user(groups, a)
		}
		return a
	}
	return &Handler{inner: slog.NewTextHandler(&st.buf, &o), st: st}
}

func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	h.st.buf.Reset()
	h.st.buf.WriteString(Priority(r.Level))
	if err := h.inner.Handle(ctx, r); err != nil {
		return err
	}
	// The text handler quotes values with newlines, so a record is one line.
	_, err := h.st.w.Write(h.st.buf.Bytes())
	return err
}

func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &Handler{inner: h.inner.WithAttrs(as), st: h.st}
}

func (h *Handler) WithGroup(name string) slog.Handler {
	return &Handler{inner: h.inner.WithGroup(name), st: h.st}
}

// Priority returns the sd-daemon(3) prefix for a level.
func Priority(l slog.Level) string {
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
