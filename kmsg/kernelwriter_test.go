package kmsg

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// The kernel's own writer of /dev/kmsg records, the reference the record
// parser is held against (kernel/printk/printk.c, 5.10 to 6.x):
// info_print_ext_header writes
//
//	"%u,%llu,%llu,%c" (facility<<3 | level, seq, ts_nsec/1000, LOG_CONT ? 'c' : '-')
//
// then, with CONFIG_PRINTK_CALLER, ",caller=%c%u" ('C' and the CPU for a
// caller id with bit 31 set, else 'T' and the task's pid), then ";".
// msg_print_ext_body writes the text through msg_add_ext_text, which
// escapes every byte below ' ', from 127 up, and the backslash as "\x%02x",
// and ends it with '\n'; then, for each of the device's SUBSYSTEM and
// DEVICE that is not empty, a dictionary line " KEY=value\n" (key and value
// escaped the same way). The kernels of 3.5 to 4.x wrote a third flag,
// '+', for a fragment that continues the one before (msg_print_ext_header:
// LOG_CONT after a LOG_CONT record), and no caller field.
type kernelRecord struct {
	facility, level uint8
	seq, usec       uint64
	flag            byte // '-', 'c' or '+'
	caller          uint32
	hasCaller       bool
	text            []byte
	subsystem       string
	device          string
}

// kernelEscape is msg_add_ext_text's escaping, without the end byte.
func kernelEscape(dst, text []byte) []byte {
	for _, c := range text {
		if c < ' ' || c >= 127 || c == '\\' {
			dst = fmt.Appendf(dst, `\x%02x`, c)
		} else {
			dst = append(dst, c)
		}
	}
	return dst
}

// encode writes the record as devkmsg_read gives it.
func (k kernelRecord) encode() []byte {
	b := fmt.Appendf(nil, "%d,%d,%d,%c", uint(k.facility)<<3|uint(k.level&7), k.seq, k.usec, k.flag)
	if k.hasCaller {
		c, id := byte('T'), k.caller
		if id&0x80000000 != 0 {
			c, id = 'C', id&^0x80000000
		}
		b = fmt.Appendf(b, ",caller=%c%d", c, id)
	}
	b = append(b, ';')
	b = append(kernelEscape(b, k.text), '\n')
	for _, kv := range [][2]string{{"SUBSYSTEM", k.subsystem}, {"DEVICE", k.device}} {
		// The dev_printk_info strings are NUL-terminated: a value ends at
		// its first NUL, and an empty one is left out.
		v, _, _ := bytes.Cut([]byte(kv[1]), []byte{0})
		if len(v) == 0 {
			continue
		}
		b = append(kernelEscape(append(b, ' '), []byte(kv[0])), '=')
		b = append(kernelEscape(b, v), '\n')
	}
	return b
}

// checkAgainstKernel requires ParseRecord, Unescape and ParseLine (the
// replay's reading of the record's first line) to give back the fields the
// kernel wrote, unchanged.
func checkAgainstKernel(t *testing.T, k kernelRecord) {
	t.Helper()
	b := k.encode()
	r, err := ParseRecord(b)
	if err != nil {
		t.Fatalf("ParseRecord(%q) of a record the kernel writes: %v", b, err)
	}
	cont := k.flag == 'c' || k.flag == '+'
	if r.Facility != k.facility || r.Level != k.level&7 || r.Seq != k.seq || r.Usec != k.usec || r.Cont != cont {
		t.Fatalf("ParseRecord(%q) = facility %d level %d seq %d usec %d cont %v; the kernel wrote %d %d %d %d %v",
			b, r.Facility, r.Level, r.Seq, r.Usec, r.Cont, k.facility, k.level&7, k.seq, k.usec, cont)
	}
	if msg := Unescape(nil, r.Message); !bytes.Equal(msg, k.text) {
		t.Fatalf("ParseRecord(%q): message %q, unescaped %q; the kernel's text was %q", b, r.Message, msg, k.text)
	}
	first, _, _ := bytes.Cut(b, []byte{'\n'})
	l := ParseLine(first)
	if l.Skip || l.Form != FormKmsg || l.Record.Seq != k.seq || l.Record.Usec != k.usec || l.Record.Facility != k.facility || l.Record.Level != k.level&7 ||
		!bytes.Equal(Unescape(nil, l.Message), k.text) {
		t.Fatalf("ParseLine(%q) = form %q skip %v record %+v message %q; the kernel's text was %q", first, l.Form, l.Skip, l.Record, l.Message, k.text)
	}
}

