package hostio

import "log/slog"

// MalformedSaid logs a reader's skipped lines once per change, not per
// reading (the readers of autopilot_health_malformed_lines_total, the
// checks' and the kernel log monitor's): a reading with malformed lines
// whose first differs from the one said last is logged; a reading without
// any clears what was said, so malformed lines coming back are logged
// again.
type MalformedSaid struct {
	said string
}

// Reading notes one reading of the input: n malformed lines, key what
// names the first of them from reading to reading (its text, not its
// number, which moves as lines come and go before it). It logs msg with
// attrs where that is a change.
func (s *MalformedSaid) Reading(log *slog.Logger, n int, key, msg string, attrs ...any) {
	if n == 0 {
		s.said = ""
		return
	}
	if key == s.said {
		return
	}
	s.said = key
	if log != nil {
		log.Warn(msg, append(attrs, "lines", n)...)
	}
}
