package config

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The bounds of a configuration file's shape, checked by a lexical scan
// before the file is decoded (the same scan finds the keys' lines for the
// errors: scanFile). The TOML decoder costs the square of a value's
// nesting and of a dotted key's parts: a 40 KB file of
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
	s := boundScan{data: data, line: 1, lim: lim, file: file}
	return s.run()
}

// scanFile is checkBounds and keyLines in one pass over data: the index of
// the keys' lines (as far as the scan read), the refusal of a file over a
// bound, and where the statement (a table header, or a key and its value)
// it refuses begins in data: what comes before is whole statements within
// the bounds.
//
// A table defined both by a [header] and by dotted keys, which the decoder
// takes for one table, is refused too, once the file is within the bounds
// (the statement that defines it the second time begins at stmt then).
func scanFile(file string, data []byte, lim limits) (keyIndex, *Error, int) {
	s := boundScan{data: data, line: 1, lim: lim, file: file, idx: keyIndex{}}
	err := s.run()
	if err == nil && s.redef != nil {
		return s.idx, s.redef, s.redefAt
	}
	// What comes before the statement is whole statements; where the
	// statement is not TOML before the bound, up to there too (the
	// decoder stops at its first mistake, before what is over the bound).
	return s.idx, err, max(s.stmt, s.bad)
}

// keyLines finds the line of every table header, key assignment and inline
// table in an array (as key[i]), and of an array's entries (indexOpen,
// element), with no bound: the scan of checkBounds, recording. It also runs
// on a file the decoder rejects, as far as it reads as TOML. A byte order
// mark before the first line (a file saved by an editor on Windows) is
// skipped, as the decoder skips it.
func keyLines(data []byte) keyIndex {
	idx, _, _ := scanFile("", data, limits{nesting: math.MaxInt, parts: math.MaxInt, keyBytes: math.MaxInt})
	return idx
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
	// bad, where set (> 0), is just past the first place the scan found
	// the file not TOML, within a statement: a closing bracket of the
	// other kind than the open one, a single-line string its line ends
	// in (its newline included). The decoder stops there.
	bad int

	// The index of the keys' lines, when one is built (else nil), and
	// what it needs: the table header in effect by name (with an array
	// of tables' index, name[i]), that name without the index (plain),
	// the [[name]] headers seen by name, and the top-level key whose
	// value is being read by name, and by the name under its array of
	// tables (alias; "" outside one).
	idx          keyIndex
	tname, plain string
	arrays       map[string]int
	vkey, valias string
	// The tables defined so far, by a [header] or by the dotted keys
	// of a top-level statement, at their first line (tableDef), and
	// the first table defined both ways (redef, at the statement that
	// begins at redefAt): TOML defines a table once, and the decoder
	// takes the two for one.
	defs    map[string]tableDef
	redef   *Error
	redefAt int
}

// tableDef is how and where a table is first defined.
type tableDef struct {
	header bool // by a [header]; else by dotted keys
	line   int
}

// define records table t defined at line (header: by its [header]), and
// refuses it where the other way defined it before.
func (s *boundScan) define(t string, header bool, line int) {
	d, ok := s.defs[t]
	if !ok {
		s.defs[t] = tableDef{header: header, line: line}
		return
	}
	if d.header == header || s.redef != nil {
		// Two headers: the decoder refuses them.
		return
	}
	by := "the dotted key"
	if d.header {
		by = "the [" + t + "] header"
	}
	s.redef = s.errorAt(line, t, "Key '%s' has already been defined (by %s at line %d: a table is defined once, by its [header] or by dotted keys)", t, by, d.line)
	s.redefAt = s.stmt
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

	// For the index: the array's or inline table's key ("" where
	// nothing in it is named), and its key under its array of tables'
	// name (key.k besides key[i].k), or "".
	key, alias string
	line       int // the line it begins on
	// An array's: inline tables seen at its top level, elements of any
	// kind seen there, and whether the next element is yet to begin.
	elems, items int
	want         bool
	// An inline table's key whose value is being read (after its '='),
	// by name and under the alias, or "".
	val, valA string
}

// maxScanDepth is how deep in a value keys are indexed: the
// configuration's deepest is 2 (kmsg.rules = [{ k = ... }]), or one more
// written as checks = { Name = { k = ... } }. Deeper, nothing is recorded
// and no key is built (a key per level would cost the square of the
// depth of a value nested without a bound, in keyLines).
const maxScanDepth = 8

