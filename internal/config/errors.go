package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Error is a configuration error with its place in the file.
type Error struct {
	File string
	Line int // 0 when unknown
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString("key " + e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

var lastKeyRE = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "([^"]*)"\): (.*)$`)

// decodeError turns the TOML library's errors into *Error.
func decodeError(file string, lines keyIndex, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.LastKey == "" || pe.Position.Line == 0 {
			return &Error{File: file, Line: pe.Position.Line, Key: pe.LastKey, Msg: "syntax error: " + msg}
		}
		return &Error{File: file, Line: pe.Position.Line, Key: pe.LastKey, Msg: msg}
	}
	if m := lastKeyRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		if line == 0 {
			line = lines.find(m[2])
		}
		return &Error{File: file, Line: line, Key: m[2], Msg: strings.Replace(m[3], "incompatible types: ", "wrong type: ", 1)}
	}
	return &Error{File: file, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

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
	depth := 0    // open brackets of a multi-line array
	inMulti := "" // open multi-line string delimiter
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
			h = strings.Trim(h, "[]")
			table = joinKey(splitKey(h))
			idx[table] = n + 1
			continue
		}
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			continue
		}
		key := joinKey(splitKey(line[:eq]))
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

func stripComment(s string) string {
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
		case inStr == 0 && c == '#':
			return s[:i]
		}
	}
	return s
}

func bracketDelta(s string) int {
	s = stripComment(s)
	d := 0
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
		case inStr == 0 && c == '[':
			d++
		case inStr == 0 && c == ']':
			d--
		}
	}
	return d
}

// suggest proposes the nearest known key for a misspelt one.
func suggest(key string) string {
	best, bestD := "", 4
	for _, k := range knownKeys() {
		if d := editDistance(strings.ToLower(k), strings.ToLower(key)); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
