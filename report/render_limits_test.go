package report

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// A domain's list is capped at MaxListLen entries, the count left out in
// <field>Truncated; a document over MaxDocumentBytes is shortened further
// (the largest cap under which it fits) until it fits; a list inside an
// entry is not cut.
func TestDocumentListLimits(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type fs struct {
		MountPoint string `json:"mountPoint"`
		Pad        string `json:"pad,omitempty"`
	}
	type vg struct {
		Name      string   `json:"name"`
		ThinPools []string `json:"thinPools"`
	}
	decode := func(b []byte) map[string]json.RawMessage {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	count := func(raw json.RawMessage) int {
		var xs []json.RawMessage
		json.Unmarshal(raw, &xs)
		return len(xs)
	}

	// 40 small entries: 32 kept, 8 counted out.
	many := make([]fs, 40)
	for i := range many {
		many[i] = fs{MountPoint: "/m" + strings.Repeat("x", i%3)}
	}
	b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"filesystems": many}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := decode(b)
	if n := count(m["filesystems"]); n != MaxListLen {
		t.Errorf("%d entries kept, want %d", n, MaxListLen)
	}
	if string(m["filesystemsTruncated"]) != "8" {
		t.Errorf("filesystemsTruncated = %s, want 8", m["filesystemsTruncated"])
	}

	// 20 entries of 1 KB each: under the cap, over 8 KiB: shortened to
	// fit, the rest counted.
	big := make([]fs, 20)
	for i := range big {
		big[i] = fs{MountPoint: "/big", Pad: strings.Repeat("p", 1000)}
	}
	b, err = renderDocument(now, RoleWorker, "boot", map[string]any{"filesystems": big}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxDocumentBytes {
		t.Errorf("document of %d bytes, over %d", len(b), MaxDocumentBytes)
	}
	m = decode(b)
	kept := count(m["filesystems"])
	var left int
	json.Unmarshal(m["filesystemsTruncated"], &left)
	if kept == 0 || kept >= 20 || kept+left != 20 {
		t.Errorf("%d kept, %d counted out of 20", kept, left)
	}

	// A list inside an entry is not cut.
	pools := make([]string, 40)
	for i := range pools {
		pools[i] = "p"
	}
	b, err = renderDocument(now, RoleWorker, "boot", map[string]any{"volumeGroups": []vg{{Name: "vg0", ThinPools: pools}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		VolumeGroups []vg `json:"volumeGroups"`
	}
	json.Unmarshal(b, &doc)
	if len(doc.VolumeGroups) != 1 || len(doc.VolumeGroups[0].ThinPools) != 40 {
		t.Errorf("volume groups %+v", doc.VolumeGroups)
	}
}

// A document over MaxDocumentBytes keeps as many entries as fit, not half
// of them: on a node with 24 NVMe drives whose entries come to a little
// over 8 KiB, one or two drives are left out, not eight (halving the cap
// from 32 to 16 left a third of the drives, the failing one possibly
// among them, out of a 5 KiB document).
func TestDocumentKeepsAsManyEntriesAsFit(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type disk struct {
		Controller string `json:"controller"`
		Model      string `json:"model"`
		Serial     string `json:"serial"`
		Pad        string `json:"pad"`
	}
	disks := make([]disk, 24)
	for i := range disks {
		disks[i] = disk{Controller: "nvme" + strings.Repeat("1", 1+i/10), Model: strings.Repeat("M", 40), Serial: strings.Repeat("S", 20), Pad: strings.Repeat("p", 260)}
	}
	entry, _ := json.Marshal(disks[0])
	b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"disks": disks}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxDocumentBytes {
		t.Fatalf("document of %d bytes, over %d", len(b), MaxDocumentBytes)
	}
	var doc struct {
		Disks          []disk `json:"disks"`
		DisksTruncated int    `json:"disksTruncated"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	kept := len(doc.Disks)
	if kept+doc.DisksTruncated != len(disks) {
		t.Errorf("%d kept, %d counted out of %d", kept, doc.DisksTruncated, len(disks))
	}
	// One entry more (its bytes and a comma; the count left out one digit
	// shorter at most) would not have fit.
	if kept >= len(disks) || len(b)+len(entry)+1-1 <= MaxDocumentBytes {
		t.Errorf("%d of %d entries kept in %d bytes (an entry is %d): one more fits under %d", kept, len(disks), len(b), len(entry), MaxDocumentBytes)
	}
}

// problemEntry is a list entry that knows whether it is a problem (a
// failing drive, a full filesystem), as the checks' entries do.
type problemEntry struct {
	Name string `json:"name"`
	Bad  bool   `json:"bad,omitempty"`
	Pad  string `json:"pad,omitempty"`
}

func (e problemEntry) Problem() bool { return e.Bad }

// A list that must be cut keeps its problem entries first: a failing
// drive, a full filesystem listed after the first 32 (or after as many as
// fit in 8 KiB) is in the document the condition that names it points
// to; the others fill the rest in list order, and the kept entries keep
// their order. Nothing is reordered when nothing is cut.
func TestDocumentCutKeepsProblemEntries(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	names := func(es []problemEntry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Name)
		}
		return out
	}
	render := func(es []problemEntry) ([]problemEntry, int, int) {
		t.Helper()
		b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"disks": es}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Disks          []problemEntry `json:"disks"`
			DisksTruncated int            `json:"disksTruncated"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		return doc.Disks, doc.DisksTruncated, len(b)
	}
	for _, tc := range []struct {
		name string
		n    int
		pad  int
		bad  []int // indices of the problem entries
	}{
		{"over the list cap", 40, 0, []int{33, 39}},
		{"over 8 KiB", 24, 360, []int{5, 22, 23}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := make([]problemEntry, tc.n)
			bad := map[string]bool{}
			for i := range es {
				es[i] = problemEntry{Name: fmt.Sprintf("nvme%d", i), Pad: strings.Repeat("p", tc.pad)}
			}
			for _, i := range tc.bad {
				es[i].Bad = true
				bad[es[i].Name] = true
			}
			kept, left, size := render(es)
			if size > MaxDocumentBytes {
				t.Fatalf("document of %d bytes", size)
			}
			if len(kept) >= tc.n || len(kept)+left != tc.n {
				t.Fatalf("%d kept, %d counted out of %d", len(kept), left, tc.n)
			}
			// Every problem entry, then the first others in list order,
			// written in list order.
			var want []string
			others := len(kept) - len(tc.bad)
			for _, e := range es {
				if e.Bad {
					want = append(want, e.Name)
				} else if others > 0 {
					want = append(want, e.Name)
					others--
				}
			}
			if got := names(kept); !slices.Equal(got, want) {
				t.Errorf("kept %v, want %v (problem entries %v)", got, want, tc.bad)
			}
		})
	}

	// More problem entries than fit: the first of them, in order.
	es := make([]problemEntry, 40)
	for i := range es {
		es[i] = problemEntry{Name: fmt.Sprintf("fs%d", i), Bad: i >= 4}
	}
	kept, left, _ := render(es)
	if len(kept) != MaxListLen || left != 8 || kept[0].Name != "fs4" || kept[MaxListLen-1].Name != "fs35" {
		t.Errorf("kept %v, %d left out", names(kept), left)
	}

	// Nothing cut: the list as it is, problem entries where they are.
	es = es[:10]
	kept, left, _ = render(es)
	if !slices.Equal(names(kept), names(es)) || left != 0 {
		t.Errorf("uncut list written as %v (%d left out), want %v", names(kept), left, names(es))
	}
}

// A list a check collected empty is written [], never null: to jq (.certs,
// .certs[] | ...) and to a Go client decoding into a slice, null is what an
// absent field reads as too, so a node with no certificate configured or no
// filesystem measured would read as "no data yet", and `.certs[]` would
// stop with "Cannot iterate over null". The field is there: the check
// answered "none".
func TestDocumentEmptyListIsNotNull(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, limit := range []int{MaxListLen, 0} {
		b, err := renderCapped(now, RoleWorker, "boot", map[string]any{
			"filesystems": []problemEntry(nil), "volumeGroups": []problemEntry{},
		}, nil, limit)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"filesystems", "volumeGroups"} {
			if string(m[f]) != "[]" {
				t.Errorf("limit %d: %s = %s, want []\n%s", limit, f, m[f], b)
			}
			if _, ok := m[f+"Truncated"]; ok {
				t.Errorf("limit %d: %sTruncated in %s", limit, f, b)
			}
		}
	}
}

