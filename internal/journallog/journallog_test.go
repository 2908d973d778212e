package journallog

import (
	"bytes"
	"log/slog"
	"testing"
)

// Each record is one line led by its priority, debug included, without its
// time; the level option still filters.
func TestHandlerPrefixesThePriority(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(NewHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log.With("op", "nvme-smart").Warn("a call is hung", "err", "line1\nline2")
	log.Debug("d")
	log.Error("e")
	log.Info("i")
	want := "<4>level=WARN msg=\"a call is hung\" op=nvme-smart err=\"line1\\nline2\"\n<7>level=DEBUG msg=d\n<3>level=ERROR msg=e\n<6>level=INFO msg=i\n"
	if b.String() != want {
		t.Errorf("output\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	log = slog.New(NewHandler(&b, nil))
	log.Debug("hidden")
	if b.Len() != 0 {
		t.Errorf("a debug line at the default level: %q", b.String())
	}
}
