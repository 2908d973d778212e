package kmsg

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"time"
)

// Form names the form a captured kernel line is in: the command that
// printed it.
type Form string

// The forms ParseLine reads. A "dmesg" form also reads dmesg -x's
// "facility:level :" prefix (the name gains " -x").
const (
	FormUnknown         Form = ""
	FormBare            Form = "message only (dmesg -t, journalctl -o cat)"
	FormKmsg            Form = "/dev/kmsg"
	FormDmesg           Form = "dmesg"
	FormDmesgRaw        Form = "dmesg -r"
	FormDmesgCtime      Form = "dmesg -T"
	FormDmesgISO        Form = "dmesg --time-format iso"
	FormDmesgReltime    Form = "dmesg --time-format reltime"
	FormDmesgDelta      Form = "dmesg --time-format delta"
	FormJournalShort    Form = "journalctl -o short"
	FormJournalISO      Form = "journalctl -o short-iso"
	FormJournalPrecise  Form = "journalctl -o short-precise"
	FormJournalMono     Form = "journalctl -o short-monotonic"
	FormJournalDelta    Form = "journalctl -o short-delta"
	FormJournalFull     Form = "journalctl -o short-full"
	FormJournalISOPrec  Form = "journalctl -o short-iso-precise"
	FormJournalUnix     Form = "journalctl -o short-unix"
	FormJournalJSON     Form = "journalctl -o json"
	formJournalSeparate Form = "journalctl" // "-- Boot ... --" and the like
)

// TimeKind says what a parsed line's Usec holds.
type TimeKind uint8

const (
	// NoTime: the line carried no time.
	NoTime TimeKind = iota
	// Monotonic: kernel time since boot.
	Monotonic
	// Wall: wall-clock time, microseconds since the Unix epoch (a form
	// without a year counts from 1970; only differences matter).
	Wall
	// Delta: time since the previous line (dmesg's reltime and delta).
	Delta
)

// Line is one parsed line of captured kernel log.
type Line struct {
	// Record holds the message, the time (in Usec, per Time) and, where
	// the form shows it, the facility and level.
	Record
	Form Form
	Time TimeKind
	// Skip is set for a line that is not a kernel message: blank, a raw
	// record's " KEY=value" dictionary line, journalctl's "-- Boot ... --".
	Skip bool
	// Prefixed: the line had a prefix of a known form (not a bare
	// message).
	Prefixed bool
	// LooksPrefixed: a bare line that begins like a time or priority
	// prefix of no known form (a replay counts it as an unknown format
	// unless the input is bare messages).
	LooksPrefixed bool
}

