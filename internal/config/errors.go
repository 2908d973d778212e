package config

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"

	"github.com/syself/autopilot-health/kmsg"
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

// unclosedHeaderRE matches the lexer's errors about a table header not
// closed where its line (or the file) ends or something else follows its
// name: its last key is the table before; at a line's end it has read the
// newline, and counts the next line.
var unclosedHeaderRE = regexp.MustCompile(`(?:to end table name|table array name delimiter ']'), but got '(.+)' instead$`)

// decodeError turns the TOML library's errors into *Error; data is what
// was decoded.
func decodeError(file string, data []byte, lines keyIndex, err error) error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if m := definedKeyRE.FindStringSubmatch(msg); m != nil {
			pe.LastKey = m[1]
			// Where the first definition is: in a file made of the
			// printed default and overrides appended, far above.
			// The lines above the second hold the first only (a third
			// would be refused at the second): indexed alone.
			if first := firstDefinition(data, pe.Position.Line, m[1]); first > 0 && strings.HasSuffix(msg, ".") {
				msg = fmt.Sprintf("%s (first at line %d: a key or table is defined once)", strings.TrimSuffix(msg, "."), first)
			}
		}
		if m := unclosedHeaderRE.FindStringSubmatch(msg); m != nil {
			// At a line's end the header is on the line before; named
			// as written there.
			line := pe.Position.Line
			if m[1] == `\n` {
				line--
			}
			if h, ok := headerAt(data, line); ok {
				return &Error{File: file, Line: line, Key: h, Msg: "syntax error: " + msg}
			}
		}
		msg = outOfRangeWords(msg)
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
		return &Error{File: file, Line: line, Key: key, Msg: typeWords(key, m[3])}
	}
	return &Error{File: file, Msg: strings.TrimPrefix(err.Error(), "toml: ")}
}

// firstDefinition is the line of key in the lines of data above line
// (1-based), 0 where none defines it there.
func firstDefinition(data []byte, line int, key string) int {
	if line < 2 {
		return 0
	}
	off := 0
	for n := 1; n < line; n++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return 0
		}
		off += i + 1
	}
	return keyLines(data[:off])[key]
}

// headerAt reads the table header at line (1-based) of data: ok where
// the line holds one, and its name as the decoder names a key, or "" where
// what is written there is no key (nothing yet, "met rics"): the header
// is not named as another table. A '#' in a quoted part is the part's.
func headerAt(data []byte, line int) (string, bool) {
	ls := strings.SplitN(string(data), "\n", line+1)
	if line < 1 || line > len(ls) {
		return "", false
	}
	l := strings.TrimSpace(strings.TrimPrefix(ls[line-1], "\ufeff"))
	if !strings.HasPrefix(l, "[") {
		return "", false
	}
	name := strings.TrimLeft(l, "[")
	var q byte // the quote of the part being read, 0 outside one
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case q == '"' && c == '\\':
			i++
		case q != 0 && c == q:
			q = 0
		case q == 0 && (c == '"' || c == '\''):
			q = c
		case q == 0 && c == '#':
			name = name[:i]
		}
	}
	name = strings.TrimRight(strings.TrimSpace(name), "].")
	if strings.TrimSpace(name) == "" {
		return "", true
	}
	// The decoder decides what the name is, if it is one.
	md, err := toml.Decode("["+name+"]", &map[string]any{})
	if err != nil || len(md.Keys()) == 0 {
		return "", true
	}
	k := md.Keys()
	return k[len(k)-1].String(), true
}

