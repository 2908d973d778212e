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