func (s *boundScan) run() *Error {
	const (
		lineStart = iota // at depth 0, before a header or a key
		value            // in a value (or after a header), depth any
		inlineKey        // in an inline table, before its next key
	)
	mode := lineStart
	// A byte order mark is not a key's; the decoder skips it.
	s.i = len(s.data) - len(bytes.TrimPrefix(s.data, []byte("\ufeff")))
	s.arrays = map[string]int{}
	s.defs = map[string]tableDef{}
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
			line := s.line
			if header {
				s.i++
				array := s.i < len(s.data) && s.data[s.i] == '['
				if array {
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
				s.indexHeader(array, line)
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
				s.indexKey(stop == '=', line)
			}
			mode = value
		case value:
			if s.idx != nil {
				s.element(c)
			}
			switch c {
			case '"', '\'':
				s.skipString(true)
			case '[', '{':
				f := frame{c: c, name: s.valueName(), line: s.line, want: c == '['}
				if s.idx != nil {
					s.indexOpen(&f)
				}
				s.stack = append(s.stack, f)
				s.i++
				if len(s.stack) > s.lim.nesting {
					return s.errorAt(s.line, s.keyName(), "arrays and inline tables nested more than %d deep: not read (a configuration's deepest value is 3 levels)", s.lim.nesting)
				}
				if c == '{' {
					mode = inlineKey
				}
			case ']', '}':
				if top := s.top(); top != nil {
					if (top.c == '[') != (c == ']') {
						s.notTOML(s.i + 1)
					}
					s.stack = s.stack[:len(s.stack)-1]
				}
				s.i++
			case ',':
				switch top := s.top(); {
				case top != nil && top.c == '{':
					mode = inlineKey
					top.val, top.valA = "", ""
				case top != nil:
					top.want = true
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
			at := s.i
			n, stop, err := s.readKey(false, top.name, s.keyName())
			if err != nil {
				return err
			}
			top.last = n
			if stop == '=' {
				if s.idx != nil && top.key != "" {
					s.indexInlineKey(top, s.written([2]int{at, s.i}))
				}
				s.i++
			}
			mode = value
		}
	}
	return nil
}

// indexHeader records a table header (array: [[name]]) read at line.
func (s *boundScan) indexHeader(array bool, line int) {
	if s.idx == nil {
		return
	}
	s.tname = joinKey(splitKey(s.written(s.tableAt)))
	s.plain = s.tname
	if array {
		// Each element as name[i]; the name alone is its first
		// element's line.
		i := s.arrays[s.tname]
		s.arrays[s.tname]++
		if i == 0 {
			s.idx[s.tname] = line
		}
		s.tname += "[" + strconv.Itoa(i) + "]"
	} else {
		s.define(s.tname, true, line)
	}
	s.idx[s.tname] = line
}

// indexKey records the top-level key read at line (assigned: its '='
// read; a key without one is not recorded), and the tables a dotted key
// defines, at the first line that names them.
func (s *boundScan) indexKey(assigned bool, line int) {
	if s.idx == nil {
		return
	}
	s.vkey, s.valias = "", ""
	if !assigned {
		return
	}
	parts := splitKey(s.written(s.keyAt))
	key := joinKey(parts)
	if s.tname != s.plain {
		// In an array of tables: also under the array's name, at the
		// first element that has the key.
		s.valias = s.plain + "." + key
		s.idx.setFirst(s.valias, line)
	}
	for i := 1; i < len(parts); i++ {
		t := s.under(joinKey(parts[:i]))
		s.idx.setFirst(t, line)
		s.define(t, false, line)
	}
	s.vkey = s.under(key)
	s.idx[s.vkey] = line
}

// under is key under the table header in effect.
func (s *boundScan) under(key string) string {
	if s.tname == "" {
		return key
	}
	return s.tname + "." + key
}

// element records, where c (not a blank) begins an element of the array
// being read, the element's line: an inline table's (key[i]) as
// indexOpen does; another kind's only in an array of plain values (no
// inline table in it) and on a line after the array's own, so that an
// error about one entry of a multi-line list names its line (one on the
// array's line has it already).
func (s *boundScan) element(c byte) {
	top := s.top()
	if top == nil || top.c != '[' || !top.want || c == ',' || c == ']' {
		return
	}
	top.want = false
	if c != '{' && top.elems == 0 && s.line != top.line && top.key != "" {
		s.idx.setFirst(top.key+"["+strconv.Itoa(top.items)+"]", s.line)
	}
	top.items++
}

// indexOpen names the array or inline table f that opens in the value
// being read: at the top, the value's key; in an inline table, its key
// whose value it is; an inline table in an array, its element key[i]
// (recorded at its line). An array in an array, and anything deeper than
// maxScanDepth, is not named, nor is anything in it.
func (s *boundScan) indexOpen(f *frame) {
	switch top := s.top(); {
	case top == nil:
		f.key, f.alias = s.vkey, s.valias
	case top.key == "" || len(s.stack) >= maxScanDepth:
	case top.c == '{':
		f.key, f.alias = top.val, top.valA
	case f.c == '{':
		f.key, f.alias = top.key+"["+strconv.Itoa(top.elems)+"]", top.key
		s.idx.setFirst(f.key, s.line)
		top.elems++
	}
}

// indexInlineKey records the key (as written) of inline table top, at
// its line, and the tables a dotted one defines; under the alias too.
func (s *boundScan) indexInlineKey(top *frame, written string) {
	parts := splitKey(written)
	for j := 1; j <= len(parts); j++ {
		k := joinKey(parts[:j])
		s.idx.setFirst(top.key+"."+k, s.line)
		if top.alias != "" {
			s.idx.setFirst(top.alias+"."+k, s.line)
		}
	}
	key := joinKey(parts)
	top.val, top.valA = top.key+"."+key, ""
	if top.alias != "" {
		top.valA = top.alias + "." + key
	}
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
			s.notTOML(s.i + 1)
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

// notTOML records at, just past where the file is found not TOML, if it
// is the first such place.
func (s *boundScan) notTOML(at int) {
	if s.bad == 0 {
		s.bad = at
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
