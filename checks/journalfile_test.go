package checks

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// nativeJournalRoot unpacks the journal files a real journald (systemd 252)
// wrote for TestNativeJournalReaderMatchesJournalctl (tests/) into a host
// root, and returns it with journalctl's reading of them: kubelet.service's
// entries, everything.
func nativeJournalRoot(t testing.TB) (string, []journalEntry) {
	t.Helper()
	root := t.TempDir()
	f, err := os.Open("testdata/journalfile/journal.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	jf, err := os.Open("testdata/journalfile/journalctl.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer jf.Close()
	jz, err := gzip.NewReader(jf)
	if err != nil {
		t.Fatal(err)
	}
	var want []journalEntry
	sc := bufio.NewScanner(jz)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e journalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		want = append(want, e)
	}
	if len(want) < 1900 {
		t.Fatalf("%d entries in journalctl.json.gz", len(want))
	}
	return root, want
}

func readNative(t testing.TB, root string, q journalQuery) ([]journalEntry, journalRead, error) {
	t.Helper()
	q.Unit = "kubelet.service"
	var got []journalEntry
	r, err := readJournalNative(context.Background(), root, q, func(e journalEntry) { got = append(got, e) })
	return got, r, err
}

// The native reader on a real journald's files (compact, keyed hash, zstd,
// three files after rotations) gives what journalctl gave: everything, after
// cursors, with a bound.
func TestNativeJournalReadsRealFiles(t *testing.T) {
	root, want := nativeJournalRoot(t)
	got, r, err := readNative(t, root, journalQuery{Since: time.Unix(0, 0)})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("everything: %d entries (%v), want %d", len(got), err, len(want))
	}
	if r.Entries != len(want) || r.Cursor != want[len(want)-1].Cursor || r.Truncated {
		t.Errorf("read %+v", r)
	}
	for i := 0; i < len(want); i += 101 {
		got, _, err := readNative(t, root, journalQuery{After: want[i].Cursor})
		if err != nil || !reflect.DeepEqual(got, want[i+1:]) {
			t.Fatalf("after entry %d: %d entries (%v), want %d", i, len(got), err, len(want)-i-1)
		}
	}
	got, r, err = readNative(t, root, journalQuery{After: want[10].Cursor, Max: 7})
	if err != nil || !reflect.DeepEqual(got, want[11:18]) || !r.Truncated || r.Cursor != want[17].Cursor {
		t.Errorf("bounded: %d entries, %+v, %v", len(got), r, err)
	}
}

