package config

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The bounds of a configuration file's shape, checked by a lexical scan
// before the file is decoded. The TOML decoder, and keyLines, cost the
// square of a value's nesting and of a dotted key's parts: a 40 KB file of
// 10,000 nested inline tables took 20-53 s and 4 GB to refuse, one dotted
// key of 10,000 parts 9-13 s and 1.4 GB, and a start or a reload reads the
// file. Each bound is far above any valid file: the configuration's deepest
// value is 3 levels (checks = { Name = { list = [...] } }), its longest key
// 3 parts and 58 bytes. A key is bounded by its full name (its table's and
// its enclosing inline tables' keys included): the decoder copies that name
// for every key, so a 1 MiB file of keys under a header of 32 parts and
// 1 KiB took 7 s and 1 GB; under one of 15 parts and 240 bytes it takes
// 0.9 s and 330 MB, three times a file of as many keys under no header.
const (
	// MaxNesting is how deep arrays and inline tables may be nested.
	MaxNesting = 32
	// MaxKeyParts is how many parts a key's full name or a table header
	// may have.
	MaxKeyParts = 16
	// MaxKeyBytes is how long a key's full name or a table header may
	// be, as written.
	MaxKeyBytes = 256
)

// limits are the bounds a scan checks (the tests use smaller ones).
type limits struct{ nesting, parts, keyBytes int }

var fileLimits = limits{nesting: MaxNesting, parts: MaxKeyParts, keyBytes: MaxKeyBytes}

// CheckBounds refuses a file whose shape is over a bound (MaxNesting,
// MaxKeyParts, MaxKeyBytes) with an *Error naming file, line and key, in
// time linear in the file's size; nil when it is within them. Parse checks
// it first; a reader of a file that does not load (reload's socket keys)
// checks it before it decodes the file itself.
func CheckBounds(file string, data []byte) error {
	if err := checkBounds(file, data, fileLimits); err != nil {
		return err
	}
	return nil
}

// checkBounds scans data as TOML's lexer does, as far as the bounds need:
// strings (basic and literal, single- and multi-line, with escapes),
// comments, table headers, keys (dotted, quoted), and the arrays and inline
// tables of values. It reads every byte once. A file that is not TOML is
// scanned as far as it reads as TOML; the decoder refuses it afterwards.
func checkBounds(file string, data []byte, lim limits) *Error {
	err, _ := scanBounds(file, data, lim)
	return err
}

// scanBounds is checkBounds, with where the statement (a table header, or
// a key and its value) that it refuses begins in data: what comes before
// is whole statements within the bounds.
func scanBounds(file string, data []byte, lim limits) (*Error, int) {
	s := boundScan{data: data, line: 1, lim: lim, file: file}
	err := s.run()
	return err, s.stmt
}

type boundScan struct {
	data  []byte
	i     int
	line  int
	lim   limits
	file  string
	stack []frame // the open arrays and inline tables of a value
	table name    // the table header in effect
	key   name    // the top-level key of the value being read, with its table
	// Where the table header and the top-level key are written in data.
	tableAt, keyAt [2]int
	// stmt is where the statement being read began, a table header or a
	// top-level key (its value included).
	stmt int
}

// name is the size of a key's full name as written, its table's and its
// enclosing inline tables' keys included: its length and parts. The scan
// builds no name (which would cost a table's name per key): an error
// names the key from where it is written.
type name struct{ len, parts int }

// child is the name of key under n.
func (n name) child(key name) name {
	if n.parts == 0 {
		return key
	}
	return name{len: n.len + 1 + key.len, parts: n.parts + key.parts}
}

// frame is an open array ('[') or inline table ('{') of a value.
type frame struct {
	c    byte
	name name // the array's or inline table's
	last name // an inline table's key whose value is being read
}

func (s *boundScan) run() *Error {
	const (
		lineStart = iota // at depth 0, before a header or a key
		value            // in a value (or after a header), depth any
		inlineKey        // in an inline table, before its next key
	)
	mode := lineStart
	for s.i < len(s.data) {
		c := s.data[s.i]
		switch {
		case c == '\n':
			s.line++
			s.i++
			if mode == value && len(s.stack) == 0 {
				mode = lineStart
			}
			continue
		case c == ' ' || c == '\t' || c == '\r':
			s.i++
			continue
		case c == '#':
			s.skipComment()
			continue
		}
		switch mode {
		case lineStart:
			s.stmt = s.i
			header := c == '['
			if header {
				s.i++
				if s.i < len(s.data) && s.data[s.i] == '[' {
					s.i++
				}
				at := s.i
				n, stop, err := s.readKey(true, name{}, "")
				if err != nil {
					return err
				}
				s.table, s.key = n, name{}
				s.tableAt, s.keyAt = [2]int{at, s.i}, [2]int{}
				if stop == ']' {
					s.i++
				}
			} else {
				at := s.i
				n, stop, err := s.readKey(false, s.table, s.written(s.tableAt))
				if err != nil {
					return err
				}
				s.key = s.table.child(n)
				s.keyAt = [2]int{at, s.i}
				if stop == '=' {
					s.i++
				}
			}
			mode = value
		case value:
			switch c {
			case '"', '\'':
				s.skipString(true)
			case '[', '{':
				f := frame{c: c, name: s.valueName()}
				s.stack = append(s.stack, f)
				s.i++
				if len(s.stack) > s.lim.nesting {
					return s.errorAt(s.line, s.keyName(), "arrays and inline tables nested more than %d deep: not read (a configuration's deepest value is 3 levels)", s.lim.nesting)
				}
				if c == '{' {
					mode = inlineKey
				}
			case ']', '}':
				if len(s.stack) > 0 {
					s.stack = s.stack[:len(s.stack)-1]
				}
				s.i++
			case ',':
				if top := s.top(); top != nil && top.c == '{' {
					mode = inlineKey
				}
				s.i++
			default:
				s.i++
			}
		case inlineKey:
			if c == '}' {
				// An empty inline table, or a trailing comma.
				mode = value
				continue
			}
			top := s.top()
			n, stop, err := s.readKey(false, top.name, s.keyName())
			if err != nil {
				return err
			}
			top.last = n
			if stop == '=' {
				s.i++
			}
			mode = value
		}
	}
	return nil
}