// suggest proposes the nearest known key for a misspelt one: where its
// name is a key of exactly one other place, that place, which says more
// than a near spelling ("role" after [kmsg] is the top-level key, not
// kmsg.rules).
func suggest(key string) string {
	if m := misplaced(key); m != "" {
		return m
	}
	if m := kmsgRuleAsCheck(key); m != "" {
		return m
	}
	best, bestD := "", 4
	for _, k := range knownKeys() {
		if d := editDistance(strings.ToLower(k), strings.ToLower(key)); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		best = samePrefix(key)
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return ""
}

// kmsgRuleAsCheck says, of a [checks.<Name>] table whose name is a
// built-in kernel log rule's (ReadonlyFilesystem, KernelDeadlock, TaskHung:
// conditions and events the kernel log monitor sets, no check), how that
// rule is turned off; before, "unknown key" alone.
func kmsgRuleAsCheck(key string) string {
	parts := strings.SplitN(key, ".", 3)
	if len(parts) < 2 || parts[0] != "checks" {
		return ""
	}
	for _, r := range kmsg.DefaultRules {
		if r.Name == parts[1] {
			return fmt.Sprintf(` (%s is the kernel log monitor's rule of that name, not a check: kmsg.disable = ["%s"] turns it off; autopilot-health kmsg rules lists them)`, r.Name, r.Name)
		}
	}
	return ""
}

// samePrefix is the one known key of key's table whose last part begins as
// key's does for longest, at least 6 characters and half of key's last
// part, case aside: a name cut short or ended otherwise
// (checks.DiskUsage, checks.ClockNotSynced), too far for editDistance.
// None where two begin as long.
func samePrefix(key string) string {
	i := strings.LastIndexByte(key, '.')
	table, name := key[:i+1], strings.ToLower(key[i+1:])
	best, bestN, tie := "", 0, false
	for _, k := range knownKeys() {
		if !strings.HasPrefix(k, table) || strings.Contains(k[len(table):], ".") {
			continue
		}
		other := strings.ToLower(k[len(table):])
		n := 0
		for n < len(name) && n < len(other) && name[n] == other[n] {
			n++
		}
		switch {
		case n > bestN:
			best, bestN, tie = k, n, false
		case n == bestN:
			tie = true
		}
	}
	if tie || bestN < 6 || 2*bestN < len(name) {
		return ""
	}
	return best
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
	case len(at) == 0:
		return ""
	case len(at) == 1 && at[0] == name:
		return fmt.Sprintf(" (%s is a top-level key: in TOML a key after a [table] header belongs to that table; put it above the first header)", name)
	case slices.Contains(at, name):
		// A top-level key and a table's: which was meant is not said.
		return ""
	}
	return fmt.Sprintf(" (%s is a key of %s)", name, tablesOf(name, at))
}

// tablesOf names the tables whose key name is (at: the keys, each ending
// in "."+name): up to three by name, more by their number and the first.
func tablesOf(name string, at []string) string {
	var ts []string
	for _, k := range at {
		if len(k) > len(name) {
			ts = append(ts, "["+k[:len(k)-len(name)-1]+"]")
		}
	}
	switch {
	case len(ts) == 0:
		return ""
	case len(ts) == 1:
		return ts[0]
	case len(ts) <= 3:
		return strings.Join(ts[:len(ts)-1], ", ") + " and " + ts[len(ts)-1]
	}
	return fmt.Sprintf("%d tables, such as %s", len(ts), ts[0])
}

