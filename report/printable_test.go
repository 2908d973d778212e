package report

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// What a message may carry: every byte of a character that is not printable
// as \xNN, the form /dev/kmsg gives it and dmesg shows; printable text
// (UTF-8 too) and the backslash kept.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"":                        "",
		"INFO: task kubelet:128":  "INFO: task kubelet:128",
		"task \x1b]0;pwn\x07:1":   `task \x1b]0;pwn\x07:1`,
		"clear\x1b[2J":            `clear\x1b[2J`,
		"line\nforged: line":      `line\x0aforged: line`,
		"cr\rtab\tnul\x00del\x7f": `cr\x0dtab\x09nul\x00del\x7f`,
		"csi \u009b2J":            `csi \xc2\x9b2J`, // C1 CSI, as UTF-8
		"bad \xff\xc3 utf-8":      `bad \xff\xc3 utf-8`,
		"rlo \u202etxt.exe":       `rlo \xe2\x80\xaetxt.exe`, // a bidi override
		"ls \u2028sep":            `ls \xe2\x80\xa8sep`,
		`back\slash \x41`:         `back\slash \x41`,
		"grüße, 日本, ✓, \uFFFD":    "grüße, 日本, ✓, \uFFFD",
		"nbsp\u00a0ok":            "nbsp\u00a0ok",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// The store publishes every message so: a condition's (Set and a part's,
// SetPart), an Event's, one carried over from the Node (Adopt), and one
// restored from the state file.
func TestStoreKeepsMessagesPrintable(t *testing.T) {
	s := NewStore("boot1")
	var evs []Event
	s.Observe(eventsOf(func(e Event) { evs = append(evs, e) }))
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", "/mnt/\x1b]0;x\x07 95%"), t0)
	if c, _ := s.Get("DiskUsageHigh"); c.Message != `/mnt/\x1b]0;x\x07 95%` {
		t.Errorf("Set: %q", c.Message)
	}
	s.SetPart(SourceCheck, cond("DisksFailure", StatusTrue, "NVMeCriticalWarning", "nvme0:\n\x1b[2J"), t0)
	if c, _ := s.Get("DisksFailure"); c.Message != `nvme0:\x0a\x1b[2J` {
		t.Errorf("SetPart: condition %q", c.Message)
	}
	if p, _ := s.Part(SourceCheck, "DisksFailure"); p.Message != `nvme0:\x0a\x1b[2J` {
		t.Errorf("SetPart: part %q", p.Message)
	}
	s.Emit(Event{Reason: "TaskHung", Message: "INFO: task \x1b[2J:1 blocked for more than 120 seconds.", Time: t0})
	if len(evs) != 1 || evs[0].Message != `INFO: task \x1b[2J:1 blocked for more than 120 seconds.` {
		t.Errorf("Emit: %q", evs)
	}
	// One carried over from the Node at start (an earlier build wrote it raw).
	s.Adopt(cond("KernelDeadlock", StatusTrue, "CriticalTaskHung", "INFO: task \x1b[2J:1 blocked\n"), "")
	if c, _ := s.Get("KernelDeadlock"); c.Message != `INFO: task \x1b[2J:1 blocked\x0a` {
		t.Errorf("Adopt: %q", c.Message)
	}
	// Escaping comes before the cap: the cap still holds, and it does not
	// cut a \xNN in two.
	s.Set(cond("DiskUsageHigh", StatusTrue, "FilesystemSpaceHigh", strings.Repeat("\x1b", MaxMessageLen)), t0)
	if c, _ := s.Get("DiskUsageHigh"); len(c.Message) > MaxMessageLen || !strings.HasPrefix(c.Message, `\x1b\x1b`) || !strings.HasSuffix(c.Message, `\x1b...(truncated)`) {
		t.Errorf("a long message: %d bytes, %.20q...", len(c.Message), c.Message)
	}
}

// A state file an earlier build wrote holds the raw text: restored, it is
// made printable as a new message is.
func TestLoadMakesRestoredMessagesPrintable(t *testing.T) {
	dir := t.TempDir()
	raw := "INFO: task \x1b[2J:1 blocked for more than 120 seconds."
	writeStateFile(t, dir, stateFile{Version: stateVersion, BootID: "boot1", SavedAt: t0,
		Conditions: []Condition{{Type: "KernelDeadlock", Status: StatusTrue, Reason: "CriticalTaskHung", Message: raw, LastTransitionTime: t0, LastUpdateTime: t0}},
	})
	s := NewStore("boot1")
	if res, err := s.Load(dir); err != nil || res.Restored != 1 {
		t.Fatalf("Load = %+v, %v", res, err)
	}
	if c, _ := s.Get("KernelDeadlock"); c.Message != `INFO: task \x1b[2J:1 blocked for more than 120 seconds.` {
		t.Errorf("restored %q", c.Message)
	}
}

type eventsOf func(Event)

func (eventsOf) ConditionChanged(*Condition, Condition) {}
func (eventsOf) ConditionRestored(Condition)            {}
func (f eventsOf) EventEmitted(e Event)                 { f(e) }