func (s *boundScan) top() *frame {
	if len(s.stack) == 0 {
		return nil
	}
	return &s.stack[len(s.stack)-1]
}

// valueName is the full name of the value an array or inline table opens.
func (s *boundScan) valueName() name {
	switch top := s.top(); {
	case top == nil:
		return s.key
	case top.c == '[':
		return top.name
	default:
		return top.name.child(top.last)
	}
}

// readKey reads a key (header: a table header's name) under base from
// s.i up to what ends it, '=' (']' for a header), which it leaves unread,
// as does a line's end, a comment or an inline table's '}'. It returns the
// key as written (its own part of the name) and what stopped it (0 at the
// end of the file), and refuses a key whose full name is over the bounds
// as soon as it is.
// prefix names base in an error.
func (s *boundScan) readKey(header bool, base name, prefix string) (name, byte, *Error) {
	start, end, parts := -1, -1, 1
	line := s.line
	what, with := "key", " with its table's"
	if header {
		what, with = "table header", ""
	}
	sep := 0
	if base.parts > 0 {
		sep = 1
	}
	for s.i < len(s.data) {
		c := s.data[s.i]
		switch {
		case c == '=' && !header, c == ']' && header, c == '\n', c == '#', c == '}' && !header:
			if start < 0 {
				return name{}, c, nil
			}
			return name{len: end - start, parts: parts}, c, nil
		case c == ' ' || c == '\t' || c == '\r':
			s.i++
			continue
		case c == '"' || c == '\'':
			if start < 0 {
				start = s.i
			}
			s.skipString(false)
		case c == '.':
			if start < 0 {
				start = s.i
			}
			parts++
			s.i++
			if base.parts+parts > s.lim.parts {
				return name{}, 0, s.errorAt(line, s.cut(prefix, start), "a %s of more than %d dotted parts%s: not read (a configuration's keys have at most 3)", what, s.lim.parts, with)
			}
		default:
			if start < 0 {
				start = s.i
			}
			s.i++
		}
		end = s.i
		if base.len+sep+end-start > s.lim.keyBytes {
			return name{}, 0, s.errorAt(line, s.cut(prefix, start), "a %s longer than %d bytes%s: not read (a configuration's longest key is 58)", what, s.lim.keyBytes, with)
		}
	}
	if start < 0 {
		return name{}, 0, nil
	}
	return name{len: end - start, parts: parts}, 0, nil
}

// written is what data holds at, a key's place, without the blanks
// around it and a header's brackets.
func (s *boundScan) written(at [2]int) string {
	b := bytes.TrimSpace(s.data[at[0]:at[1]])
	b = bytes.TrimRight(b, "]=")
	return string(bytes.TrimSpace(b))
}

// cut names a key too long to be named whole: the start of its full name,
// prefix (its table's, as written) and then its own from start.
func (s *boundScan) cut(prefix string, start int) string {
	const n = 40
	if prefix != "" && !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	b := []byte(prefix + string(s.data[start:min(start+n, s.i)]))
	b = b[:min(n, len(b))]
	for len(b) > 0 && !utf8.Valid(b) {
		b = b[:len(b)-1]
	}
	return string(b) + "..."
}

// keyName names the top-level key whose value is being read, with its
// table, as the decoder names keys; its parts are within the bounds.
func (s *boundScan) keyName() string {
	var p []string
	if s.table.parts > 0 {
		p = append(p, splitKey(s.written(s.tableAt))...)
	}
	if s.key.parts > s.table.parts {
		p = append(p, splitKey(s.written(s.keyAt))...)
	}
	if len(p) == 0 {
		return ""
	}
	return joinKey(p)
}

// skipString skips the string whose opening quote is at s.i; multi: a
// value, where a string may be multi-line. A single-line string ends at its
// line's end, closed or not.
func (s *boundScan) skipString(multi bool) {
	q := s.data[s.i]
	if multi && s.i+2 < len(s.data) && s.data[s.i+1] == q && s.data[s.i+2] == q {
		s.i += 3
		for s.i < len(s.data) {
			c := s.data[s.i]
			switch {
			case c == '\\' && q == '"':
				s.i++
				if s.i < len(s.data) && s.data[s.i] == '\n' {
					s.line++
				}
				s.i++
			case c == q:
				n := 0
				for s.i < len(s.data) && s.data[s.i] == q {
					n++
					s.i++
				}
				if n >= 3 {
					// Up to two quotes before the closing three
					// are the string's.
					return
				}
			case c == '\n':
				s.line++
				s.i++
			default:
				s.i++
			}
		}
		return
	}
	s.i++
	for s.i < len(s.data) {
		switch c := s.data[s.i]; {
		case c == '\n':
			return
		case c == '\\' && q == '"':
			s.i++
			if s.i < len(s.data) && s.data[s.i] != '\n' {
				s.i++
			}
		case c == q:
			s.i++
			return
		default:
			s.i++
		}
	}
}

// skipComment skips a comment up to its line's end.
func (s *boundScan) skipComment() {
	for s.i < len(s.data) && s.data[s.i] != '\n' {
		s.i++
	}
}

func (s *boundScan) errorAt(line int, key, format string, args ...any) *Error {
	return &Error{File: s.file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)}
}
