package config

import (
	"bytes"
	"strconv"
	"strings"
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
// (tables, bare and quoted keys, dotted keys, multi-line arrays and
// strings); the decoder has already rejected anything malformed. A byte
// order mark before the first line (a file saved by an editor on Windows)
// is skipped, as the decoder skips it.
func keyLines(data []byte) keyIndex {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	idx := keyIndex{}
	table := ""
	plain := ""                // table without an array of tables' index
	arrays := map[string]int{} // [[name]] headers seen, by name
	var arr arrayScan          // the array value being read, over its lines
	inMulti := ""              // open multi-line string delimiter
	for n, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if inMulti != "" {
			if strings.Contains(line, inMulti) {
				inMulti = ""
			}
			continue
		}
		if arr.depth > 0 {
			arr.scan(idx, line, n+1)
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
		if strings.HasPrefix(val, "[") {
			arr = arrayScan{key: key, line: n + 1}
			arr.scan(idx, val, n+1)
		}
	}
	return idx
}

// arrayScan reads an array value, over as many lines as it spans, and
// records the line of each element that is an inline table as key[i] (an
// array of inline tables is the inline form of an array of tables), and of
// each key of such an element as key[i].k, and as key.k at the first
// element that has it (as in an array of tables). In an array of plain
// values (strings, numbers) it records key[i] for each element that
// begins on a line after the array's own: an error about one entry of a
// multi-line list names its line (one on the array's line has it already).
type arrayScan struct {
	key   string
	line  int  // the line the array begins on
	depth int  // open brackets and braces
	elems int  // inline tables seen at the top level of the array
	items int  // elements of any kind seen at the top level of the array
	want  bool // at the top level, before the next element
}

func (a *arrayScan) scan(idx keyIndex, s string, line int) {
	s = stripComment(s)
	// An inline table is on one line (TOML): a key of the element
	// begins after its '{' or a ',' at its own level.
	keyFrom := -1
	outsideStrings(s, func(i int, c byte) bool {
		if a.depth == 1 && a.want && c != ' ' && c != '\t' && c != ',' && c != ']' {
			// An element begins (a string at its opening quote).
			a.want = false
			if c != '{' && a.elems == 0 && line != a.line {
				idx.setFirst(a.key+"["+strconv.Itoa(a.items)+"]", line)
			}
			a.items++
		}
		switch c {
		case '[':
			a.depth++
			a.want = a.depth == 1
		case '{':
			if a.depth == 1 {
				idx.setFirst(a.key+"["+strconv.Itoa(a.elems)+"]", line)
				a.elems++
				keyFrom = i + 1
			}
			a.depth++
		case ']', '}':
			a.depth--
		case ',':
			if a.depth == 1 {
				a.want = true
			}
			if a.depth == 2 && keyFrom < 0 {
				keyFrom = i + 1
			}
		case '=':
			if a.depth == 2 && keyFrom >= 0 {
				k := joinKey(splitKey(s[keyFrom:i]))
				idx.setFirst(a.key+"["+strconv.Itoa(a.elems-1)+"]."+k, line)
				idx.setFirst(a.key+"."+k, line)
				keyFrom = -1
			}
		}
		return true
	})
}

func splitKey(s string) []string {
	var parts []string
	for _, p := range strings.Split(s, ".") {
		p = strings.TrimSpace(p)
		p = strings.Trim(p, `"'`)
		parts = append(parts, p)
	}
	return parts
}

func joinKey(p []string) string { return strings.Join(p, ".") }

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
