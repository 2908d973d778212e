package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/syself/autopilot-health/internal/testenv"
)

// oddFiles are small files of an odd shape whose decoding (and keyLines)
// costs the square of their depth or of their key's parts: each took
// seconds to minutes and gigabytes to refuse, at a start and at every
// reload on every node. Each is over a bound on line 3, after lines whose
// strings and comments hold brackets and dots that are not the file's.
func oddFiles() map[string]struct{ src, want string } {
	const head = "# [[[[ {{{{ a.b.c.d.e.f\nhost_root = \"/\" # \"[[[[\"\n"
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "k%d = 1\n", i)
		}
		return b.String()
	}
	return map[string]struct{ src, want string }{
		// 10,000 nested inline tables: 40 KB.
		"inline tables 10000 deep": {head + "x = " + strings.Repeat("{a=", 10000) + "1" + strings.Repeat("}", 10000) + "\n",
			":3: key x: arrays and inline tables nested more than 32 deep: not read (a configuration's deepest value is 3 levels)"},
		"arrays 100000 deep": {head + "[kmsg]\ncritical_tasks = " + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + "\n",
			":4: key kmsg.critical_tasks: arrays and inline tables nested more than 32 deep: not read (a configuration's deepest value is 3 levels)"},
		// One dotted key of 10,000 parts: 20 KB.
		"key of 10000 parts": {head + strings.Repeat("a.", 9999) + "a = 1\n",
			":3: key " + strings.Repeat("a.", 16) + "...: a key of more than 16 dotted parts with its table's: not read (a configuration's keys have at most 3)"},
		// A 400 KB table header followed by keys.
		"table header of 200000 parts": {head + "[" + strings.Repeat("a.", 199999) + "a]\n" + keys(50000),
			":3: key " + strings.Repeat("a.", 16) + "...: a table header of more than 16 dotted parts: not read (a configuration's keys have at most 3)"},
		"table header of 400 KB": {head + "[" + strings.Repeat("b", 400000) + "]\n" + keys(50000),
			":3: key bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb...: a table header longer than 256 bytes: not read (a configuration's longest key is 58)"},
		"key of 400 KB": {head + `"` + strings.Repeat("c", 400000) + `" = 1` + "\n",
			`:3: key "ccccccccccccccccccccccccccccccccccccccc...: a key longer than 256 bytes with its table's: not read (a configuration's longest key is 58)`},
		"inline table key of 10000 parts": {head + "checks = { " + strings.Repeat("a.", 9999) + "a = 1 }\n",
			":3: key checks." + strings.Repeat("a.", 15) + "...: a key of more than 16 dotted parts with its table's: not read (a configuration's keys have at most 3)"},
	}
}

// Each odd file is refused with file, line and key, at a cost bounded by
// the file's size: a few MiB allocated, not gigabytes.
func TestOddFilesAreRefusedCheaply(t *testing.T) {
	for name, f := range oddFiles() {
		t.Run(name, func(t *testing.T) {
			if len(f.src) > maxFileSize {
				t.Fatalf("%d bytes, over the read limit", len(f.src))
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Parse("odd.toml", []byte(f.src), Default())
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
				t.Errorf("Parse allocated %d MiB", n>>20)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			if got := err.Error(); got != "odd.toml"+f.want {
				t.Errorf("error\n got: %s\nwant: %s", got, "odd.toml"+f.want)
			}
		})
	}
}

// BenchmarkLoadDeepFile loads the 40 KB file of 10,000 nested inline
// tables, refused.
func BenchmarkLoadDeepFile(b *testing.B) {
	src := []byte(oddFiles()["inline tables 10000 deep"].src)
	p := filepath.Join(b.TempDir(), "deep.toml")
	if err := os.WriteFile(p, src, 0o644); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Load(p, false); err == nil {
			b.Fatal("loaded")
		}
	}
}

