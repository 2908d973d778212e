package report

import (
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Printable returns s as a message may carry it: every byte of a character
// that is not printable is written as \xNN (lower-case hex), the kernel's own
// form in /dev/kmsg and what dmesg shows for it. Not printable are the C0
// control characters (tab, newline and ESC included), DEL, the C1 control
// characters (U+0080..U+009F), the other characters that are neither
// graphic nor the space (Unicode's format characters such as the bidi
// overrides, the line and paragraph separators, private use) and every byte
// that is not part of valid UTF-8. Everything else is kept, the backslash
// too (dmesg shows it so), so that Printable of its own result is that
// result.
//
// Kernel lines, journal entries, agents' answers and file names carry text
// anyone may choose (a thread's name, a file's): written raw into a
// condition's or an Event's message it would reach an administrator's
// terminal through kubectl (an escape sequence that retitles, clears or
// rewrites it) and forge lines in the journal (a newline).
func Printable(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s // printable ASCII: the usual case, no copy
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		c := s[i]
		if c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
			i++
			continue
		}
		r, n := rune(c), 1
		if c >= utf8.RuneSelf {
			r, n = utf8.DecodeRuneInString(s[i:])
		}
		// (RuneError, 1) is a byte that is not valid UTF-8; a U+FFFD
		// well encoded is graphic.
		if unicode.IsGraphic(r) && !(r == utf8.RuneError && n == 1) {
			b.WriteString(s[i : i+n])
		} else {
			for _, c := range []byte(s[i : i+n]) {
				b.WriteString(`\x`)
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&0xf])
			}
		}
		i += n
	}
	return b.String()
}

const hexDigits = "0123456789abcdef"

// PrintableJSON returns the JSON text b (encoding/json's output: valid
// UTF-8, the C0 control characters already escaped) with every other
// character that is not printable (DEL, the C1 control characters, the
// characters neither graphic nor the space) written as a \uXXXX escape: the
// same JSON value, which a terminal shows as text. encoding/json writes
// them raw, and a report document or a log line in JSON would carry a C1
// control such as CSI (U+009B) of a file's name to the terminal that shows
// it. Outside its strings JSON holds only printable ASCII and whitespace,
// so only strings change.
func PrintableJSON(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] < utf8.RuneSelf && b[i] != 0x7f {
		i++
	}
	if i == len(b) {
		return b // ASCII without DEL: the usual case, no copy
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for i < len(b) {
		c := b[i]
		if c < utf8.RuneSelf && c != 0x7f {
			out = append(out, c)
			i++
			continue
		}
		r, n := rune(c), 1
		if c >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(b[i:])
		}
		if unicode.IsGraphic(r) && !(r == utf8.RuneError && n == 1) {
			out = append(out, b[i:i+n]...)
		} else if r == utf8.RuneError && n == 1 {
			out = append(out, `\ufffd`...) // not UTF-8: as encoding/json writes it
		} else {
			for _, u := range utf16Units(r) {
				out = append(out, '\\', 'u', hexDigits[u>>12], hexDigits[u>>8&0xf], hexDigits[u>>4&0xf], hexDigits[u&0xf])
			}
		}
		i += n
	}
	return out
}

// utf16Units are r's UTF-16 code units, as a JSON \u escape writes them.
func utf16Units(r rune) []uint16 {
	if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
		return []uint16{uint16(r1), uint16(r2)}
	}
	return []uint16{uint16(r)}
}