// journalCorruption changes a copy of the archived file with the most
// arrays; each is an error of the native reader, never a panic or a hang.
func TestNativeJournalCorruptFilesFallBack(t *testing.T) {
	root, _ := nativeJournalRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "run/log/journal/*/system@*-0000000000000001-*.journal"))
	if len(files) != 1 {
		t.Fatalf("archived file: %v", files)
	}
	orig, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	jf, err := openJournalFile(files[0], bytes.NewReader(orig), int64(len(orig)))
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := jf.findData([]byte("_SYSTEMD_UNIT=kubelet.service"))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	var arrays []uint64
	for a := d.entryArrayOffset; a != 0; {
		arrays = append(arrays, a)
		next, _, err := jf.entryArrayHeader(a)
		if err != nil {
			t.Fatal(err)
		}
		a = next
	}
	if len(arrays) < 4 {
		t.Fatalf("%d entry arrays", len(arrays))
	}
	le := binary.LittleEndian
	put64 := func(b []byte, off uint64, v uint64) { le.PutUint64(b[off:], v) }
	cases := map[string]struct {
		change func(b []byte) []byte
		want   error
		reason JournalFallbackReason // the label of autopilot_health_journal_fallbacks_total
	}{
		"truncated": {func(b []byte) []byte { return b[:len(b)/2] }, errJournalCorrupt, FallbackInconsistent},
		"empty":     {func(b []byte) []byte { return nil }, errJournalCorrupt, FallbackInconsistent},
		"unknown incompatible flag": {func(b []byte) []byte {
			le.PutUint32(b[12:], le.Uint32(b[12:])|1<<9)
			return b
		}, errJournalUnsupported, FallbackUnknownFormat},
		"not keyed-hashed": {func(b []byte) []byte {
			le.PutUint32(b[12:], le.Uint32(b[12:])&^jIncompatKeyedHash)
			return b
		}, errJournalUnsupported, FallbackNotKeyedHash},
		"XZ-compressed": {func(b []byte) []byte {
			le.PutUint32(b[12:], le.Uint32(b[12:])|jIncompatXZ)
			return b
		}, errJournalUnsupported, FallbackCompression},
		"LZ4-compressed": {func(b []byte) []byte {
			le.PutUint32(b[12:], le.Uint32(b[12:])|jIncompatLZ4)
			return b
		}, errJournalUnsupported, FallbackCompression},
		"entry array out of bounds":     {func(b []byte) []byte { put64(b, d.offset+48, uint64(len(b))+4096); return b }, errJournalCorrupt, FallbackInconsistent},
		"entry array of the wrong type": {func(b []byte) []byte { put64(b, d.offset+48, d.offset); return b }, errJournalCorrupt, FallbackInconsistent},
		"entry-array chain cycle":       {func(b []byte) []byte { put64(b, arrays[3]+16, arrays[1]); return b }, errJournalCorrupt, FallbackInconsistent},
		"entry array chain backwards":   {func(b []byte) []byte { put64(b, arrays[2]+16, arrays[0]); return b }, errJournalCorrupt, FallbackInconsistent},
		"entry offsets backwards": {func(b []byte) []byte {
			// The second array's first two items swapped (compact: le32).
			p := arrays[1] + jEntryArrayFixed
			x, y := le.Uint32(b[p:]), le.Uint32(b[p+4:])
			le.PutUint32(b[p:], y)
			le.PutUint32(b[p+4:], x)
			return b
		}, errJournalCorrupt, FallbackInconsistent},
		"hash chain out of bounds": {func(b []byte) []byte { put64(b, d.offset+24, 1<<40); return b }, nil, ""},
		"zstd value corrupt": {func(b []byte) []byte {
			i := bytes.Index(b, []byte{0x28, 0xb5, 0x2f, 0xfd}) // a zstd frame's magic
			b[i+5] ^= 0xff
			b[i+9] ^= 0xff
			return b
		}, errJournalCorrupt, FallbackInconsistent},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b := c.change(bytes.Clone(orig))
			if err := os.WriteFile(files[0], b, 0o644); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(files[0], orig, 0o644)
			_, _, err := readNative(t, root, journalQuery{Since: time.Unix(0, 0)})
			if c.want == nil {
				return // may or may not be reached by this read: no panic, no hang
			}
			if !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
			if r := fallbackReason(err); r != c.reason {
				t.Errorf("fallback reason %q, want %q (%v)", r, c.reason, err)
			}
		})
	}

	// The check falls back to journalctl, says why once, and counts each
	// run that fell back by its reason.
	if err := os.WriteFile(files[0], orig[:len(orig)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	fj := newFakeJournalctl(t)
	now := time.Now()
	env := heartbeatEnv(t, root, fj, &now)
	var logs testenv.SyncBuffer
	env.Log = slog.New(slog.NewTextHandler(&logs, nil))
	reg := prometheus.NewRegistry()
	env.JournalFallbacks = NewJournalFallbacks(reg)
	fallbacks := func(inconsistent int) {
		t.Helper()
		exp := "# HELP autopilot_health_journal_fallbacks_total Runs of KubeletHeartbeatFailed that read the journal with journalctl because the native reader of journald's files could not, by reason (compression, not-keyed-hash, unknown-format, cursor, layout, order, inconsistent, error).\n" +
			"# TYPE autopilot_health_journal_fallbacks_total counter\n"
		for _, r := range []string{"compression", "cursor", "error", "inconsistent", "layout", "not-keyed-hash", "order", "unknown-format"} {
			n := 0
			if r == "inconsistent" {
				n = inconsistent
			}
			exp += fmt.Sprintf("autopilot_health_journal_fallbacks_total{reason=%q} %d\n", r, n)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "autopilot_health_journal_fallbacks_total"); err != nil {
			t.Error(err)
		}
	}
	fallbacks(0) // every reason's series from the start
	c, _ := newKubeletHeartbeatCheck(env)
	for i := 1; i <= 2; i++ {
		fj.serve(t, i, []int{1})
		if r, err := c.Probe(context.Background()); err != nil || r.Status != report.StatusFalse {
			t.Fatalf("run %d: %+v %v", i, r, err)
		}
		fj.args(t, i) // journalctl ran
		fallbacks(i)
	}
	if n := strings.Count(logs.String(), "reading the journal with journalctl"); n != 1 || !strings.Contains(logs.String(), "journal file inconsistent") {
		t.Errorf("%d fallback lines for 2 runs falling back the same way, want 1:\n%s", n, logs.String())
	}
	// The file mended: native again, said once, journalctl not run.
	if err := os.WriteFile(files[0], orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(fj.dir, "args.3")); err == nil {
		t.Error("journalctl ran although the files are readable")
	}
	if !strings.Contains(logs.String(), "reading the journal files natively again") {
		t.Errorf("no line for reading natively again:\n%s", logs.String())
	}
	fallbacks(2) // a run that read natively is not counted
}

// FuzzJournalFile: no journal file makes the native reader panic or loop;
// each read ends, with entries or an error.
func FuzzJournalFile(f *testing.F) {
	root, _ := nativeJournalRoot(f)
	files, _ := filepath.Glob(filepath.Join(root, "run/log/journal/*/*.journal"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) < 100000 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// As any file, and as a ~ file (its seek cuts an invalid tail
		// short, its end comes at an inconsistency).
		for _, tilde := range []bool{false, true} {
			jf, err := openJournalFile("fuzz", bytes.NewReader(b), int64(len(b)))
			if err != nil {
				return
			}
			jf.tilde = tilde
			s, err := positionNativeSource(jf, []byte("_SYSTEMD_UNIT=kubelet.service"), nil, time.Unix(0, 0))
			for n := 0; err == nil && s != nil && s.cand != nil; n++ {
				if n > len(b) {
					t.Fatalf("%d entries from %d bytes", n, len(b))
				}
				if _, err = s.journalEntry(s.cand); err == nil {
					err = s.advance()
				}
			}
		}
	})
}