// One oversized entry (a mount point of kilobytes, a drive's error of
// kilobytes) costs only itself: its long strings are shortened, ending in
// "…", instead of the cap of every list in its document being lowered
// until it fits. Fails when the document is cut to the common cap: 20
// filesystems and 20 volume groups that fit in 8 KiB lost their last ones
// to a 3,000-byte mount point, and a failing drive with a 9,000-byte error,
// kept first, left no drive at all in the disks document.
func TestOneHugeEntryCostsOnlyItself(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type fs struct {
		MountPoint  string `json:"mountPoint"`
		FSType      string `json:"fsType"`
		Source      string `json:"source"`
		SizeBytes   uint64 `json:"sizeBytes"`
		AvailBytes  uint64 `json:"availBytes"`
		UsedPercent int    `json:"usedPercent"`
	}
	type vg struct {
		Name      string `json:"name"`
		SizeBytes uint64 `json:"sizeBytes"`
		FreeBytes uint64 `json:"freeBytes"`
	}
	type doc struct {
		Filesystems           []fs           `json:"filesystems"`
		FilesystemsTruncated  int            `json:"filesystemsTruncated"`
		VolumeGroups          []vg           `json:"volumeGroups"`
		VolumeGroupsTruncated int            `json:"volumeGroupsTruncated"`
		Disks                 []problemEntry `json:"disks"`
		DisksTruncated        int            `json:"disksTruncated"`
	}
	render := func(t *testing.T, fields map[string]any) (doc, int) {
		t.Helper()
		b, err := renderDocument(now, RoleWorker, "boot", fields, nil)
		if err != nil {
			t.Fatal(err)
		}
		var d doc
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		if len(b) > MaxDocumentBytes {
			t.Fatalf("document of %d bytes, over %d", len(b), MaxDocumentBytes)
		}
		return d, len(b)
	}

	t.Run("a long mount point", func(t *testing.T) {
		fss := make([]fs, 20)
		for i := range fss {
			fss[i] = fs{MountPoint: fmt.Sprintf("/var/lib/kubelet/pods/%02d", i), FSType: "ext4", Source: fmt.Sprintf("/dev/sd%c1", 'a'+i),
				SizeBytes: 1 << 40, AvailBytes: 1 << 39, UsedPercent: 50}
		}
		vgs := make([]vg, 20)
		for i := range vgs {
			vgs[i] = vg{Name: fmt.Sprintf("vg%02d", i), SizeBytes: 1 << 40, FreeBytes: 1 << 30}
		}
		// Without the long one, everything fits.
		if d, _ := render(t, map[string]any{"filesystems": fss, "volumeGroups": vgs}); len(d.Filesystems) != 20 || len(d.VolumeGroups) != 20 {
			t.Fatalf("without the long mount point: %d filesystems, %d volume groups kept", len(d.Filesystems), len(d.VolumeGroups))
		}
		long := "/mnt/" + strings.Repeat("deep/", 800) // under PATH_MAX (4,096)
		fss[7].MountPoint = long
		d, size := render(t, map[string]any{"filesystems": fss, "volumeGroups": vgs})
		if len(d.Filesystems) != 20 || d.FilesystemsTruncated != 0 || len(d.VolumeGroups) != 20 || d.VolumeGroupsTruncated != 0 {
			t.Fatalf("a %d-byte mount point: %d filesystems (%d left out), %d volume groups (%d left out) kept in %d bytes; want all 20 and 20",
				len(long), len(d.Filesystems), d.FilesystemsTruncated, len(d.VolumeGroups), d.VolumeGroupsTruncated, size)
		}
		got := d.Filesystems[7].MountPoint
		if len(got) >= len(long) || !strings.HasSuffix(got, "…") || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) || len(got) < 64 {
			t.Errorf("the long mount point written as %q (%d bytes), want its start, shortened, ending in …", got, len(got))
		}
		if fss[7].MountPoint != long {
			t.Error("the collected entry was changed: the document's shortening must work on a copy")
		}
		for i, f := range d.Filesystems {
			if i != 7 && f != fss[i] {
				t.Errorf("filesystem %d written as %+v, want %+v", i, f, fss[i])
			}
		}
	})

	// Strings in an embedded struct and behind a pointer (a unit's
	// fields in ServiceState) are shortened too, on copies.
	t.Run("nested", func(t *testing.T) {
		type Unit struct {
			Name string `json:"name"`
		}
		type svc struct {
			Unit
			Why *string `json:"why,omitempty"`
		}
		why := strings.Repeat("w", 5000)
		svcs := []svc{{Unit{strings.Repeat("u", 5000)}, &why}, {Unit{"b.service"}, nil}}
		short, changed := shortenEntries(map[string]any{"services": svcs})
		got := short["services"].([]svc)
		if !changed || len(got[0].Name) > MaxEntryBytes || len(*got[0].Why) > MaxEntryBytes || got[1].Name != "b.service" {
			t.Errorf("shortened to %d-byte name, %d-byte why; second %+v", len(got[0].Name), len(*got[0].Why), got[1])
		}
		if b, _ := json.Marshal(got[0]); len(b) > MaxEntryBytes {
			t.Errorf("entry of %d bytes after shortening", len(b))
		}
		if len(svcs[0].Name) != 5000 || len(why) != 5000 || svcs[0].Why != &why {
			t.Error("the collected entry was changed")
		}
	})

	t.Run("a failing drive's long error", func(t *testing.T) {
		disks := make([]problemEntry, 10)
		for i := range disks {
			disks[i] = problemEntry{Name: fmt.Sprintf("nvme%d", i)}
		}
		disks[4] = problemEntry{Name: "nvme4", Bad: true, Pad: "SMART page not read: " + strings.Repeat("x", 9000)}
		d, _ := render(t, map[string]any{"disks": disks})
		if len(d.Disks) != 10 || d.DisksTruncated != 0 {
			t.Fatalf("%d drives kept, %d left out; want all 10", len(d.Disks), d.DisksTruncated)
		}
		if got := d.Disks[4]; !got.Bad || !strings.HasPrefix(got.Pad, "SMART page not read: x") || !strings.HasSuffix(got.Pad, "…") {
			t.Errorf("the failing drive written as %+v", got)
		}
	})
}