// The record parser against the kernel's writer: every record the kernel
// can write, from fuzzed fields, parses to those fields.
func FuzzParseRecordKernel(f *testing.F) {
	f.Add(uint8(0), uint8(3), uint64(379), uint64(3463590), byte('-'), uint32(0), false, []byte("device-mapper: verity: 7:1: data block 5 is corrupted"), "", "")
	f.Add(uint8(0), uint8(6), uint64(399), uint64(6531168), byte('-'), uint32(128), true, []byte("task:kubelet state:D"), "block", "b8:0")
	f.Add(uint8(1), uint8(4), uint64(1), uint64(2), byte('c'), uint32(0x80000003), true, []byte("tab\there \\x41 é\x00;,\n"), "pci", "+pci:0000:00:01.0")
	f.Add(uint8(255), uint8(7), uint64(1<<64-1), uint64(18446744073709551), byte('+'), uint32(0), false, []byte{}, "a\nb", "")
	f.Fuzz(func(t *testing.T, facility, level uint8, seq, usec uint64, flag byte, caller uint32, hasCaller bool, text []byte, subsystem, device string) {
		k := kernelRecord{facility: facility, level: level & 7, seq: seq, usec: usec, flag: kernelFlag(flag),
			caller: caller, hasCaller: hasCaller, text: text, subsystem: subsystem, device: device}
		checkAgainstKernel(t, k)
	})
}

// kernelFlag maps a fuzzed byte to one of the flags a kernel writes.
func kernelFlag(b byte) byte {
	if b == '-' || b == 'c' || b == '+' {
		return b
	}
	return "-c+"[int(b)%3]
}

// And the reverse: a record the parser accepts is one the kernel could
// have written: its fields, re-encoded by the kernel's writer, parse to the
// same fields and the same unescaped text.
func checkReencodable(t *testing.T, b []byte) {
	t.Helper()
	r, err := ParseRecord(b)
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v is not ErrMalformed", err)
		}
		return
	}
	flag := byte('-')
	if r.Cont {
		flag = 'c'
	}
	k := kernelRecord{facility: r.Facility, level: r.Level, seq: r.Seq, usec: r.Usec, flag: flag, text: Unescape(nil, r.Message)}
	checkAgainstKernel(t, k)
}

func TestParseRecordKernelFlags(t *testing.T) {
	// 3.5 to 4.x: 'c' begins a continued line, '+' continues it.
	for _, in := range []string{"4,5,6,c;begun", "4,6,7,+;continued\n"} {
		if r, err := ParseRecord([]byte(in)); err != nil || !r.Cont {
			t.Errorf("ParseRecord(%q) = %+v, %v; want a continuation fragment", in, r, err)
		}
	}
	if r, err := ParseRecord([]byte("4,7,8,-,caller=T1;whole\n")); err != nil || r.Cont {
		t.Errorf("a record of its own: %+v, %v", r, err)
	}
}

// devkmsgWrite is the kernel's reading of one write(2) to /dev/kmsg
// (devkmsg_write, then vprintk_store, 5.10 to 6.x): a "<N>" prefix
// (simple_strtoul, base 10, truncated to 32 bits) sets the level to N&7 and,
// when (N>>3)&0xff is not 0, the facility to it; without one the level is
// kernel.printk's default_message_loglevel and the facility LOG_USER (1), so
// user space never writes facility 0. The text is printed with "%s": it ends
// at the first NUL; one trailing newline is taken off.
func devkmsgWrite(w []byte, defaultLevel uint8) (facility, level uint8, text []byte) {
	facility, level, line := 1, defaultLevel, w
	if len(line) > 0 && line[0] == '<' {
		i := 1
		var u uint64
		for i < len(line) && line[i] >= '0' && line[i] <= '9' {
			u = u*10 + uint64(line[i]-'0')
			i++
		}
		if i < len(line) && line[i] == '>' {
			level = uint8(uint32(u) & 7)
			if f := uint8(uint32(u) >> 3 & 0xff); f != 0 {
				facility = f
			}
			line = line[i+1:]
		}
	}
	text, _, _ = bytes.Cut(line, []byte{0})
	text = bytes.TrimSuffix(text, []byte{'\n'})
	return facility, level, text
}

// kernelCapture is one write to /dev/kmsg and the record the kernel gave
// back for it.
type kernelCapture struct{ wrote, read []byte }

// checkCapture holds the parser's reading of the record the kernel gave
// back against what was written.
func checkCapture(t *testing.T, c kernelCapture, defaultLevel uint8) Record {
	t.Helper()
	fac, lvl, text := devkmsgWrite(c.wrote, defaultLevel)
	r, err := ParseRecord(c.read)
	if err != nil {
		t.Fatalf("wrote %q, the kernel gave %q: %v", c.wrote, c.read, err)
	}
	if r.Facility != fac || r.Level != lvl || r.Cont || !bytes.Equal(Unescape(nil, r.Message), text) {
		t.Errorf("wrote %q, the kernel gave %q: parsed facility %d level %d cont %v text %q; want %d %d false %q",
			c.wrote, c.read, r.Facility, r.Level, r.Cont, Unescape(nil, r.Message), fac, lvl, text)
	}
	checkAgainstKernel(t, kernelRecord{facility: r.Facility, level: r.Level, seq: r.Seq, usec: r.Usec, flag: '-', text: text})
	if enc := (kernelRecord{facility: fac, level: lvl, seq: r.Seq, usec: r.Usec, flag: '-', text: text}).encode(); !bytes.Equal(enc, c.read) {
		t.Errorf("wrote %q: the kernel gave %q, its writer as modelled here %q", c.wrote, c.read, enc)
	}
	return r
}