// BenchmarkNativeJournalRead is one steady-state read of the check: kubelet's
// last 10 entries after the cursor before them, from the real files (three,
// after rotations). BenchmarkJournalctlJournalRead is the same read with
// journalctl (the command the check ran before), where it is installed.
func BenchmarkNativeJournalRead(b *testing.B) {
	root, want := nativeJournalRoot(b)
	q := journalQuery{Unit: "kubelet.service", After: want[len(want)-11].Cursor}
	for b.Loop() {
		n := 0
		if _, err := readJournalNative(context.Background(), root, q, func(journalEntry) { n++ }); err != nil || n != 10 {
			b.Fatal(n, err)
		}
	}
}

func BenchmarkJournalctlJournalRead(b *testing.B) {
	if _, err := os.Stat("/usr/bin/journalctl"); err != nil {
		b.Skip("no journalctl")
	}
	root, want := nativeJournalRoot(b)
	q := journalQuery{Journalctl: "/usr/bin/journalctl", Root: root, Unit: "kubelet.service", After: want[len(want)-11].Cursor}
	for b.Loop() {
		n := 0
		if _, err := readJournal(context.Background(), q, func(journalEntry) { n++ }); err != nil || n != 10 {
			b.Fatal(n, err)
		}
	}
}

// tornTildeRoot is the real files with the first archived one as journald
// leaves it after a crash of the node (power cut, kernel panic, hard reset):
// renamed *.journal~ when journald next opened it (it was not closed), of an
// earlier boot and sequence, and with a torn tail: its last pages not all
// written back, so the items of kubelet's entry arrays from its from'th
// entry on are 0 ("items") or those entries' objects are zeros ("entries")
// while the DATA object's n_entries counts them, or the file is cut to half
// its size ("truncated"). It returns the root, journalctl's
// reading of the untouched files, and the ~ file (the file under its own
// name where tilde is false).
func tornTildeRoot(t *testing.T, torn string, from int, tilde bool) (string, []journalEntry, string) {
	t.Helper()
	root, want := nativeJournalRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "run/log/journal/*/system@*-0000000000000001-*.journal"))
	if len(files) != 1 {
		t.Fatalf("archived file: %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	jf, err := openJournalFile(files[0], bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := jf.findData([]byte("_SYSTEMD_UNIT=kubelet.service"))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// The tear: kubelet's entries from the from'th on (0 being the DATA
	// object's entry_offset, the rest its arrays' items).
	if from < 0 || uint64(from) >= d.nEntries {
		t.Fatalf("tear from %d of %d", from, d.nEntries)
	}
	le := binary.LittleEndian
	if from == 0 && torn == "entries" {
		clear(b[d.entryOffset : d.entryOffset+jEntryFixedSize])
	}
	logical := uint64(1)
	for a := d.entryArrayOffset; a != 0 && logical < d.nEntries; {
		next, slots, err := jf.entryArrayHeader(a)
		if err != nil {
			t.Fatal(err)
		}
		for i := uint64(0); i < slots && logical < d.nEntries; i, logical = i+1, logical+1 {
			if logical < uint64(from) {
				continue
			}
			p := a + jEntryArrayFixed + i*4 // compact: le32 items
			switch torn {
			case "items":
				le.PutUint32(b[p:], 0)
			case "entries":
				e := uint64(le.Uint32(b[p:]))
				size := le.Uint64(b[e+8:])
				clear(b[e : e+size])
			}
		}
		a = next
	}
	// Another boot and sequence: the boot's _BOOT_ID= value and the
	// header's seqnum_id changed.
	boot := []byte("_BOOT_ID=" + want[0].BootID)
	if bytes.Count(b, boot) != 1 {
		t.Fatalf("%d %s", bytes.Count(b, boot), boot)
	}
	copy(b[bytes.Index(b, boot)+len("_BOOT_ID="):], "0123456789abcdef0123456789abcdef")
	copy(b[72:88], "earlier sequence")
	if torn == "truncated" {
		b = b[:len(b)/2]
	}
	name := files[0]
	if tilde {
		name += "~"
		os.Remove(files[0])
	}
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return root, want, name
}

// A file of another sequence than the cursor's whose kubelet chain is
// corrupt is an error of the native reader (the check asks journalctl),
// never read from its first entry: a failed seek in it was dropped, and the
// read after the cursor gave that file's old entries as new ones.
func TestNativeJournalOtherSequenceSeekError(t *testing.T) {
	root, want, _ := tornTildeRoot(t, "items", 1421, false)
	got, r, err := readNative(t, root, journalQuery{After: want[len(want)-3].Cursor})
	if !errors.Is(err, errJournalCorrupt) || len(got) != 0 || r.Cursor != "" {
		t.Fatalf("%d entries (the first %v), cursor %q, error %v; want none and journal file inconsistent", len(got), got[:min(1, len(got))], r.Cursor, err)
	}
}

// A ~ file with a torn tail, of an earlier boot: run after run, the read
// after the cursor (every run of the check but a boot's first) reads
// natively what it would read without it, as journalctl does (sd-journal
// cuts its bisection short at an invalid entry and leaves out a file it
// cannot read on), instead of falling back to journalctl every run until
// journald vacuums the file, weeks later. A read from a time before the
// tear gives what journalctl gives.
func TestNativeJournalTornTildeFile(t *testing.T) {
	// Its last 3 entries torn, or from the 1050th (of 1424): its second last
	// array's last 3 and all of its last one (kubelet's entries from the
	// second 36 on start in the second last array), or all of them, or the
	// file cut short: the file left out.
	for _, c := range []struct {
		torn string
		from int
	}{{"items", 1421}, {"entries", 1421}, {"items", 1050}, {"entries", 1050}, {"entries", 0}, {"truncated", 0}} {
		t.Run(fmt.Sprint(c.torn, c.from), func(t *testing.T) {
			root, want, _ := tornTildeRoot(t, c.torn, c.from, true)
			for _, back := range []int{1, 10, 400} {
				got, _, err := readNative(t, root, journalQuery{After: want[len(want)-back-1].Cursor})
				if err != nil || !reflect.DeepEqual(got, want[len(want)-back:]) {
					t.Fatalf("after the %dth last entry: %d entries (%v), want %d", back+1, len(got), err, back)
				}
			}
			jctl := "/usr/bin/journalctl"
			if _, err := os.Stat(jctl); err != nil {
				testenv.Skip(t, "no journalctl to compare with")
			}
			testenv.StartsProcesses(t)
			var viaJctl []journalEntry
			for _, since := range []time.Time{time.Unix(0, 0), want[300].Realtime.Truncate(time.Second), want[1040].Realtime.Truncate(time.Second), want[len(want)-1].Realtime.Truncate(time.Second)} {
				q := journalQuery{Journalctl: jctl, Root: root, Unit: "kubelet.service", Since: since}
				viaJctl = viaJctl[:0]
				if _, err := readJournal(context.Background(), q, func(e journalEntry) { viaJctl = append(viaJctl, e) }); err != nil {
					t.Fatal(err)
				}
				got, _, err := readNative(t, root, journalQuery{Since: since})
				t.Logf("since %s: %d native (%v), %d journalctl", since, len(got), err, len(viaJctl))
				if since.Unix() == 0 && len(viaJctl) >= len(want) {
					t.Errorf("journalctl read %d entries of the torn files, %d of the whole ones", len(viaJctl), len(want))
				}
				if err != nil || !reflect.DeepEqual(got, viaJctl) {
					t.Errorf("since %s: %d entries native (%v), %d from journalctl", since, len(got), err, len(viaJctl))
				}
			}
		})
	}
}

// A node's /var/log/journal that also holds another machine's directory (an
// image built with a persistent journal and given a new machine ID at first
// boot, a disk moved from another node): journalctl, run without --root as
// the check runs it where host_root is "/", reads only this machine's
// directory under /var/log/journal (sd-journal's SD_JOURNAL_LOCAL_ONLY: the
// directory named by /etc/machine-id, and any under /run), so the native
// reader reads the same and does not fall back every run. With --root
// (host_root not "/") journalctl is asked, as before; so it is where this
// machine's ID cannot be read.
func TestNativeJournalOtherMachineDirectory(t *testing.T) {
	root, want := nativeJournalRoot(t)
	run := filepath.Join(root, "run/log/journal")
	dirs, _ := filepath.Glob(filepath.Join(run, "*"))
	if len(dirs) != 1 {
		t.Fatalf("machine directories: %v", dirs)
	}
	id := filepath.Base(dirs[0])
	varDir := filepath.Join(root, "var/log/journal")
	os.MkdirAll(varDir, 0o755)
	if err := os.Rename(run, varDir); err != nil {
		os.RemoveAll(varDir)
		if err := os.Rename(run, varDir); err != nil {
			t.Fatal(err)
		}
	}
	// Another machine's directory, with a copy of a file of this one (its
	// entries would be read twice if it were read).
	other := filepath.Join(varDir, "0123456789abcdef0123456789abcdef")
	os.MkdirAll(other, 0o755)
	b, err := os.ReadFile(filepath.Join(varDir, id, "system.journal"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(other, "system.journal"), b, 0o644)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	machineID := filepath.Join(root, "etc/machine-id")
	if err := os.WriteFile(machineID, []byte(id+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}

	got, _, err := readNative(t, root, journalQuery{Since: time.Unix(0, 0)})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("this machine's entries: %d (%v), want %d", len(got), err, len(want))
	}
	got, _, err = readNative(t, root, journalQuery{After: want[len(want)-4].Cursor})
	if err != nil || !reflect.DeepEqual(got, want[len(want)-3:]) {
		t.Fatalf("after a cursor: %d (%v), want 3", len(got), err)
	}
	if _, _, err := readNative(t, root, journalQuery{Root: root, Since: time.Unix(0, 0)}); !errors.Is(err, errJournalUnsupported) || fallbackReason(err) != FallbackLayout {
		t.Errorf("with --root: %v (%s), want the journalctl's reading for the layout", err, fallbackReason(err))
	}
	os.Remove(machineID)
	if _, _, err := readNative(t, root, journalQuery{Since: time.Unix(0, 0)}); !errors.Is(err, errJournalUnsupported) || fallbackReason(err) != FallbackLayout {
		t.Errorf("without /etc/machine-id: %v (%s), want the journalctl's reading for the layout", err, fallbackReason(err))
	}
}

// growOnHeaderRead is a journal file that journald grows (fallocate, then
// arena_size in the header: journal_file_allocate's order) just before the
// reader reads its header, once.
type growOnHeaderRead struct {
	fd    *journalFD
	path  string
	grown *bool
	t     *testing.T
}

func (g growOnHeaderRead) ReadAt(b []byte, off int64) (int, error) {
	if off == 0 && !*g.grown && g.fd.Name() == g.path {
		*g.grown = true
		w, err := os.OpenFile(g.path, os.O_RDWR, 0)
		if err != nil {
			g.t.Fatal(err)
		}
		defer w.Close()
		st, _ := w.Stat()
		var h [8]byte
		if _, err := w.ReadAt(h[:], 88); err != nil { // header_size
			g.t.Fatal(err)
		}
		size := st.Size() + 8<<20
		if err := w.Truncate(size); err != nil {
			g.t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(h[:], uint64(size)-binary.LittleEndian.Uint64(h[:]))
		if _, err := w.WriteAt(h[:], 96); err != nil { // arena_size
			g.t.Fatal(err)
		}
	}
	return g.fd.ReadAt(b, off)
}

// journald grows system.journal by 8 MiB at a time (FILE_SIZE_INCREASE),
// the file first and arena_size after it; a read that opens the file in
// between is not "header and arena beyond the file" (a fallback to
// journalctl): the file's size is taken after its header is read.
func TestNativeJournalFileGrowsWhileOpened(t *testing.T) {
	root, want := nativeJournalRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "run/log/journal/*/system.journal"))
	if len(files) != 1 {
		t.Fatalf("system.journal: %v", files)
	}
	grown := false
	old := journalReaderAt
	journalReaderAt = func(fd *journalFD) io.ReaderAt { return growOnHeaderRead{fd, files[0], &grown, t} }
	defer func() { journalReaderAt = old }()
	got, _, err := readNative(t, root, journalQuery{Since: time.Unix(0, 0)})
	if !grown {
		t.Fatal("the file did not grow")
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%d entries (%v), want %d", len(got), err, len(want))
	}
}

// At a rotation journald renames system.journal and creates a new one: for
// a moment the new file is its header alone (journal_file_init_header: no
// arena, no hash tables yet, n_entries 0). A read then reads the others and
// not that file (it holds no entry; sd-journal leaves it out), instead of
// "data hash table at 0, 0 bytes" and a fallback to journalctl (the churn
// test, 8d3473f, met it 7 times in 146 runs).
func TestNativeJournalNewFileBeingCreated(t *testing.T) {
	root, want := nativeJournalRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "run/log/journal/*/system.journal"))
	if len(files) != 1 {
		t.Fatalf("system.journal: %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(files[0], strings.TrimSuffix(files[0], ".journal")+"@0123456789abcdef0123456789abcdef-0000000000000700-000661e7698be5a9.journal"); err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	hs := le.Uint64(b[88:])
	h := bytes.Clone(b[:hs])
	for off := 96; off < int(hs); off += 8 {
		le.PutUint64(h[off:], 0) // arena_size, the hash tables, the counts, ...
	}
	copy(h[24:40], "a new file's id.") // file_id
	if err := os.WriteFile(files[0], h, 0o640); err != nil {
		t.Fatal(err)
	}
	got, _, err := readNative(t, root, journalQuery{Since: time.Unix(0, 0)})
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%d entries (%v), want %d", len(got), err, len(want))
	}
	got, _, err = readNative(t, root, journalQuery{After: want[len(want)-3].Cursor})
	if err != nil || !reflect.DeepEqual(got, want[len(want)-2:]) {
		t.Fatalf("after a cursor: %d entries (%v), want 2", len(got), err)
	}
}

