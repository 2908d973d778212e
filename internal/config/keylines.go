package config

import (
	"strconv"
	"strings"
)

// keyIndex maps a dotted key to the line that defines it.
type keyIndex map[string]int

// find returns the line of key, or of its closest defined parent table.
func (k keyIndex) find(key string) int {
	for key != "" {
		if l, ok := k[key]; ok {
			return l
		}
		i := strings.LastIndexByte(key, '.')
		if i < 0 {
			break
		}
		key = key[:i]
	}
	return 0
}

// keyLines finds the line of every table header and key assignment. It
// understands the TOML this file needs (tables, bare and quoted keys, dotted
// keys, multi-line arrays and strings); the decoder has already rejected
// anything malformed.
func keyLines(data []byte) keyIndex {
	idx := keyIndex{}
	table := ""
	plain := ""                // table without an array of tables' index
	arrays := map[string]int{} // [[name]] headers seen, by name
	depth := 0                 // open brackets of a multi-line array
	inMulti := ""              // open multi-line string delimiter
	for n, raw := range strings.Split(string(data), "\n") {
		line := strings.TrimSpace(raw)
		if inMulti != "" {
			if strings.Contains(line, inMulti) {
				inMulti = ""
			}
			continue
		}
		if depth > 0 {
			depth += bracketDelta(line)
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
		key := joinKey(splitKey(line[:eq]))
		if table != plain {
			// In an array of tables: also under the array's name, at
			// the first element that has the key.
			if _, ok := idx[plain+"."+key]; !ok {
				idx[plain+"."+key] = n + 1
			}
		}
		if table != "" {
			key = table + "." + key
		}
		idx[key] = n + 1
		val := strings.TrimSpace(stripComment(line[eq+1:]))
		for _, q := range []string{`"""`, `'''`} {
			if strings.HasPrefix(val, q) && !strings.Contains(val[3:], q) {
				inMulti = q
			}
		}
		if strings.HasPrefix(val, "[") {
			depth = bracketDelta(val)
		}
	}
	return idx
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
// string ("..." with backslash escapes, or '...'), with its index, until
// visit returns false.
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

func bracketDelta(s string) int {
	d := 0
	outsideStrings(stripComment(s), func(_ int, c byte) bool {
		switch c {
		case '[':
			d++
		case ']':
			d--
		}
		return true
	})
	return d
}
