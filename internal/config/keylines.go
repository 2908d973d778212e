package config

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// keyIndex maps a dotted key to the line that defines it.
type keyIndex map[string]int

// find returns the line of key, or of its closest defined parent: an
// array's element (name[i]) falls back to the array (name), a key to its
// table.
func (k keyIndex) find(key string) int {
	for key != "" {
		if l, ok := k[key]; ok {
			return l
		}
		i := strings.LastIndexByte(key, '.')
		if strings.HasSuffix(key, "]") {
			i = strings.LastIndexByte(key, '[')
		}
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// setFirst records line for key unless a line is recorded for it already.
func (k keyIndex) setFirst(key string, line int) {
	if _, ok := k[key]; !ok {
		k[key] = line
	}
}

// keyLines finds the line of every table header, key assignment and inline
// table in an array (as key[i]). It understands the TOML this file needs
// (tables, bare and quoted keys, dotted keys, multi-line arrays, inline
// tables on one line or, as TOML 1.1 allows, over several, and multi-line
// strings); it also runs on a file the decoder rejects. A byte order mark
// before the first line (a file saved by an editor on Windows) is skipped,
// as the decoder skips it.
func keyLines(data []byte) keyIndex {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	idx := keyIndex{}
	table := ""
	plain := ""                // table without an array of tables' index
	arrays := map[string]int{} // [[name]] headers seen, by name
	var vs valueScan           // the array or inline table value being read, over its lines
	inMulti := ""              // open multi-line string delimiter
	for n, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if inMulti != "" {
			if strings.Contains(line, inMulti) {
				inMulti = ""
			}
			continue
		}
		if vs.open() {
			vs.scan(idx, line, n+1)
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if strings.HasPrefix(line, "[") {
			h := strings.TrimSpace(stripComment(line))
			array := strings.HasPrefix(h, "[[")
			h = strings.Trim(h, "[]")
			table = joinKey(splitKey(h))
			plain = table
			if array {
				// Each element as name[i]; the name alone is its
				// first element's line.
				i := arrays[table]
				arrays[table]++
				if i == 0 {
					idx[table] = n + 1
				}
				table += "[" + strconv.Itoa(i) + "]"
			}
			idx[table] = n + 1
			continue
		}
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			continue
		}
		parts := splitKey(line[:eq])
		key := joinKey(parts)
		if table != plain {
			// In an array of tables: also under the array's name, at
			// the first element that has the key.
			idx.setFirst(plain+"."+key, n+1)
		}
		if table != "" {
			key = table + "." + key
		}
		// A dotted key defines the tables it names (a.b.c = 1 defines a
		// and a.b): at the first line that names them.
		for i := 1; i < len(parts); i++ {
			t := joinKey(parts[:i])
			if table != "" {
				t = table + "." + t
			}
			idx.setFirst(t, n+1)
		}
		idx[key] = n + 1
		val := strings.TrimSpace(stripComment(line[eq+1:]))
		for _, q := range []string{`"""`, `'''`} {
			if strings.HasPrefix(val, q) && !strings.Contains(val[3:], q) {
				inMulti = q
			}
		}
		if strings.HasPrefix(val, "[") || strings.HasPrefix(val, "{") {
			vs = valueScan{key: key}
			if table != plain {
				vs.alias = plain + "." + joinKey(parts)
			}
			vs.scan(idx, val, n+1)
		}
	}
	return idx
}

// valueScan reads an array or inline table value, over as many lines as
// it spans (TOML 1.1, which the decoder reads, lets an inline table span
// lines too), and records lines:
//
//   - in an array, the line of each element that is an inline table as
//     key[i] (an array of inline tables is the inline form of an array of
//     tables), and of each key of such an element as key[i].k, and as key.k
//     at the first element that has it (as in an array of tables). In an
//     array of plain values (strings, numbers) it records key[i] for each
//     element that begins on a line after the array's own: an error about
//     one entry of a multi-line list names its line (one on the array's
//     line has it already).
//   - in an inline table, the line of each of its keys, key.k (a dotted key
//     defines the tables it names there, as in a [table]), and of the keys
//     of an inline table within it, at any depth.
type valueScan struct {
	key   string // the key whose value is read
	alias string // in an array of tables: the key under the array's name, else ""
	stack []scanFrame
}

// scanFrame is one open array or inline table of a value.
type scanFrame struct {
	table bool   // an inline table; else an array
	key   string // the array's key, or the inline table's (its keys' prefix)
	alias string // an inline table's key under its array's name (key.k besides key[i].k), or ""
	line  int    // the line the frame begins on
	// An array's:
	elems int  // inline tables seen at its top level
	items int  // elements of any kind seen at its top level
	want  bool // before the next element
	// An inline table's:
	wantKey bool   // before the next key
	val     string // the key whose value is being read (after its '='), or ""
	valA    string // val under the alias, or ""
}

// maxScanDepth is how deep in a value keys are recorded: the
// configuration's deepest is 2 (kmsg.rules = [{ k = ... }]), or one more
// written as checks = { Name = { k = ... } }.
const maxScanDepth = 8

// open reports whether a value is still being read.
func (a *valueScan) open() bool { return len(a.stack) > 0 }

func (a *valueScan) scan(idx keyIndex, s string, line int) {
	s = stripComment(s)
	keyFrom := -1 // where the key being read began, on this line
	outsideStrings(s, func(i int, c byte) bool {
		var top *scanFrame
		if len(a.stack) > 0 {
			top = &a.stack[len(a.stack)-1]
		}
		blank := c == ' ' || c == '\t'
		if top != nil && !top.table && top.want && !blank && c != ',' && c != ']' {
			// An element begins (a string at its opening quote).
			top.want = false
			if c != '{' && top.elems == 0 && line != top.line && top.key != "" {
				idx.setFirst(top.key+"["+strconv.Itoa(top.items)+"]", line)
			}
			top.items++
		}
		if top != nil && top.table && top.wantKey && !blank && c != ',' && c != '}' {
			// A key begins (a quoted one at its quote).
			top.wantKey = false
			keyFrom = i
		}
		switch c {
		case '[', '{':
			f := scanFrame{table: c == '{', line: line, want: c == '[', wantKey: c == '{'}
			switch {
			case top == nil:
				f.key, f.alias = a.key, a.alias
			case top.key == "" || len(a.stack) >= maxScanDepth:
				// Deeper than any key of the configuration: nothing
				// is recorded in it, and no key is built for it (a
				// key per level would cost the square of the depth).
			case top.table:
				f.key, f.alias = top.val, top.valA
			case c == '{':
				f.key, f.alias = top.key+"["+strconv.Itoa(top.elems)+"]", top.key
				idx.setFirst(f.key, line)
				top.elems++
			default:
				// An array in an array: nothing in it is named.
			}
			a.stack = append(a.stack, f)
		case ']', '}':
			if top != nil {
				a.stack = a.stack[:len(a.stack)-1]
			}
		case ',':
			if top != nil && top.table {
				top.wantKey, top.val, top.valA = true, "", ""
			}
			if top != nil && !top.table {
				top.want = true
			}
		case '=':
			if top == nil || !top.table || keyFrom < 0 || top.key == "" {
				break
			}
			parts := splitKey(s[keyFrom:i])
			keyFrom = -1
			for j := 1; j <= len(parts); j++ {
				k := joinKey(parts[:j])
				idx.setFirst(top.key+"."+k, line)
				if top.alias != "" {
					idx.setFirst(top.alias+"."+k, line)
				}
			}
			top.val = top.key + "." + joinKey(parts)
			if top.alias != "" {
				top.valA = top.alias + "." + joinKey(parts)
			}
		}
		return true
	})
}

// splitKey splits a TOML key (bare, quoted or dotted, with whitespace
// around its dots) into its parts: a dot inside a quoted part is the
// part's ("checks.DiskUsageHigh" quoted whole is one part), a basic
// string's escapes are read as Go reads them, and a literal string is
// taken as it is.
func splitKey(s string) []string {
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t':
			// Around a part or a dot; a bare key has none in it.
		case '.':
			parts = append(parts, cur.String())
			cur.Reset()
		case '"', '\'':
			end := i + 1
			for end < len(s) && s[end] != c {
				if c == '"' && s[end] == '\\' {
					end++
				}
				end++
			}
			q := s[i:min(end+1, len(s))]
			if u, err := strconv.Unquote(q); c == '"' && err == nil {
				cur.WriteString(u)
			} else {
				cur.WriteString(strings.Trim(q, `"'`))
			}
			i = end
		default:
			cur.WriteByte(c)
		}
	}
	return append(parts, cur.String())
}

// joinKey writes a key's parts as the decoder names the key (toml.Key's
// String: a part that is not a bare key quoted), so that its errors and
// undecoded keys are found in the index as they are written.
func joinKey(p []string) string { return toml.Key(p).String() }

// outsideStrings calls visit with each byte of s that is not inside a TOML
// string ("..." with backslash escapes, or '...'), and with the quote that
// opens a string, with its index, until visit returns false.
func outsideStrings(s string, visit func(i int, c byte) bool) {
	inStr := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inStr != 0 && c == '\\' && inStr == '"':
			i++
		case inStr != 0 && c == inStr:
			inStr = 0
		case inStr == 0 && (c == '"' || c == '\''):
			inStr = c
			if !visit(i, c) {
				return
			}
		case inStr == 0 && !visit(i, c):
			return
		}
	}
}

func stripComment(s string) string {
	end := len(s)
	outsideStrings(s, func(i int, c byte) bool {
		if c == '#' {
			end = i
			return false
		}
		return true
	})
	return s[:end]
}
