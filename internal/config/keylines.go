package config

import (
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
			if u, err := strconv.Unquote(goEscapes(q)); c == '"' && err == nil {
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

// goEscapes writes a basic string's escapes that TOML reads otherwise
// than Go, or that Go has not, as Go's, for strconv.Unquote: \e (the
// escape character) and \xHH (TOML 1.1: U+00HH; a byte in Go). A
// backslash escaped (\\) stays one.
func goEscapes(q string) string {
	if !strings.Contains(q, `\e`) && !strings.Contains(q, `\x`) {
		return q
	}
	var b strings.Builder
	for i := 0; i < len(q); i++ {
		if q[i] == '\\' && i+1 < len(q) {
			switch q[i+1] {
			case 'e':
				b.WriteString(`\x1b`)
			case 'x':
				b.WriteString(`\u00`)
			default:
				b.WriteString(q[i : i+2])
			}
			i++
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// joinKey writes a key's parts as the decoder names the key (toml.Key's
// String: a part that is not a bare key quoted), so that its errors and
// undecoded keys are found in the index as they are written.
func joinKey(p []string) string { return toml.Key(p).String() }