var (
	rawRecord  = regexp.MustCompile(`^\d{1,4},\d+,\d+,[^;]*;`)
	dictLine   = regexp.MustCompile(`^ [A-Z][A-Z0-9_]*=`)
	journalSep = regexp.MustCompile(`^-- .* --$`)
	// dmesg -x: "kern  :info  : ".
	dmesgFacLevel = regexp.MustCompile(`^([a-z]+) *:([a-z]+) *: `)
	prioPrefix    = regexp.MustCompile(`^<(\d{1,4})>`)
	// "[ 9595.061701] ", dmesg's default and journalctl -o short-monotonic.
	secondsPrefix = regexp.MustCompile(`^\[\s*(\d+\.\d+)\] ?`)
	// dmesg -T: "[Wed Dec  2 19:07:01 2026] ".
	ctimePrefix = regexp.MustCompile(`^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ 0-3]\d \d\d:\d\d:\d\d \d{4})\] ?`)
	// dmesg --time-format iso: "2026-12-02T19:07:01,061701+00:00 ".
	isoPrefix = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d),(\d{6})([+-]\d\d:\d\d) `)
	// dmesg --time-format reltime: "[Dec 2 19:07] " at a new minute, else
	// "[  +0.004073] "; delta: "[<    0.004073>] ".
	reltimeMinute = regexp.MustCompile(`^\[((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ 0-3]?\d \d\d:\d\d)\] ?`)
	reltimeDelta  = regexp.MustCompile(`^\[\s*\+(\d+\.\d+)\] ?`)
	deltaPrefix   = regexp.MustCompile(`^\[<\s*(\d+\.\d+)>\] ?`)
	// journalctl -o short*: the time, then "host ident: " (host absent
	// with --no-hostname); the ident of a kernel record is "kernel", of
	// one user space wrote to /dev/kmsg its syslog tag or "unknown".
	journalShort = regexp.MustCompile(`^((?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ 0-3]\d \d\d:\d\d:\d\d)(\.\d{6})? `)
	journalISO   = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{6})?([+-]\d{4}) `)
	journalFull  = regexp.MustCompile(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \S+ `)
	journalUnix  = regexp.MustCompile(`^(\d{9,11}\.\d{6}) `)
	journalIdent = regexp.MustCompile(`^(?:[^\s:]+ )?[^\s:\[]+(?:\[\d+\])?: `)
	// journalctl -o short-delta: short-monotonic's time and the time since
	// the entry before, "[51494.298964 <    0.003653 >] ", the first
	// entry's padded with spaces in its place, "[51476.597414       ] ".
	journalDelta      = regexp.MustCompile(`^\[\s*(\d+\.\d{6})(?: <\s*\d+\.\d{6} >| +)\] `)
	journalMonoIdent  = regexp.MustCompile(`^(?:[^\s:]+ )?(?:kernel|unknown|[^\s:\[]+\[\d+\]): `)
	looksLikeAPrefix  = regexp.MustCompile(`^(?:<\d|\{|\d{4}-\d\d-\d\d|\d+[.:,]\d+|(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun|Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ 0-3]?\d\b|\[\s*[+<]?\d|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun|Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) )`)
	syslogFacilities  = map[string]uint8{"kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7, "uucp": 8, "cron": 9, "authpriv": 10, "ftp": 11, "local0": 16, "local1": 17, "local2": 18, "local3": 19, "local4": 20, "local5": 21, "local6": 22, "local7": 23}
	syslogLevels      = map[string]uint8{"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}
	errNotJournalJSON = strconv.ErrSyntax
)

// ParseLine reads one line of captured kernel log in any form ParseLine
// knows (see Form): raw /dev/kmsg records, dmesg with each of its time
// formats (with or without -x and -r), journalctl -k in each -o short*
// format and -o json, or a bare message. A line that has none of the
// known prefixes is a bare message (Form FormBare); whether that is
// expected is the caller's to judge (see Replay). It never fails.
func ParseLine(b []byte) Line {
	var l Line
	b = bytes.TrimRight(b, "\r\n")
	if len(bytes.TrimSpace(b)) == 0 || dictLine.Match(b) {
		l.Skip = true
		return l
	}
	if journalSep.Match(b) {
		l.Skip, l.Form = true, formJournalSeparate
		return l
	}
	if rawRecord.Match(b) {
		if r, err := ParseRecord(b); err == nil {
			l.Record, l.Form, l.Time, l.Prefixed = r, FormKmsg, Monotonic, true
			return l
		}
	}
	if b[0] == '{' {
		if parseJournalJSON(b, &l) == nil {
			return l
		}
	}
	rest := b
	x := false
	if m := dmesgFacLevel.FindSubmatch(rest); m != nil {
		f, fok := syslogFacilities[string(m[1])]
		v, vok := syslogLevels[string(m[2])]
		if fok && vok {
			l.Facility, l.Level, x = f, v, true
			rest = rest[len(m[0]):]
		}
	}
	raw := false
	if m := prioPrefix.FindSubmatch(rest); m != nil {
		p, _ := strconv.Atoi(string(m[1]))
		l.Facility, l.Level, raw = uint8(p>>3), uint8(p&7), true
		rest = rest[len(m[0]):]
	}
	if !x && !raw {
		// journalctl -o short-delta: the time, then "host ident: ".
		if m := journalDelta.FindSubmatch(rest); m != nil {
			if id := journalMonoIdent.Find(rest[len(m[0]):]); id != nil {
				if usec, ok := parseSeconds(m[1]); ok {
					l.Usec, l.Time, l.Form, l.Prefixed = usec, Monotonic, FormJournalDelta, true
					l.Message = rest[len(m[0])+len(id):]
					return l
				}
			}
		}
	}
	form, ok := dmesgTime(&l, &rest)
	if ok {
		if raw && form == FormDmesg {
			form = FormDmesgRaw
		}
		if form == FormDmesg {
			// journalctl -o short-monotonic: the same time, then "host ident: ".
			if m := journalMonoIdent.Find(rest); m != nil && !x && !raw {
				form = FormJournalMono
				rest = rest[len(m):]
			}
		}
		if x {
			form += " -x"
		}
		l.Form, l.Prefixed, l.Message = form, true, rest
		return l
	}
	if !x && !raw {
		if form, ok := journalTime(&l, &rest); ok {
			if m := journalIdent.Find(rest); m != nil {
				l.Form, l.Prefixed, l.Message = form, true, rest[len(m):]
				return l
			}
			l.Time, l.Usec = NoTime, 0
			rest = b
		}
	}
	if x || raw {
		// A dmesg prefix without a time (dmesg -x -t, dmesg -r -t).
		l.Form, l.Prefixed, l.Message = FormDmesg, true, rest
		if x {
			l.Form += " -x"
		}
		if raw {
			l.Form = FormDmesgRaw
		}
		return l
	}
	l.Form, l.Message = FormBare, rest
	l.LooksPrefixed = looksLikeAPrefix.Match(rest)
	return l
}

// dmesgTime strips a dmesg time prefix from *rest.
func dmesgTime(l *Line, rest *[]byte) (Form, bool) {
	r := *rest
	if m := secondsPrefix.FindSubmatch(r); m != nil {
		usec, ok := parseSeconds(m[1])
		if !ok {
			return "", false
		}
		l.Usec, l.Time, *rest = usec, Monotonic, r[len(m[0]):]
		return FormDmesg, true
	}
	if m := ctimePrefix.FindSubmatch(r); m != nil {
		t, err := time.Parse("Mon Jan _2 15:04:05 2006", string(m[1]))
		if err != nil {
			return "", false
		}
		setWall(l, t)
		*rest = r[len(m[0]):]
		return FormDmesgCtime, true
	}
	if m := isoPrefix.FindSubmatch(r); m != nil {
		t, err := time.Parse("2006-01-02T15:04:05.000000-07:00", string(m[1])+"."+string(m[2])+string(m[3]))
		if err != nil {
			return "", false
		}
		setWall(l, t)
		*rest = r[len(m[0]):]
		return FormDmesgISO, true
	}
	if m := reltimeMinute.FindSubmatch(r); m != nil {
		t, err := time.Parse("Jan 2 15:04", string(bytes.Replace(m[1], []byte("  "), []byte(" "), 1)))
		if err != nil {
			return "", false
		}
		setWall(l, t.AddDate(1970, 0, 0))
		*rest = r[len(m[0]):]
		return FormDmesgReltime, true
	}
	for _, p := range []struct {
		re   *regexp.Regexp
		form Form
	}{{reltimeDelta, FormDmesgReltime}, {deltaPrefix, FormDmesgDelta}} {
		if m := p.re.FindSubmatch(r); m != nil {
			usec, ok := parseSeconds(m[1])
			if !ok {
				return "", false
			}
			l.Usec, l.Time, *rest = usec, Delta, r[len(m[0]):]
			return p.form, true
		}
	}
	return "", false
}

// journalTime strips a journalctl -o short* time (not short-monotonic,
// which dmesgTime reads) from *rest.
func journalTime(l *Line, rest *[]byte) (Form, bool) {
	r := *rest
	if m := journalShort.FindSubmatch(r); m != nil {
		t, err := time.Parse("Jan _2 15:04:05", string(m[1]))
		if err != nil {
			return "", false
		}
		form := FormJournalShort
		if len(m[2]) > 0 {
			form = FormJournalPrecise
			us, _ := strconv.Atoi(string(m[2][1:]))
			t = t.Add(time.Duration(us) * time.Microsecond)
		}
		setWall(l, t.AddDate(1970, 0, 0))
		*rest = r[len(m[0]):]
		return form, true
	}
	if m := journalISO.FindSubmatch(r); m != nil {
		t, err := time.Parse("2006-01-02T15:04:05-0700", string(m[1])+string(m[3]))
		if err != nil {
			return "", false
		}
		form := FormJournalISO
		if len(m[2]) > 0 {
			form = FormJournalISOPrec
			us, _ := strconv.Atoi(string(m[2][1:]))
			t = t.Add(time.Duration(us) * time.Microsecond)
		}
		setWall(l, t)
		*rest = r[len(m[0]):]
		return form, true
	}
	if m := journalFull.FindSubmatch(r); m != nil {
		// The zone is an abbreviation (UTC, CET): only differences
		// matter, so it is read as UTC.
		t, err := time.Parse("2006-01-02 15:04:05", string(m[1]))
		if err != nil {
			return "", false
		}
		setWall(l, t)
		*rest = r[len(m[0]):]
		return FormJournalFull, true
	}
	if m := journalUnix.FindSubmatch(r); m != nil {
		usec, ok := parseSeconds(m[1])
		if !ok {
			return "", false
		}
		l.Usec, l.Time, *rest = usec, Wall, r[len(m[0]):]
		return FormJournalUnix, true
	}
	return "", false
}

func setWall(l *Line, t time.Time) {
	l.Time = Wall
	if us := t.UnixMicro(); us > 0 {
		l.Usec = uint64(us)
	}
}

// parseSeconds reads "seconds.fraction" as microseconds.
func parseSeconds(b []byte) (uint64, bool) {
	dot := bytes.IndexByte(b, '.')
	if dot < 0 {
		return 0, false
	}
	s, ok := parseUint(b[:dot])
	if !ok || s > math.MaxInt64/1000000 {
		return 0, false
	}
	frac := b[dot+1:]
	if len(frac) > 6 {
		frac = frac[:6]
	}
	f, ok := parseUint(frac)
	if !ok && len(frac) > 0 {
		return 0, false
	}
	for i := len(frac); i < 6; i++ {
		f *= 10
	}
	return s*1e6 + f, true
}

// journalEntry is what a replay uses of journalctl -o json's entry.
type journalEntry struct {
	Message   json.RawMessage `json:"MESSAGE"`
	Monotonic string          `json:"_SOURCE_MONOTONIC_TIMESTAMP"`
	Realtime  string          `json:"__REALTIME_TIMESTAMP"`
	Priority  string          `json:"PRIORITY"`
	Facility  string          `json:"SYSLOG_FACILITY"`
}

// parseJournalJSON reads one journalctl -o json entry. MESSAGE is a
// string, or an array of bytes when it is not valid UTF-8.
func parseJournalJSON(b []byte, l *Line) error {
	var e journalEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return err
	}
	if len(e.Message) == 0 {
		return errNotJournalJSON
	}
	var s string
	if err := json.Unmarshal(e.Message, &s); err == nil {
		l.Message = []byte(s)
	} else {
		var ints []int
		if err := json.Unmarshal(e.Message, &ints); err != nil {
			return err
		}
		bs := make([]byte, len(ints))
		for i, v := range ints {
			if v < 0 || v > 255 {
				return errNotJournalJSON
			}
			bs[i] = byte(v)
		}
		l.Message = bs
	}
	l.Form, l.Prefixed = FormJournalJSON, true
	if us, ok := parseUint([]byte(e.Monotonic)); ok {
		l.Usec, l.Time = us, Monotonic
	} else if us, ok := parseUint([]byte(e.Realtime)); ok {
		l.Usec, l.Time = us, Wall
	}
	if p, ok := parseUint([]byte(e.Priority)); ok && p < 8 {
		l.Level = uint8(p)
	}
	if f, ok := parseUint([]byte(e.Facility)); ok && f < 128 {
		l.Facility = uint8(f)
	}
	return nil
}
