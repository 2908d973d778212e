// Package textenc tells a text in UTF-16 or UTF-32 by its byte order mark,
// for the readers of text that is UTF-8 alone (the configuration file, a
// kernel log capture), which refuse it naming what it is.
package textenc

import "bytes"

// Mark is a foreign byte order mark a text starts with.
type Mark struct {
	Encoding string // "UTF-16" or "UTF-32"
	Bytes    string // the mark, as "0xff 0xfe"
	// NotUTF16: UTF-16's mark before text with no NUL byte, which is not
	// UTF-16 (each ASCII character has one there): converting it from
	// UTF-16 would make its text CJK characters; removing the mark is what
	// it takes.
	NotUTF16 bool
}

// ForeignMark returns the UTF-16 or UTF-32 byte order mark start begins
// with; ok false for any other start, UTF-8's own mark included. UTF-32's
// little-endian mark starts with UTF-16's, so it is looked for first.
func ForeignMark(start []byte) (m Mark, ok bool) {
	for _, c := range []struct{ mark, enc, bytes string }{
		{"\xff\xfe\x00\x00", "UTF-32", "0xff 0xfe 0x00 0x00"},
		{"\x00\x00\xfe\xff", "UTF-32", "0x00 0x00 0xfe 0xff"},
		{"\xff\xfe", "UTF-16", "0xff 0xfe"},
		{"\xfe\xff", "UTF-16", "0xfe 0xff"},
	} {
		if bytes.HasPrefix(start, []byte(c.mark)) {
			return Mark{Encoding: c.enc, Bytes: c.bytes,
				NotUTF16: c.enc == "UTF-16" && bytes.IndexByte(start[len(c.mark):], 0) < 0}, true
		}
	}
	return Mark{}, false
}
