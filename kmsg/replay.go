package kmsg

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"

	"github.com/syself/autopilot-health/report"
)

// ParseLine reads one line of captured kernel log: a raw /dev/kmsg record
// ("6,399,6531168,-;message"), dmesg output with or without "[ seconds]"
// timestamps (and dmesg -r's "<N>" priority), or journalctl -k output
// (-o short-monotonic "[ seconds] host kernel: message", or the default
// "Mon DD HH:MM:SS host kernel: message"). hasTime says whether the line
// carried a kernel timestamp (in rec.Usec). skip is set for lines that are
// not kernel messages (a raw record's " KEY=value" dictionary lines, blank
// lines).
func ParseLine(line []byte) (rec Record, hasTime, skip bool) {
	line = bytes.TrimRight(line, "\r\n")
	if len(bytes.TrimSpace(line)) == 0 || dictLine.Match(line) {
		return rec, false, true
	}
	if rawRecord.Match(line) {
		if r, err := ParseRecord(line); err == nil {
			return r, true, false
		}
	}
	rest := line
	if m := prioPrefix.FindSubmatch(rest); m != nil {
		p, _ := strconv.Atoi(string(m[1]))
		rec.Facility, rec.Level = uint8(p>>3), uint8(p&7)
		rest = rest[len(m[0]):]
	}
	if m := secondsPrefix.FindSubmatch(rest); m != nil {
		if s, err := strconv.ParseFloat(string(m[1]), 64); err == nil {
			rec.Usec, hasTime = uint64(s*1e6+0.5), true
		}
		rest = rest[len(m[0]):]
	} else if m := syslogPrefix.FindSubmatch(rest); m != nil {
		rest = rest[len(m[0]):]
	}
	if m := journalHost.FindSubmatch(rest); m != nil {
		rest = rest[len(m[0]):]
	}
	rec.Message = rest
	return rec, hasTime, false
}

var (
	rawRecord     = regexp.MustCompile(`^\d{1,4},\d+,\d+,[^;]*;`)
	dictLine      = regexp.MustCompile(`^ [A-Z][A-Z0-9_]*=`)
	prioPrefix    = regexp.MustCompile(`^<(\d{1,4})>`)
	secondsPrefix = regexp.MustCompile(`^\[\s*(\d+\.\d+)\]\s?`)
	syslogPrefix  = regexp.MustCompile(`^[A-Z][a-z]{2} [ 0-3]\d \d\d:\d\d:\d\d `)
	journalHost   = regexp.MustCompile(`^\S+ kernel: `)
)

// Action is what the daemon would do for a kernel line (replay output).
type Action struct {
	Kind    string `json:"kind"`
	Type    string `json:"type,omitempty"`
	Status  string `json:"status,omitempty"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// MarshalJSON writes exactly the fields of the kind, in the documented order.
func (a Action) MarshalJSON() ([]byte, error) {
	if a.Kind == "condition" {
		return json.Marshal(struct {
			Kind    string `json:"kind"`
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}{a.Kind, a.Type, a.Status, a.Reason, a.Message})
	}
	return json.Marshal(struct {
		Kind    string `json:"kind"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}{a.Kind, a.Reason, a.Message})
}

// actionRecorder turns store changes into actions.
type actionRecorder struct{ out func(Action) }

func (a actionRecorder) ConditionChanged(prev *report.Condition, cur report.Condition) {
	if cur.Status != report.StatusTrue || (prev != nil && prev.Status == report.StatusTrue && prev.Reason == cur.Reason && prev.Message == cur.Message) {
		return
	}
	a.out(Action{Kind: "condition", Type: cur.Type, Status: string(cur.Status), Reason: string(cur.Reason), Message: cur.Message})
}
func (actionRecorder) ConditionRestored(report.Condition) {}
func (a actionRecorder) EventEmitted(e report.Event) {
	a.out(Action{Kind: "event", Reason: e.Reason, Message: e.Message})
}

// ReplayStats counts what a replay read.
type ReplayStats struct {
	Lines, Skipped, Matched int
}

// Replay feeds captured kernel lines to a monitor built for them (one that
// has not started, with a store of its own; the daemon builds it with the
// same rules as it runs) and calls out for every action. Time windows use
// the input's timestamps, from kernel time 0; lines without one count as
// happening at the last timestamp seen.
func Replay(r io.Reader, mon *Monitor, out func(Action)) (ReplayStats, error) {
	var st ReplayStats
	base := time.Unix(0, 0).UTC()
	mon.Start(base, base)
	mon.o.Store.Observe(actionRecorder{out: func(a Action) { st.Matched++; out(a) }})
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	var lastUsec uint64
	for sc.Scan() {
		st.Lines++
		rec, hasTime, skip := ParseLine(sc.Bytes())
		if skip {
			st.Skipped++
			continue
		}
		if hasTime {
			lastUsec = max(lastUsec, rec.Usec)
		}
		rec.Usec = lastUsec
		mon.Handle(rec, base.Add(time.Duration(rec.Usec)*time.Microsecond))
	}
	if err := sc.Err(); err != nil {
		return st, fmt.Errorf("reading input: %w", err)
	}
	return st, nil
}
