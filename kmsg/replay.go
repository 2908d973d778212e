package kmsg

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"time"

	"github.com/syself/autopilot-health/internal/textenc"
	"github.com/syself/autopilot-health/report"
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
	// Forms lists the forms read (see Form), in the order first seen.
	Forms []Form
	// Unknown counts the lines in no known form; FirstUnknown is the
	// first of them ("line N: ...", shortened).
	Unknown      int
	FirstUnknown string
}

// Replay feeds captured kernel lines to a monitor built for them (one that
// has not started, with a store of its own; the daemon builds it with the
// same rules as it runs) and calls out for every action. Time windows use
// the input's timestamps (kernel time from 0, or wall time; dmesg's
// reltime and delta add up); lines without one count as happening at the
// last timestamp seen.
//
// Bare messages (dmesg -t, journalctl -o cat) are expected when the first
// kernel line is one; otherwise a line in no known form is counted as
// Unknown, not matched, except an indented line after a prefixed one,
// which continues a multi-line record: joined to its message (as the
// kernel's record has it), and counted skipped. A first line that
// begins like a time or priority of no known form is Unknown too, and so
// is a line longer than maxLine (it does not end the replay).
func Replay(r io.Reader, mon *Monitor, out func(Action)) (ReplayStats, error) {
	var st ReplayStats
	base := time.Unix(0, 0).UTC()
	mon.Start(base, base)
	mon.o.Store.Observe(actionRecorder{out: func(a Action) { st.Matched++; out(a) }})
	br := bufio.NewReaderSize(r, 64*1024)
	// A byte order mark an editor wrote: UTF-8's is dropped (left on,
	// the first line is no known form's, and the capture is read as bare
	// messages that match nothing); UTF-16 and UTF-32 are refused, naming
	// them, and so is UTF-16's mark before text that is not UTF-16.
	// The input's first 4 bytes are waited for, and more only after
	// UTF-16's mark (a pipe, dmesg -w, is read as it comes).
	if b, _ := br.Peek(4); bytes.HasPrefix(b, []byte("\xef\xbb\xbf")) {
		br.Discard(3)
	} else if err := foreignByteOrderMark(b); err != nil {
		if err == errNotUTF16 {
			b, _ = br.Peek(br.Size())
			err = foreignByteOrderMark(b)
		}
		return st, err
	}
	lr := lineReader{r: br}
	var lastUsec uint64
	const (
		undecided = iota
		prefixed
		bare
	)
	mode := undecided
	// pend is the last prefixed line's record, handled once the next line
	// is not one of its continuations (dmesg and journalctl print a
	// record's later lines indented): they are joined to its message as
	// the kernel's record has them, so that a rule over several lines
	// (GpuFallenOffBus's three) matches as in the daemon. pendMsg owns the
	// message (the line's buffer is reused).
	var pend Record
	var pendMsg []byte
	havePend := false
	handlePend := func() {
		if havePend {
			pend.Message = pendMsg
			mon.Handle(pend, base.Add(time.Duration(pend.Usec)*time.Microsecond))
			havePend = false
		}
	}
	unknown := func(line []byte) {
		st.Unknown++
		if st.FirstUnknown == "" {
			if len(line) > 120 {
				line = append(line[:120:120], "..."...)
			}
			st.FirstUnknown = fmt.Sprintf("line %d: %q", st.Lines, line)
		}
	}
	for {
		b, long, err := lr.next()
		if err != nil {
			return st, fmt.Errorf("reading input: %w", err)
		}
		if b == nil {
			handlePend()
			break
		}
		st.Lines++
		if long {
			// Longer than any kernel record: no form, not matched.
			handlePend()
			unknown(b)
			continue
		}
		l := ParseLine(b)
		if l.Skip {
			st.Skipped++
			continue
		}
		if mode == undecided {
			// A journal form that prints an entry's fields or frames its
			// JSON: every line of it would be a bare message that no rule
			// matches (0 actions, as a healthy node's).
			if f := unreadForm(b); f != "" {
				return st, fmt.Errorf("the input is %s's output, which kmsg replay does not read: capture the kernel log with journalctl -k -o json (or -o short-monotonic), or dmesg", f)
			}
		}
		switch {
		case l.Prefixed:
			if mode == undecided {
				mode = prefixed
			}
		case mode == prefixed:
			if b[0] == ' ' || b[0] == '\t' {
				st.Skipped++ // a continuation line, not a record
				if havePend && len(pendMsg) < BufSize {
					// The kernel's escape of the newline, as the
					// record's message has it (Handle decodes it); a
					// CRLF capture's \r is not the record's.
					pendMsg = append(append(pendMsg, `\x0a`...), bytes.TrimRight(bytes.TrimLeft(b, " \t"), "\r")...)
				}
			} else {
				handlePend() // the indented lines after this one are not its
				unknown(b)
			}
			continue
		case mode == undecided && l.LooksPrefixed:
			unknown(b)
			continue
		case mode == undecided:
			mode = bare
		}
		if !slices.Contains(st.Forms, l.Form) {
			st.Forms = append(st.Forms, l.Form)
		}
		switch l.Time {
		case Monotonic, Wall:
			lastUsec = min(max(lastUsec, l.Usec), maxUsec)
		case Delta:
			lastUsec += min(l.Usec, maxUsec-lastUsec)
		}
		l.Usec = lastUsec
		handlePend()
		if mode == prefixed {
			pend, havePend = l.Record, true
			pendMsg = append(pendMsg[:0], l.Message...)
			continue
		}
		mon.Handle(l.Record, base.Add(time.Duration(l.Usec)*time.Microsecond))
	}
	return st, nil
}

