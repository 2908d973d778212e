package hostio

import (
	"bytes"
	"fmt"
	"iter"
	"strconv"
	"strings"
)

// The one reader of proc(5) /proc/<pid>/mountinfo: DiskUsageHigh's mount
// list, the kernel log's pod-volume lookup, the scan's hidden mounts and
// NodeTampered's mount watcher all split its lines here.
//
// The kernel writes a line as (fs/proc_namespace.c: show_mountinfo)
//
//	id parent major:minor root mountpoint options [optional...] - fstype source superoptions
//
// its fields separated by one space each. In the root, the mount point,
// the filesystem type and the source it escapes a space, tab, newline and
// backslash as \ooo (mangle, seq_path_root), nothing else: a \v, \r or a
// Unicode space (U+00A0) in a directory's name is the path's, not a
// separator, and a source the kernel writes empty ("none" is not written
// for it) is an empty field. So the fields are split at each space, never
// with strings.Fields, which split at those bytes and read an empty
// source's mount with its super options for its source.

// MountinfoFields are the fields of one line of a mount table, as the
// kernel wrote them: slices of the line, not unescaped, not copied.
type MountinfoFields struct {
	ID, Parent, Device []byte
	Root, MountPoint   []byte
	Options            []byte
	Optional           []byte // the optional fields ("shared:1 master:2"), space-separated; empty where none
	FSType, Source     []byte
	SuperOptions       []byte // empty where the line ends after the source
}

// SplitMountinfo splits one line of a mount table (without its newline)
// at each space. ok false for a line the kernel does not write: fewer than
// six fields before the optional ones, one of them empty, no "-" after
// them, or no filesystem type and source after it (an empty type).
// It allocates nothing.
func SplitMountinfo(line []byte) (f MountinfoFields, ok bool) {
	var six [6][]byte
	rest := line
	for i := range six {
		var more bool
		six[i], rest, more = bytes.Cut(rest, []byte{' '})
		if len(six[i]) == 0 || !more {
			return MountinfoFields{}, false
		}
	}
	f.ID, f.Parent, f.Device, f.Root, f.MountPoint, f.Options = six[0], six[1], six[2], six[3], six[4], six[5]
	// The optional fields, up to the "-" that ends them.
	opt := rest
	n := 0
	for {
		field, after, more := bytes.Cut(rest, []byte{' '})
		if string(field) == "-" {
			if n > 0 {
				f.Optional = opt[:n-1]
			}
			rest = after
			if !more {
				return MountinfoFields{}, false
			}
			break
		}
		if !more {
			return MountinfoFields{}, false
		}
		n += len(field) + 1
		rest = after
	}
	var more bool
	f.FSType, rest, more = bytes.Cut(rest, []byte{' '})
	if len(f.FSType) == 0 || !more {
		return MountinfoFields{}, false
	}
	f.Source, f.SuperOptions, _ = bytes.Cut(rest, []byte{' '})
	return f, true
}

// MountinfoMountPoint is the fifth field of a line, the mount point as
// the kernel wrote it (escaped), split as SplitMountinfo splits: for a
// reader that skips most lines by their mount point before splitting the
// rest (the mount watcher). Empty where the line has fewer fields.
func MountinfoMountPoint(line []byte) []byte {
	for range 4 {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			return nil
		}
		line = line[i+1:]
	}
	mp, _, _ := bytes.Cut(line, []byte{' '})
	return mp
}

// MountinfoLines yields the lines of the mount table b, without their
// newline, each with its number (the first is 1); an empty line is
// skipped (and counted).
func MountinfoLines(b []byte) iter.Seq2[int, []byte] {
	return func(yield func(int, []byte) bool) {
		for n := 1; len(b) > 0; n++ {
			var line []byte
			line, b, _ = bytes.Cut(b, []byte{'\n'})
			if len(line) == 0 {
				continue
			}
			if !yield(n, line) {
				return
			}
		}
	}
}

// MalformedMountinfoError is a line of a mount table that SplitMountinfo
// does not split.
type MalformedMountinfoError struct {
	Line int
	Text string
}

func (e *MalformedMountinfoError) Error() string {
	return fmt.Sprintf("mountinfo line %d: malformed: %q", e.Line, e.Text)
}

// MountinfoEntry is one line of a mount table, its root, mount point,
// filesystem type and source unescaped.
type MountinfoEntry struct {
	ID, Parent   string
	Device       string // major:minor
	Root         string
	MountPoint   string
	Options      string
	Optional     []string
	FSType       string
	Source       string
	SuperOptions string
}

// Entry unescapes the fields of f.
func (f MountinfoFields) Entry() MountinfoEntry {
	e := MountinfoEntry{ID: string(f.ID), Parent: string(f.Parent), Device: string(f.Device),
		Root: UnescapeMountinfo(string(f.Root)), MountPoint: UnescapeMountinfo(string(f.MountPoint)), Options: string(f.Options),
		FSType: UnescapeMountinfo(string(f.FSType)), Source: UnescapeMountinfo(string(f.Source)), SuperOptions: string(f.SuperOptions)}
	if len(f.Optional) > 0 {
		e.Optional = strings.Split(string(f.Optional), " ")
	}
	return e
}

// ParseMountinfo reads the whole mount table b: each line's entry, in the
// table's order; the first malformed line is the error
// (*MalformedMountinfoError, naming its number).
func ParseMountinfo(b []byte) ([]MountinfoEntry, error) {
	var out []MountinfoEntry
	for n, line := range MountinfoLines(b) {
		f, ok := SplitMountinfo(line)
		if !ok {
			return nil, &MalformedMountinfoError{Line: n, Text: string(line)}
		}
		out = append(out, f.Entry())
	}
	return out, nil
}

// UnescapeMountinfo undoes mountinfo's \ooo escapes (space, tab, newline,
// backslash); a backslash not followed by three octal digits of a byte is
// kept as it is.
func UnescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// EscapeMountinfo escapes s as the kernel writes a path, a source or a
// filesystem type in mountinfo (fs/proc_namespace.c: mangle, " \t\n\\" as
// \ooo): the inverse of UnescapeMountinfo, for the tests and fuzz targets
// that write the kernel's lines.
func EscapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; strings.IndexByte(" \t\n\\", c) >= 0 {
			fmt.Fprintf(&b, "\\%03o", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}