// A cursor of a file that is gone, whose entry another sequence's files
// hold a copy of (journald's flush of /run/log/journal to /var/log/journal
// copies the boot's entries into a file of a new sequence, then removes
// /run's): read natively, not with journalctl once a boot, the entries after
// the copy, each once: also within a burst of lines that share the cursor's
// time (lines 0-19 of the captured journal, and the bursts of "line N", one
// of them across a rotation), where journalctl --after-cursor gives the
// burst's lines before the cursor's again. A cursor of the boot whose entry
// no file holds is journalctl's to read, as before.
func TestNativeJournalCursorOfAnotherSequence(t *testing.T) {
	root, want := nativeJournalRoot(t)
	other := func(cursor string, plus uint64) string {
		c, err := parseJournalCursor(cursor)
		if err != nil {
			t.Fatal(err)
		}
		c.seqnumID[0] ^= 0xff
		return fmt.Sprintf("s=%s;i=%x;b=%s;m=%x;t=%x;x=%x", idHex(c.seqnumID), c.seqnum+1000, idHex(c.bootID), c.monotonic+plus, c.realtime, c.xorHash)
	}
	c0, _ := parseJournalCursor(want[0].Cursor)
	c5, _ := parseJournalCursor(want[5].Cursor)
	if c0.monotonic != c5.monotonic {
		t.Fatal("the captured journal's first lines do not share a time: the burst this test is about is gone")
	}
	for _, i := range []int{0, 5, 19, 20, 101, 202, 303, 404, 505, 606, 707, 808, 909, 1010, 1111, 1212, 1313, 1414, 1515, 1616, 1717, 1818, len(want) - 2, len(want) - 1} {
		got, r, err := readNative(t, root, journalQuery{After: other(want[i].Cursor, 0)})
		if err != nil || len(got) != len(want[i+1:]) || len(got) > 0 && !reflect.DeepEqual(got, want[i+1:]) {
			t.Fatalf("after the copy of entry %d: %d entries (%v), want %d", i, len(got), err, len(want)-i-1)
		}
		if len(got) > 0 && r.Cursor != want[len(want)-1].Cursor {
			t.Fatalf("after the copy of entry %d: cursor %q, want the files' own", i, r.Cursor)
		}
	}
	_, _, err := readNative(t, root, journalQuery{After: other(want[1515].Cursor, 1)})
	if !errors.Is(err, errJournalUnsupported) || fallbackReason(err) != FallbackCursor {
		t.Errorf("after a time of the boot that no entry has: %v (%s), want journalctl's reading", err, fallbackReason(err))
	}
}