// journalctl's forms that replay does not read, by their first line:
// export's first field (the cursor; every field KEY=value on a line of its
// own, a binary one's length in 8 bytes), verbose's entry header ("Sun
// 2026-12-06 19:54:07.740908 UTC [s=...", its fields indented below),
// json-seq's record separator, json-sse's "data: " and json-pretty's "{"
// alone on its line (each field on a line of its own below it).
var (
	journalExport  = regexp.MustCompile(`^__(CURSOR|REALTIME_TIMESTAMP|MONOTONIC_TIMESTAMP|SEQNUM|SEQNUM_ID)=`)
	journalVerbose = regexp.MustCompile(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} \S+ \[s=`)
)

// unreadForm names the journalctl form of a first line replay does not
// read, or returns "".
func unreadForm(b []byte) string {
	switch {
	case journalExport.Match(b):
		return "journalctl -o export"
	case journalVerbose.Match(b):
		return "journalctl -o verbose"
	case bytes.HasPrefix(b, []byte("\x1e{")):
		return "journalctl -o json-seq"
	case bytes.HasPrefix(b, []byte("data: {")):
		return "journalctl -o json-sse"
	case string(bytes.TrimRight(b, "\r")) == "{":
		return "journalctl -o json-pretty"
	}
	return ""
}

// foreignByteOrderMark refuses an input that starts with UTF-16's or
// UTF-32's byte order mark, which no form of the kernel log is (nil for any
// other), told by textenc.ForeignMark as config tells a file's (start is
// the input's first 64 KiB after UTF-16's mark).
func foreignByteOrderMark(start []byte) error {
	m, ok := textenc.ForeignMark(start)
	switch {
	case !ok:
		return nil
	case m.Encoding == "UTF-32":
		return errUTF32
	case m.NotUTF16:
		return errNotUTF16
	}
	return errUTF16
}

var (
	errUTF16    = errors.New("the input is UTF-16 (its byte order mark): convert it first, e.g. iconv -f UTF-16 -t UTF-8")
	errUTF32    = errors.New("the input is UTF-32 (its byte order mark): convert it first, e.g. iconv -f UTF-32 -t UTF-8")
	errNotUTF16 = errors.New("the input starts with UTF-16's byte order mark but is not UTF-16 (no NUL byte): remove the mark's two bytes, e.g. tail -c +3")
)

// maxLine is the longest line Replay parses (a kernel record is at most
// about 1 KiB, a journal JSON record a few); a longer one is read to its
// end, kept to its first maxLine bytes and counted as unknown.
const maxLine = 1 << 20

// lineReader reads lines of any length without holding more than maxLine
// bytes of one.
type lineReader struct {
	r   *bufio.Reader
	buf []byte
}

// next returns the next line without its newline (nil at the end of the
// input) and whether it was longer than maxLine.
func (lr *lineReader) next() (line []byte, long bool, err error) {
	lr.buf = lr.buf[:0]
	n := 0 // the line's length, its newline included
	for {
		frag, err := lr.r.ReadSlice('\n')
		n += len(frag)
		if room := maxLine + 1 - len(lr.buf); room > 0 {
			lr.buf = append(lr.buf, frag[:min(len(frag), room)]...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil && err != io.EOF {
			return nil, false, err
		}
		if n == 0 {
			return nil, false, nil // the end of the input
		}
		if bytes.HasSuffix(frag, []byte("\n")) {
			n--
		}
		if n > maxLine {
			return lr.buf[:maxLine], true, nil
		}
		return lr.buf[:n], false, nil
	}
}

// maxUsec keeps a replayed time within time.Duration.
const maxUsec = math.MaxInt64 / 1000