// Printable's result is valid UTF-8 of graphic characters and spaces only,
// Printable of it is itself, and the kernel's unescaping (\xNN decoded, as
// kmsg.Unescape does) gives back the input when it held no "\x" of its own.
func FuzzPrintable(f *testing.F) {
	for _, s := range []string{"", "plain", "a\x1b[2J\nb", "\u009b\xff\xc3", "日本\u202e", `\x41`, "\t\r\x00\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := Printable(s)
		if !utf8.ValidString(p) {
			t.Fatalf("Printable(%q) = %q: not valid UTF-8", s, p)
		}
		for _, r := range p {
			if r != ' ' && !unicode.IsGraphic(r) {
				t.Fatalf("Printable(%q) = %q holds %U", s, p, r)
			}
		}
		if again := Printable(p); again != p {
			t.Fatalf("Printable(%q) = %q, and Printable of that %q", s, p, again)
		}
		if !strings.Contains(s, `\x`) {
			if back := unescapeHex(p); back != s {
				t.Fatalf("Printable(%q) = %q, unescaped %q", s, p, back)
			}
		}
	})
}

// unescapeHex decodes \xNN as the kernel log's reader does.
func unescapeHex(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			h, l := strings.IndexByte(hexDigits, s[i+2]), strings.IndexByte(hexDigits, s[i+3])
			if h >= 0 && l >= 0 {
				b = append(b, byte(h<<4|l))
				i += 3
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

// PrintableJSON keeps the JSON value and writes what is not printable as
// \u escapes: DEL, the C1 controls, a bidi override, a character past the
// BMP that is not graphic (a tag character) as its surrogate pair.
func TestPrintableJSON(t *testing.T) {
	for in, want := range map[string]string{
		`{"path":"/etc/cni/net.d/x"}`:              `{"path":"/etc/cni/net.d/x"}`,
		"{\"path\":\"a\x7fb\u009b2J\u202e\"}":      `{"path":"a\u007fb\u009b2J\u202e"}`,
		"[\"grüße 日本 \U0001F600\",\"\U000E0041\"]": "[\"grüße 日本 \U0001F600\",\"\\udb40\\udc41\"]",
		"{\n  \"a\": \"\\u001b\"\n}":               "{\n  \"a\": \"\\u001b\"\n}",
	} {
		if got := string(PrintableJSON([]byte(in))); got != want {
			t.Errorf("PrintableJSON(%q) = %q, want %q", in, got, want)
		}
	}
}

// A report document names files anyone may name (the tamper domain's
// findings): its annotation value, which `kubectl describe node` prints,
// holds a C1 control or DEL of a name as a \u escape (encoding/json wrote
// them raw; the C0 ones it escapes itself), and still decodes to the name.
func TestDocumentsArePrintable(t *testing.T) {
	d := NewDetails()
	name := "/etc/cni/net.d/00-\u009b2J\x1b]0;x\x07\x7f.conflist"
	d.Set(Detail{Domain: "tamper", Field: "tamper", Value: []map[string]string{{"path": name}}})
	docs, err := d.Documents(t0, RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	doc := docs[AnnotationPrefix+"tamper"]
	if want := `"path":"/etc/cni/net.d/00-\u009b2J\u001b]0;x\u0007\u007f.conflist"`; !strings.Contains(doc, want) {
		t.Errorf("tamper document %s\nwant it to hold %s", doc, want)
	}
	var back struct {
		Tamper []map[string]string `json:"tamper"`
	}
	if err := json.Unmarshal([]byte(doc), &back); err != nil || len(back.Tamper) != 1 || back.Tamper[0]["path"] != name {
		t.Errorf("tamper document decodes to %+v (%v), want the path %q", back, err, name)
	}
}

// Whatever string encoding/json writes, PrintableJSON of it is the same
// value, holds only printable characters and is its own PrintableJSON.
func FuzzPrintableJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "a\x1b[2J\nb\x7f", "\u009b\xff\xc3", "日本\u202e", "\U000E0041\U0001F600"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := json.Marshal(map[string]any{"s": s, "l": []string{s, "x"}})
		if err != nil {
			t.Fatal(err)
		}
		p := PrintableJSON(b)
		var v1, v2 any
		if err := json.Unmarshal(b, &v1); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(p, &v2); err != nil {
			t.Fatalf("PrintableJSON(%s) = %s: %v", b, p, err)
		}
		if !reflect.DeepEqual(v1, v2) {
			t.Fatalf("PrintableJSON(%s) = %s: another value", b, p)
		}
		for _, r := range string(p) {
			if r != ' ' && !unicode.IsGraphic(r) {
				t.Fatalf("PrintableJSON(%s) = %s holds %U", b, p, r)
			}
		}
		if again := PrintableJSON(p); string(again) != string(p) {
			t.Fatalf("PrintableJSON of %s is %s", p, again)
		}
	})
}
