package config

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"
)

// Error is a configuration error with its place in the file.
type Error struct {
	File string
	Line int // 0 when unknown
	Key  string
	Msg  string
	// at, when set, is the key whose line the error is at (an element,
	// key[i], of the list Key names); Key otherwise.
	at string
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

// lastKeyRE reads the decoder's "toml: line N (last key %q): ..." errors;
// the key is Go-quoted (a key part TOML quotes has its quotes escaped).
var lastKeyRE = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key ("(?:[^"\\]|\\.)*")\): (.*)$`)

// definedKeyRE finds the key a redefinition names whole: the library's
// LastKey is then the table it was in ("checks" for a second
// [checks.KubeletUnhealthy]).
var definedKeyRE = regexp.MustCompile(`^Key '(.+)' (?:has already been defined|was already created)`)

// decodeError turns the TOML library's errors into *Error.
func decodeError(file string, lines keyIndex, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if m := definedKeyRE.FindStringSubmatch(msg); m != nil {
			pe.LastKey = m[1]
		}
		if pe.LastKey == "" || pe.Position.Line == 0 {
			return &Error{File: file, Line: pe.Position.Line, Key: pe.LastKey, Msg: "syntax error: " + msg}
		}
		return &Error{File: file, Line: pe.Position.Line, Key: pe.LastKey, Msg: msg}
	}
	if m := lastKeyRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		key, _ := strconv.Unquote(m[2])
		if line == 0 {
			line = lines.find(key)
		}
		return &Error{File: file, Line: line, Key: key, Msg: strings.Replace(m[3], "incompatible types: ", "wrong type: ", 1)}
	}
	return &Error{File: file, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

// suggest proposes the nearest known key for a misspelt one: where its
// name is a key of exactly one other place, that place, which says more
// than a near spelling ("role" after [kmsg] is the top-level key, not
// kmsg.rules).
func suggest(key string) string {
	if m := misplaced(key); m != "" {
		return m
	}
	best, bestD := "", 4
	for _, k := range knownKeys() {
		if d := editDistance(strings.ToLower(k), strings.ToLower(key)); d < bestD {
			best, bestD = k, d
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// misplaced names where a key not known at its place belongs, when its
// last part is a key of exactly one other place: a top-level key written
// after a [table] header belongs to that table in TOML ("node_name" after
// [log] is log.node_name), and a check's key under another check's table.
func misplaced(key string) string {
	i := strings.LastIndexByte(key, '.')
	name := key[i+1:]
	var at []string
	for _, k := range knownKeys() {
		if k == name || strings.HasSuffix(k, "."+name) {
			at = append(at, k)
		}
	}
	if i < 0 {
		return tableOfTopLevel(name, at)
	}
	switch {
	case len(at) != 1:
		return ""
	case at[0] == name:
		return fmt.Sprintf(" (%s is a top-level key: in TOML a key after a [table] header belongs to that table; put it above the first header)", name)
	}
	return fmt.Sprintf(" (%s is a key of [%s])", name, at[0][:len(at[0])-len(name)-1])
}

// tableOfTopLevel names the table of a top-level key that is not one but
// is a table's key (at: where it is known), written above every header
// (one below a header commented out: commentedTableAbove).
func tableOfTopLevel(name string, at []string) string {
	switch len(at) {
	case 0:
		return ""
	case 1:
		table := at[0][:len(at[0])-len(name)-1]
		return fmt.Sprintf(" (%s is a key of [%s]: write it below a [%s] header)", name, table, table)
	}
	return fmt.Sprintf(" (%s is a key of %d tables, such as [%s]: write it below its table's header)", name, len(at), at[0][:len(at[0])-len(name)-1])
}

// commentedHeader matches a table header commented out, "# [metrics]" or
// "# [[kmsg.rules]]".
var commentedHeader = regexp.MustCompile(`^\s*#+\s*(\[\[?)([A-Za-z0-9_.]+)\]\]?\s*$`)

// commentedTableAbove finds, for a top-level key at line (1-based) that is
// not one, the nearest table header above it that is commented out, and
// returns that header ("[metrics]") and its line when key is a key of its
// table: the key was uncommented without its header (the shipped file
// comments out both).
func commentedTableAbove(data []byte, line int, key string) (string, int) {
	if line <= 0 || strings.Contains(key, ".") {
		return "", 0
	}
	ls := strings.Split(string(data), "\n")
	for i := min(line-1, len(ls)) - 1; i >= 0; i-- {
		l := strings.TrimSpace(ls[i])
		if strings.HasPrefix(l, "[") {
			return "", 0 // a header in effect: the key is not a top-level one
		}
		if m := commentedHeader.FindStringSubmatch(l); m != nil {
			if exactKeys()[m[2]+"."+key] {
				return strings.TrimSpace(l[strings.Index(l, "["):]), i + 1
			}
			return "", 0
		}
	}
	return "", 0
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

// kindError refuses what is at the configuration path for what it is, not
// a configuration file: a directory, a FIFO, a socket, a device with
// nothing to read, more than 1 MiB.
type kindError struct{ msg string }

func (e *kindError) Error() string { return e.msg }

// FileFault reports whether err, an error of Load or LoadDigest, is the
// file's: one that only a change of the file ends, so that reading the
// same file again gives it again. It is the file's content (a syntax or a
// validation error, *Error), its kind (kindError), its name (nothing
// there, named explicitly; a path through a file, a symlink loop, a name
// too long) and its permissions (EACCES, EPERM: the unit's root holds no
// CAP_DAC_OVERRIDE; a chmod, a chown or a relabel ends it). Each of those
// changes the file or its inode, which starts autopilot-health.path.
//
// Anything else is not the file's: an I/O error (EIO of a disk or a
// network filesystem, ESTALE, ETIMEDOUT), no memory or no descriptor left
// (ENOMEM, EMFILE, ENFILE), and any error not named above. Those may pass
// with the file as it is, and nothing would change the file to start the
// daemon again.
func FileFault(err error) bool {
	if err == nil {
		return false
	}
	var ce *Error
	var ke *kindError
	if errors.As(err, &ce) || errors.As(err, &ke) {
		return true
	}
	for _, target := range []error{fs.ErrNotExist, fs.ErrPermission, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG, syscall.EISDIR} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
