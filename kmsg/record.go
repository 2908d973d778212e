// Package kmsg is the kernel log monitor: it reads /dev/kmsg per the
// kernel's dev-kmsg ABI (Documentation/ABI/testing/dev-kmsg), matches every
// record against rules compiled once at load, and turns matches into
// conditions and events in the daemon's store.
package kmsg

import (
	"bytes"
	"errors"
	"fmt"
)

// Record is one /dev/kmsg record. Message aliases the buffer it was parsed
// from: valid until that buffer is reused.
type Record struct {
	Facility uint8
	Level    uint8
	Seq      uint64
	// Usec is the monotonic timestamp in microseconds since boot.
	Usec uint64
	// Cont is set for a continuation fragment: flag 'c' (a fragment of a
	// line printed in pieces), or '+' (what the kernels of 3.5 to 4.x
	// wrote for the fragments after the first: msg_print_ext_header).
	Cont    bool
	Message []byte
}

// ErrMalformed is returned for a record that is not in the dev-kmsg format.
var ErrMalformed = errors.New("malformed kmsg record")

// ParseRecord parses "prio,seq,usec,flags[,...];message\n[ KEY=value\n...]".
// It does not allocate; the message is returned still escaped (see Unescape).
func ParseRecord(b []byte) (Record, error) {
	var r Record
	semi := bytes.IndexByte(b, ';')
	if semi < 0 {
		return r, fmt.Errorf("%w: no ';'", ErrMalformed)
	}
	hdr := b[:semi]
	var fields [4][]byte
	n := 0
	for n < 4 {
		i := bytes.IndexByte(hdr, ',')
		if i < 0 {
			fields[n] = hdr
			n++
			break
		}
		fields[n] = hdr[:i]
		hdr = hdr[i+1:]
		n++
	}
	if n < 4 {
		return r, fmt.Errorf("%w: %d header fields, want 4", ErrMalformed, n)
	}
	// facility<<3 | level: the kernel stores the facility user space
	// writes ("<N>": N>>3 & 0xff) in a byte, so up to 2047.
	prio, ok := parseUint(fields[0])
	if !ok || prio > 2047 {
		return r, fmt.Errorf("%w: bad priority", ErrMalformed)
	}
	if r.Seq, ok = parseUint(fields[1]); !ok {
		return r, fmt.Errorf("%w: bad sequence number", ErrMalformed)
	}
	if r.Usec, ok = parseUint(fields[2]); !ok {
		return r, fmt.Errorf("%w: bad timestamp", ErrMalformed)
	}
	if len(fields[3]) == 0 {
		return r, fmt.Errorf("%w: no flags", ErrMalformed)
	}
	r.Cont = fields[3][0] == 'c' || fields[3][0] == '+'
	r.Facility, r.Level = uint8(prio>>3), uint8(prio&7)
	msg := b[semi+1:]
	if i := bytes.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i] // the rest are " KEY=value" dictionary lines
	}
	r.Message = msg
	return r, nil
}

func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// Unescape appends src to dst with the kernel's \xNN escapes (control
// characters, non-ASCII bytes and the backslash itself) decoded.
func Unescape(dst, src []byte) []byte {
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c == '\\' && i+3 < len(src) && src[i+1] == 'x' {
			if h, ok := unhex(src[i+2]); ok {
				if l, ok := unhex(src[i+3]); ok {
					dst = append(dst, h<<4|l)
					i += 3
					continue
				}
			}
		}
		dst = append(dst, c)
	}
	return dst
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