// tableOfTopLevel names the table of a top-level key that is not one but
// is a table's key (at: where it is known), written above every header
// (one below a header commented out: commentedTableAbove).
func tableOfTopLevel(name string, at []string) string {
	switch {
	case len(at) == 0 || slices.Contains(at, name):
		// None, or name is a top-level key itself.
		return ""
	case len(at) == 1:
		table := at[0][:len(at[0])-len(name)-1]
		return fmt.Sprintf(" (%s is a key of [%s]: write it below a [%s] header)", name, table, table)
	}
	return fmt.Sprintf(" (%s is a key of %s: write it below its table's header)", name, tablesOf(name, at))
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

// The decoder's errors about a value's type speak Go: "TOML value has type
// int64; destination has type slice", "type mismatch for config.Log:
// expected table but found map[string]interface {}", "is out of range for
// int64". An operator writes TOML: typeWords and outOfRangeWords say what
// the key takes and what the file gives in TOML's words (string, integer,
// float, boolean, date or time, array, table).
var (
	badTypeRE    = regexp.MustCompile(`^incompatible types: TOML value has type (.+); destination has type (.+)$`)
	notTableRE   = regexp.MustCompile(`^type mismatch for .+: expected table but found (.+)$`)
	outOfRangeRE = regexp.MustCompile(`^(\S+) is out of range for (int64|float64)$`)
)

// typeWords rewrites the decoder's message about key's value (msg) in
// TOML's words; a message of another kind is returned as it is.
func typeWords(key, msg string) string {
	if m := badTypeRE.FindStringSubmatch(msg); m != nil {
		got := valueWords(m[1])
		t := typeOfKey(key)
		switch {
		case t == nil:
			return "wrong type: must be " + destWords(m[2]) + ", got " + got
		case t.Kind() == reflect.Slice && m[2] != "slice":
			// An entry of the list, not the list.
			return "wrong type: each entry must be " + wantWords(t.Elem()) + ", got " + got
		case key == "gpu" && got == "a boolean":
			// gpu = true reads as meant: the key takes "auto" too.
			return `wrong type: must be a string, "auto", "true" or "false", got a boolean: quote it, gpu = "true" or gpu = "false"`
		}
		return "wrong type: must be " + wantWords(t) + ", got " + got
	}
	if m := notTableRE.FindStringSubmatch(msg); m != nil {
		// A list's (an array of tables') mismatch is one of its
		// entries', whatever that entry is: an array in it too.
		if t := typeOfKey(key); t != nil && t.Kind() == reflect.Slice {
			return "wrong type: each entry must be a table, got " + valueWords(m[1])
		}
		return "wrong type: must be a table, got " + valueWords(m[1])
	}
	return outOfRangeWords(msg)
}

// outOfRangeWords rewrites the parser's "N is out of range for int64"
// (a number no TOML integer or float holds).
func outOfRangeWords(msg string) string {
	m := outOfRangeRE.FindStringSubmatch(msg)
	switch {
	case m == nil:
		return msg
	case m[2] == "int64":
		return m[1] + " is out of range: a TOML integer is from -9223372036854775808 to 9223372036854775807"
	}
	return m[1] + " is out of range: a TOML float is at most about 1.8e308 either side of 0"
}

// valueWords names the TOML type of a value of the Go type the decoder
// names (fmtType: interface{} written any).
func valueWords(goType string) string {
	switch strings.ReplaceAll(goType, "interface {}", "any") {
	case "int64":
		return "an integer"
	case "float64":
		return "a float"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "time.Time":
		return "a date or time"
	case "[]any":
		return "an array"
	case "[]map[string]any":
		return "an array of tables"
	case "map[string]any":
		return "a table"
	}
	return "a value of another type"
}

// valueWordsOf names the TOML type of a value as the decoder hands it to
// a toml.Unmarshaler.
func valueWordsOf(v any) string { return valueWords(fmt.Sprintf("%T", v)) }

// destWords names what the decoder's destination takes, for a key whose
// field typeOfKey does not find.
func destWords(dst string) string {
	switch dst {
	case "integer":
		return "an integer"
	case "float", "string", "boolean":
		return "a " + dst
	case "slice":
		return "an array"
	case "primitive (string-like)":
		return "a string"
	}
	return "another type"
}

// wantWords names what a field of type t takes, in TOML's words.
func wantWords(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[Duration]():
		return `a duration string such as "30s"`
	case reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()):
		return "a string"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a float"
	case reflect.Bool:
		return "a boolean"
	case reflect.Struct, reflect.Map:
		return "a table"
	case reflect.Slice, reflect.Array:
		// "a string" -> "an array of strings"; an entry of more words
		// (a duration) -> "an array".
		if _, one, _ := strings.Cut(wantWords(t.Elem()), " "); !strings.Contains(one, " ") {
			return "an array of " + one + "s"
		}
		return "an array"
	}
	return "another type"
}

// typeOfKey is the type of the field of Config that key (as the decoder
// names it, its parts quoted where TOML quotes them) sets, its parts
// matched to the fields as the decoder matches them, without regard to
// case; nil if key names none.
func typeOfKey(key string) reflect.Type {
	t := reflect.TypeFor[Config]()
	for _, part := range splitKey(key) {
		if t.Kind() == reflect.Slice {
			t = t.Elem() // a key of an array of tables' entry
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		f, ok := fieldOf(t, part)
		if !ok {
			return nil
		}
		t = f
	}
	return t
}

// fieldOf finds the field of struct t whose toml tag is name (without
// regard to case), in an embedded struct (Common) too.
func fieldOf(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			if ft, ok := fieldOf(f.Type, name); ok {
				return ft, true
			}
			continue
		}
		if f.IsExported() && tag != "" && tag != "-" && strings.EqualFold(tag, name) {
			return f.Type, true
		}
	}
	return nil, false
}