// A long string that is not valid UTF-8 (a mount point a tool wrote in
// Latin-1: "°" is the byte 0xB0, which UTF-8 reads as a continuation
// byte) keeps its start when an oversized entry is shortened: the cut
// steps back to a rune's start only over the bytes one rune can have, not
// over the whole run of such bytes, which left "/srv/…" of a 4,000-byte
// name, under the 64 bytes README promises, and every such name the same.
func TestShortenedInvalidUTF8KeepsItsStart(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type fs struct {
		MountPoint string `json:"mountPoint"`
		Source     string `json:"source"`
	}
	long := "/srv/" + strings.Repeat("\xb0", 4000)
	fss := []fs{{MountPoint: long, Source: "/dev/sda1"}, {MountPoint: "/var", Source: "/dev/sdb1"}}
	b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"filesystems": fss}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Filesystems []fs `json:"filesystems"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Filesystems) != 2 {
		t.Fatalf("%d filesystems kept, want 2", len(d.Filesystems))
	}
	// The document writes each invalid byte as `\xNN` (utf8Fields).
	got := []rune(strings.TrimSuffix(d.Filesystems[0].MountPoint, "…"))
	if kept := len(got) - len("/srv/"); kept < minShortString-2*utf8.UTFMax {
		t.Errorf("the %d-byte mount point written as %q: %d of its bytes kept, want about %d (not under %d bytes)",
			len(long), d.Filesystems[0].MountPoint, kept, minShortString, minShortString)
	}
	for _, s := range []string{strings.Repeat("\xb0", 300), "ab" + strings.Repeat("€", 100), "a" + strings.Repeat("😀é", 60), strings.Repeat("\xe2\x82", 100), "x" + strings.Repeat("é\xb0\xb0", 60)} {
		for n := minShortString; n < 80; n++ {
			c := truncateString(s, n)
			if len(c) > n || len(c) < n-utf8.UTFMax || !strings.HasSuffix(c, "…") || !strings.HasPrefix(s, strings.TrimSuffix(c, "…")) {
				t.Errorf("truncateString(%q..., %d) = %q (%d bytes)", s[:8], n, c, len(c))
			}
			if utf8.ValidString(s) && !utf8.ValidString(c) {
				t.Errorf("truncateString of valid UTF-8 cut a rune: %q", c)
			}
		}
	}
}

// Cut is what every cut of a string for a message, a report or systemd's
// status line uses (tamper's paths, NodeTampered's message, STATUS=): a
// path that is not UTF-8, a run of bytes 0x80-0xBF (Latin-1's "°"), keeps
// its start up to the cut; the copies of the cut it replaced stepped back
// over the whole run, so every such name read "/etc/…".
func TestCutKeepsTheStartOfInvalidUTF8(t *testing.T) {
	s := "/etc/protected/" + strings.Repeat("\xb0", 300)
	for _, n := range []int{64, 128, 256} {
		for _, ell := range []string{"…", "..."} {
			c := Cut(s, n, ell)
			if len(c) > n || len(c) < n-len(ell)-3 || !strings.HasSuffix(c, ell) || !strings.HasPrefix(c, "/etc/protected/\xb0") {
				t.Errorf("Cut(%d, %q) = %q (%d bytes), want about %d bytes of the start", n, ell, c, len(c), n)
			}
		}
	}
	// Valid UTF-8 is never cut inside a rune.
	for n := 10; n < 20; n++ {
		if c := Cut("/etc/"+strings.Repeat("°", 20), n, "…"); !utf8.ValidString(c) || len(c) > n {
			t.Errorf("Cut(%d) = %q", n, c)
		}
	}
}

// An oversized entry's long string that is not UTF-8 is shortened after
// its bytes are written `\xNN` (utf8Fields): the cut does not split a
// `\xNN` (a name ending "\xb…" or "\x…"), as a message's cap does not
// (CapMessage), whatever the length of the name's start.
func TestShortenedNameNotUTF8KeepsWholeEscapes(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type fs struct {
		MountPoint string `json:"mountPoint"`
		Source     string `json:"source"`
	}
	for k := range 4 {
		long := "/srv/" + strings.Repeat("a", k) + strings.Repeat("\xb0", 4000)
		fss := []fs{{MountPoint: long, Source: "/dev/sda1"}, {MountPoint: "/var", Source: "/dev/sdb1"}}
		b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"filesystems": fss}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Filesystems []fs `json:"filesystems"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatal(err)
		}
		mp := d.Filesystems[0].MountPoint
		kept, cut := strings.CutSuffix(mp, "…")
		rest := strings.TrimPrefix(kept, "/srv/"+strings.Repeat("a", k))
		if !cut || len(kept) < minShortString-utf8.UTFMax || strings.ReplaceAll(rest, `\xb0`, "") != "" {
			t.Errorf("start %d bytes: the mount point written as %q, want whole \\xb0s up to the \"…\"", 5+k, mp)
		}
	}
}