// Load refuses a file over a bound for the cost of its read and of one
// scan, which also indexes its keys' lines: neither the decoder nor the
// defaults (default.toml decoded, about 200 KB) are run for it.
func TestLoadOfARefusedFileIsItsScan(t *testing.T) {
	src := []byte(oddFiles()["inline tables 10000 deep"].src)
	p := filepath.Join(t.TempDir(), "deep.toml")
	if err := os.WriteFile(p, src, 0o644); err != nil {
		t.Fatal(err)
	}
	Load(p, false) // the defaults' validation, once per process
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := Load(p, false)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Fatalf("loaded the deep file, or refused it for another reason: %v", err)
	}
	// The read (the file, 40 KB, in a growing buffer) and the scan; the
	// race detector's own allocations are not the Load's.
	if n := after.TotalAlloc - before.TotalAlloc; n > 160<<10 && !testenv.Race {
		t.Errorf("Load of a refused 40 KB file allocated %d KB", n>>10)
	}
}

// The bounds of the shape are inclusive and far above a valid file: a value nested
// MaxNesting deep, a key and a header of MaxKeyParts parts and of
// MaxKeyBytes bytes pass the scan (and are refused by the decoder or the
// validation for what they are, an unknown key); one more is refused.
func TestShapeBoundsAreInclusive(t *testing.T) {
	long := func(n int) string { return `"` + strings.Repeat("k", n-2) + `"` }
	for _, c := range []struct {
		at, over string
	}{
		{"x = " + strings.Repeat("[", MaxNesting) + strings.Repeat("]", MaxNesting),
			"x = " + strings.Repeat("[", MaxNesting+1) + strings.Repeat("]", MaxNesting+1)},
		{"x = " + strings.Repeat("{a=", MaxNesting) + "1" + strings.Repeat("}", MaxNesting),
			"x = " + strings.Repeat("{a=", MaxNesting+1) + "1" + strings.Repeat("}", MaxNesting+1)},
		{strings.Repeat("a . ", MaxKeyParts-1) + "a = 1", strings.Repeat("a . ", MaxKeyParts) + "a = 1"},
		{"[" + strings.Repeat("a.", MaxKeyParts-1) + "a]", "[" + strings.Repeat("a.", MaxKeyParts) + "a]"},
		{"[[" + strings.Repeat("a.", MaxKeyParts-1) + "a]]", "[[" + strings.Repeat("a.", MaxKeyParts) + "a]]"},
		{"x = { " + strings.Repeat("a.", MaxKeyParts-2) + "a = 1 }", "x = { " + strings.Repeat("a.", MaxKeyParts-1) + "a = 1 }"},
		{long(MaxKeyBytes) + " = 1", long(MaxKeyBytes+1) + " = 1"},
		{"[ " + long(MaxKeyBytes) + " ]", "[ " + long(MaxKeyBytes+1) + " ]"},
		{"x = {" + long(MaxKeyBytes-2) + " = 1}", "x = {" + long(MaxKeyBytes-1) + " = 1}"},
		{"[t]\n" + long(MaxKeyBytes-2) + " = 1", "[t]\n" + long(MaxKeyBytes-1) + " = 1"},
		{"[t]\nx = {a = {" + long(MaxKeyBytes-6) + " = 1}}", "[t]\nx = {a = {" + long(MaxKeyBytes-5) + " = 1}}"},
		{"[" + strings.Repeat("a.", MaxKeyParts-3) + "a]\nb.c = 1", "[" + strings.Repeat("a.", MaxKeyParts-3) + "a]\nb.c.d = 1"},
		{"x = [{" + strings.Repeat("a.", MaxKeyParts-2) + "a = 1}]", "x = [{" + strings.Repeat("a.", MaxKeyParts-1) + "a = 1}]"},
	} {
		if err := checkBounds("f.toml", []byte(c.at+"\n"), fileLimits); err != nil {
			t.Errorf("%.60q... refused: %v", c.at, err)
		}
		if err := checkBounds("f.toml", []byte(c.over+"\n"), fileLimits); err == nil {
			t.Errorf("%.60q... passed", c.over)
		}
	}
}

