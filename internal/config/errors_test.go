package config

import (
	"strings"
	"testing"
)

// A table header its line ends in (unclosed) is refused at its own line,
// naming the table it opens: the decoder, having read the newline, said
// the next line, and named the table before it.
func TestUnclosedHeaderIsNamedAtItsLine(t *testing.T) {
	for in, want := range map[string]string{
		"[log]\nlevel = \"info\"\n[metrics\nlisten_address = \":20257\"\n":     `c.toml:3: key metrics: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		"[log]\nlevel = \"info\"\n[metrics\r\nlisten_address = \":20257\"\r\n": `c.toml:3: key metrics: syntax error: expected '.' or ']' to end table name, but got '\r' instead`,
		"[log]\nlevel = \"info\"\n[metrics.\n":                                 `c.toml:3: key metrics: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		"[log]\nlevel = \"info\"\n[[kmsg.rules]\nname = \"X\"\n":               `c.toml:3: key kmsg.rules: syntax error: expected end of table array name delimiter ']', but got '\n' instead`,
		"# the end\n[log]\n\n  [ checks . \"DiskUsageHigh\"  # c\n":            `c.toml:4: key checks.DiskUsageHigh: syntax error: expected '.' or ']' to end table name, but got '#' instead`,
		// A header with no name yet is at its own line too, and names
		// no key: the table above it is not the one in error.
		"[log]\nlevel = \"info\"\n[\nlisten_address = \":20257\"\n":     `c.toml:3: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		"[log]\nlevel = \"info\"\n[[\nname = \"X\"\n":                   `c.toml:3: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		"[log]\nlevel = \"info\"\n[ # metrics\nlisten_address = \"\"\n": `c.toml:3: syntax error: expected '.' or ']' to end table name, but got '#' instead`,
		// A header written as no key is not named as another one
		// ("met rics" is not metrics), and a '#' in a quoted part is
		// the part's, not a comment.
		"[log]\nlevel = \"info\"\n[met rics]\n":       `c.toml:3: syntax error: expected '.' or ']' to end table name, but got 'r' instead`,
		"[log]\nlevel = \"info\"\n[metrics.\"a#b\"\n": `c.toml:3: key metrics."a#b": syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		// At the end of the file, the line is the decoder's.
		"[log]\nlevel = \"info\"\n[metrics": `c.toml:3: key metrics: syntax error: expected '.' or ']' to end table name, but got '\x00' instead`,
	} {
		_, err := Parse("c.toml", []byte(in), Default())
		if err == nil {
			t.Errorf("%q: loaded", in)
			continue
		}
		if err.Error() != want {
			t.Errorf("%q:\n got: %v\nwant: %s", in, err, want)
		}
	}
}

// A quoted key with an escape TOML has and Go's strconv.Unquote has not
// (\e, the escape character, and \xHH, U+00HH where Go reads a byte: TOML
// 1.1, which the decoder reads) is found
// at its line: the index names it as the decoder does.
func TestKeyWithTOMLEscapeIsAtItsLine(t *testing.T) {
	for in, want := range map[string]string{
		"[log]\nlevel = \"info\"\n\"a\\eb\" = 1\n":          `c.toml:3: key log."a\u001bb": unknown key`,
		"[log]\nlevel = \"info\"\n[\"ch\\eecks\"]\nx = 1\n": `c.toml:3: key "ch\u001becks": unknown key`,
		// \xHH is TOML's U+00HH (1.1), a byte in Go.
		"[log]\nlevel = \"info\"\n\"caf\\xe9\" = 1\n":         `c.toml:3: key log."café": unknown key`,
		"[log]\nlevel = \"info\"\n\"a\\\\e\" = 1\n":           `c.toml:3: key log."a\\e": unknown key`,
		"[log]\nlevel = \"info\"\nx = { \"\\e\" = 1 }\n":      `c.toml:3: key log.x: unknown key (did you mean log?)`,
		"[log]\nlevel = \"info\"\n[checks]\n\"a\\e\".b = 1\n": `c.toml:4: key checks."a\u001b".b: unknown key`,
	} {
		_, err := Parse("c.toml", []byte(in), Default())
		if err == nil {
			t.Errorf("%q: loaded", in)
			continue
		}
		if err.Error() != want {
			t.Errorf("%q:\n got: %v\nwant: %s", in, err, want)
		}
	}
}

// suggest of any known key's name under any table, or none, a known key
// itself included, says something or nothing, never panics: the tables of a
// name that is also a top-level key are cut from the name's end
// (tablesOf, tableOfTopLevel), which a top-level key has no table before.
func TestSuggestOfEveryKnownNameAnywhere(t *testing.T) {
	names := map[string]bool{}
	for _, k := range knownKeys() {
		names[k[strings.LastIndexByte(k, '.')+1:]] = true
	}
	for n := range names {
		for _, in := range []string{"", "runner.", "checks.DiskUsageHigh.", "kmsg.rules.", "log.", "checks.", "x.y."} {
			suggest(in + n)
			suggest(in + strings.ToUpper(n))
		}
	}
}