// A name that holds the text `\xe9` itself reads in the document as a
// Latin-1 "é" does, as in the message (Printable keeps a backslash, the
// kernel's and dmesg's form): the two are one name in both, as README
// says; the document does not tell them apart where the message cannot.
func TestNameWithTheTextOfAnEscapeReadsAsTheByte(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	byteName, textName := "/etc/cni/net.d/caf\xe9", `/etc/cni/net.d/caf\xe9`
	render := func(name string) string {
		b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"tamper": struct {
			Path string `json:"path"`
		}{name}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if a, b := render(byteName), render(textName); a != b {
		t.Errorf("documents differ: %s and %s", a, b)
	}
	if Printable(byteName) != Printable(textName) {
		t.Errorf("messages differ: %q and %q", Printable(byteName), Printable(textName))
	}
}

// The cost of utf8Fields on a full report of valid UTF-8 (the usual
// case: it walks every string, copies nothing) and of one whose every
// name is Latin-1 (every entry copied), and of the document's whole render:
// go test ./report -run '^$' -bench BenchmarkUTF8Fields -benchmem
func BenchmarkUTF8Fields(b *testing.B) {
	type change struct {
		Condition string    `json:"condition,omitempty"`
		Path      string    `json:"path"`
		Kind      string    `json:"kind"`
		At        time.Time `json:"at"`
	}
	type tamper struct {
		BootID  string   `json:"bootID"`
		Changes []change `json:"changes"`
	}
	for _, tc := range []struct{ name, suffix string }{{"utf8", "é"}, {"latin1", "\xe9"}} {
		var tm tamper
		for i := range MaxListLen {
			tm.Changes = append(tm.Changes, change{Condition: "NodeTampered", Path: fmt.Sprintf("/etc/cni/net.d/%03d-caf%s.conflist", i, tc.suffix), Kind: "added"})
		}
		fields := map[string]any{"tamper": tm}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				utf8Fields(fields)
			}
		})
		// The whole document's render, for scale.
		b.Run(tc.name+"/render", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				renderDocument(time.Time{}, RoleWorker, "boot", fields, nil)
			}
		})
	}
}