// What is not a value's nesting or a key is not counted: brackets, braces
// and dots in strings of every kind (escapes and quotes inside them too)
// and in comments.
func TestBoundsScanSkipsStringsAndComments(t *testing.T) {
	deep := strings.Repeat("[{.", 100)
	for _, src := range []string{
		"# " + deep + "\n",
		"x = \"" + deep + "\\\"" + deep + "\"\n",
		"x = '" + deep + "\\'\n",
		"x = \"\"\"\n" + deep + "\n\\\"\"\"" + deep + "\n\"\"\"\n",
		"x = \"\"\"" + deep + "\"\"\"\"\"\ny = 1\n",
		"x = '''\n" + deep + "\n'''\n",
		"x = '''" + deep + "'''''\ny = 2\n",
		"x = [ # " + deep + "\n 1, \"" + deep + "\",\n]\n",
		"x = { a = \"" + deep + "\", b = '" + deep + "' }\n",
		"\"" + strings.Repeat("a.", 100) + "\" = 1\n",
		"['" + strings.Repeat("a.", 100) + "']\n",
		"x = 1979-05-27T07:32:00Z\n[" + strings.Repeat("a.", MaxKeyParts-1) + "a]\n",
	} {
		if err := checkBounds("f.toml", []byte(src), fileLimits); err != nil {
			t.Errorf("%q refused: %v", src, err)
		}
	}
	// And the line of a refusal after multi-line strings and comments
	// is the one the decoder counts.
	src := "x = \"\"\"\na\\\nb\"\"\"\ny = '''\n\n'''\n# c\nz = [\n1,\n" + strings.Repeat("[", 40) + "\n"
	err := checkBounds("f.toml", []byte(src), fileLimits)
	if err == nil || err.Line != 10 || err.Key != "z" {
		t.Errorf("refusal %v, want at line 10, key z", err)
	}
}

// No valid configuration is refused: the default file, the shipped one with
// every line uncommented (headers too), each file of testdata and each
// seed of FuzzParse pass the scan, so they load exactly as before.
func TestBoundsPassEveryConfiguration(t *testing.T) {
	srcs := map[string][]byte{"default.toml": DefaultTOML()}
	var all []string
	for _, l := range shippedText() {
		all = append(all, strings.TrimPrefix(l, "# "))
	}
	srcs["uncommented"] = []byte(strings.Join(all, "\n"))
	files, _ := filepath.Glob("testdata/*/*.toml")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		srcs[p] = b
	}
	for i, s := range fuzzSeeds {
		srcs[fmt.Sprint("seed ", i)] = []byte(s)
	}
	for name, b := range srcs {
		if err := checkBounds(name, b, fileLimits); err != nil {
			t.Errorf("%s refused: %v", name, err)
		}
	}
}

// decodedDepth is how deep tables and arrays nest in a decoded value: a
// value nested n deep in a file, or a key of n parts, is at least n.
func decodedDepth(v any) int {
	d := 0
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			d = max(d, decodedDepth(e))
		}
	case []map[string]any:
		for _, e := range v {
			d = max(d, decodedDepth(e))
		}
	case []any:
		for _, e := range v {
			d = max(d, decodedDepth(e))
		}
	default:
		return 0
	}
	return d + 1
}

// boundsProperty checks what the scan does with data: under small bounds,
// a refusal is of a file over one of them (the decoder refuses the file,
// or what it decodes is nested deeper than the bound, or the refused line
// is longer than the key bound), and under the file's bounds Parse's result
// is the decoder's, as without the scan.
func boundsProperty(t *testing.T, data []byte) {
	small := limits{nesting: 3, parts: 3, keyBytes: 24}
	if err := checkBounds("fuzz.toml", data, small); err != nil {
		var doc map[string]any
		if _, derr := toml.Decode(string(data), &doc); derr == nil {
			switch {
			case strings.Contains(err.Msg, "nested more than"):
				if d := decodedDepth(doc); d <= small.nesting+1 {
					t.Fatalf("refused as nested over %d: %v; decoded %d deep", small.nesting, err, d)
				}
			case strings.Contains(err.Msg, "dotted parts"):
				if d := decodedDepth(doc); d <= small.parts {
					t.Fatalf("refused as over %d parts: %v; decoded %d deep", small.parts, err, d)
				}
			case strings.Contains(err.Msg, "bytes"):
				if len(data) <= small.keyBytes {
					t.Fatalf("refused as over %d bytes: %v; the file is shorter", small.keyBytes, err)
				}
			default:
				t.Fatalf("refused for no bound: %v", err)
			}
		}
	}
	bounded, berr := Parse("fuzz.toml", data, Default())
	if checkBounds("fuzz.toml", data, fileLimits) != nil {
		return
	}
	free, ferr := parse("fuzz.toml", data, Default, limits{nesting: 1 << 30, parts: 1 << 30, keyBytes: 1 << 30})
	if fmt.Sprint(berr) != fmt.Sprint(ferr) {
		t.Fatalf("error with the bounds %v, without %v", berr, ferr)
	}
	if berr == nil && len(Diff(bounded, free)) != 0 {
		t.Fatalf("with the bounds and without differ in %v", Diff(bounded, free))
	}
}

// A file both wrong in its syntax and over a bound further on is refused
// for what comes first in it, the syntax error at its line, as the
// decoder reads a file: the bound's refusal of a later line would send
// the operator past the first mistake (which may be what makes the rest
// read as over the bound: an unclosed header, an unclosed string). A
// bound over at a line before the syntax error is refused as a bound.
func TestSyntaxErrorBeforeABoundIsNamedFirst(t *testing.T) {
	deepKey := strings.Repeat("a.", MaxKeyParts) + "a = 1\n"
	deepValue := "x = " + strings.Repeat("[", MaxNesting+1) + strings.Repeat("]", MaxNesting+1) + "\n"
	for in, want := range map[string]string{
		"[log\n" + deepKey:                                        `f.toml:1: key log: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		"host_root = \"/\n" + deepValue:                           `f.toml:1: key host_root: strings cannot contain newlines`,
		"role = = \"worker\"\n" + deepValue:                       `f.toml:1: key role: expected value but found '=' instead`,
		"role = \"worker\"\nrole = \"\"\n" + deepKey:              `f.toml:2: key role: Key 'role' has already been defined (first at line 1: a key or table is defined once)`,
		"# fine\n[log]\nlevel = \"info\"\n[metrics\n" + deepValue: `f.toml:4: key metrics: syntax error: expected '.' or ']' to end table name, but got '\n' instead`,
		// A syntax error within the statement the bound is over, before
		// the part over it (a value written over several lines, as an
		// inline table may be in TOML 1.1): the syntax error, at its
		// line. A closing bracket of the other kind, a string its line
		// ends in.
		"[log]\nlevel = \"info\"\nx = { a = 1,\n b = [ }\n" + deepValue:   `f.toml:4: key log.x.b: expected value but found '}' instead`,
		"[log]\nlevel = \"info\"\nx = { a = \"abc\n b = " + deepValue[4:]: `f.toml:3: key log.x.a: strings cannot contain newlines`,
		// The bound first, then the syntax error: the bound.
		deepValue + "[log\n":                  `f.toml:1: key x: arrays and inline tables nested more than 32 deep: not read (a configuration's deepest value is 3 levels)`,
		"[log]\n" + deepKey + "level = = 1\n": `f.toml:2: key log.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a....: a key of more than 16 dotted parts with its table's: not read (a configuration's keys have at most 3)`,
	} {
		_, err := Parse("f.toml", []byte(in), Default())
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%.50q...: error %v is not a *config.Error", in, err)
			continue
		}
		if err.Error() != want {
			t.Errorf("%.50q...:\n got: %s\nwant: %s", in, err, want)
		}
	}
}
