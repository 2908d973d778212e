package tamper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func sampleState() *State {
	return &State{
		Baseline: NewBaseline("boot-1", t0, Spec{Patterns: []string{"/etc"}}, []Entry{
			{Path: "/etc/cni/net.d", Kind: KindDir, Mode: 0o755},
			{Path: "/var/lib/kubelet/config.yaml", Kind: KindFile, Mode: 0o644, Size: 3, SHA256: strings.Repeat("ab", 32)},
		}),
		Findings: []Finding{{Condition: CondNode, Path: "/var/lib/kubelet/config.yaml", Kind: Modified, At: t0.Add(time.Minute), BootID: "boot-1"}},
		Sealed:   &SealedSeen{BootID: "boot-1", Recorded: map[string]string{"root": strings.Repeat("0f", 32)}},
	}
}

func TestStateRoundTrip(t *testing.T) {
	b, err := sampleState().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseState(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.Baseline.Digest != sampleState().Baseline.Digest || len(s.Findings) != 1 || s.Sealed.Recorded["root"] == "" {
		t.Errorf("round trip: %+v", s)
	}
}

// An edit of the baseline that does not also recompute its digest is
// refused; the digest is published, so one that does shows there.
func TestParseStateRefusesAnAlteredBaseline(t *testing.T) {
	b, _ := sampleState().Marshal()
	for _, tc := range []struct{ from, to, want string }{
		{`"mode": 420`, `"mode": 438`, "the file was altered"},
		{`"version": 1`, `"version": 2`, "unsupported version 2"},
		{`"/etc/cni/net.d"`, `"etc/cni/net.d"`, "not absolute"},
		{`"kind": "dir"`, `"kind": "fifo"`, `unknown kind "fifo"`},
	} {
		alt := strings.Replace(string(b), tc.from, tc.to, 1)
		if alt == string(b) {
			t.Fatalf("%q not in the state", tc.from)
		}
		if _, err := ParseState([]byte(alt)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s -> %s: %v, want %q", tc.from, tc.to, err, tc.want)
		}
	}
	if _, err := ParseState(append(b, "{}"...)); err == nil {
		t.Error("trailing data accepted")
	}
}

func TestLoadStateMovesACorruptFileAside(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	if err := os.WriteFile(p, []byte(`{"version":1,"baseline":`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadState(dir)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.MovedTo != p+".corrupt" {
		t.Fatalf("LoadState = %v, want a CorruptError moved aside", err)
	}
	if _, err := os.Stat(p + ".corrupt"); err != nil {
		t.Errorf("not moved aside: %v", err)
	}
	if s, err := LoadState(dir); s != nil || err != nil {
		t.Errorf("after moving aside: %v %v, want nothing", s, err)
	}
}

func TestKeeperSavesRootOnly(t *testing.T) {
	dir := t.TempDir()
	k := NewKeeper(dir, "boot-1", false)
	if err := k.Load(t0); err != nil {
		t.Fatal(err)
	}
	if err := k.Update(func(s *State) bool { s.Baseline = NewBaseline("boot-1", t0, Spec{}, nil); return true }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("tamper state mode %o, want 0600", fi.Mode().Perm())
	}
	ro := NewKeeper(dir, "boot-1", true)
	ro.Load(t0)
	ro.Update(func(s *State) bool { s.Baseline = nil; return true })
	if s, _ := LoadState(dir); s == nil || s.Baseline == nil {
		t.Error("a read-only keeper wrote the state")
	}
}

// The temp files of tamper.json a crash left are removed when a keeper
// that writes loads; a read-only keeper (the one-shot check, beside the
// running daemon's saves) leaves them, and other files are left.
func TestKeeperLoadRemovesTempFilesLeftByACrash(t *testing.T) {
	dir := t.TempDir()
	left := filepath.Join(dir, StateFileName+".tmp2147483647")
	other := filepath.Join(dir, "state.json.tmp12")
	for _, p := range []string{left, other} {
		if err := os.WriteFile(p, []byte("{half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	NewKeeper(dir, "boot-1", true).Load(t0)
	if _, err := os.Stat(left); err != nil {
		t.Errorf("a read-only keeper removed %s: %v", left, err)
	}
	if err := NewKeeper(dir, "boot-1", false).Load(t0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left in place: %v", left, err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file's temp removed: %v", err)
	}
}

func TestAddFindingCapsAndDeduplicates(t *testing.T) {
	var s State
	f := Finding{Condition: CondNode, Path: "/a", Kind: Modified, BootID: "b", Detail: "x"}
	if !s.AddFinding(f) || s.AddFinding(f) {
		t.Error("the same finding twice in a row is one")
	}
	f.Detail = "y"
	if !s.AddFinding(f) {
		t.Error("a new content of the same path is a new finding")
	}
	for i := range MaxFindings + 5 {
		s.AddFinding(Finding{Condition: CondNode, Path: "/p" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Kind: Added})
	}
	if len(s.Findings) != MaxFindings || s.FindingsDropped != 7 {
		t.Errorf("%d findings, %d dropped; want %d, 7", len(s.Findings), s.FindingsDropped, MaxFindings)
	}
}

func FuzzParseState(f *testing.F) {
	b, _ := sampleState().Marshal()
	f.Add(b)
	f.Add([]byte(`{"version":1,"findings":[]}`))
	f.Add([]byte(`{"version":1,"baseline":{"bootID":"b","takenAt":"2026-01-01T00:00:00Z","entries":[],"digest":""},"findings":null}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := ParseState(in)
		if err != nil {
			return
		}
		if s.Baseline != nil && s.Baseline.ComputeDigest() != s.Baseline.Digest {
			t.Errorf("accepted a baseline whose digest does not match")
		}
		// What is accepted survives a round trip.
		out, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseState(out); err != nil {
			t.Errorf("re-parse of an accepted state: %v", err)
		}
	})
}

func TestReportShowsTheMostRecentChanges(t *testing.T) {
	k := NewKeeper(t.TempDir(), "boot-1", false)
	k.Load(t0)
	k.Update(func(s *State) bool {
		for i := range MaxReportedChanges + 3 {
			s.AddFinding(Finding{Condition: CondNode, Path: fmt.Sprintf("/p%02d", i), Kind: Added, At: t0})
		}
		return true
	})
	r := k.Report()
	if len(r.Changes) != MaxReportedChanges || r.ChangesOmitted != 3 || r.Changes[0].Path != "/p03" || r.Changes[MaxReportedChanges-1].Path != fmt.Sprintf("/p%02d", MaxReportedChanges+2) {
		t.Errorf("report changes %d (first %s), omitted %d", len(r.Changes), r.Changes[0].Path, r.ChangesOmitted)
	}
}

// Tolerated changes are kept apart from the findings, the most recent
// MaxTolerated, so a busy known writer never pushes a finding out; a clear
// drops them too.
func TestAddToleratedKeepsTheMostRecent(t *testing.T) {
	k := NewKeeper(t.TempDir(), "boot-1", false)
	k.Load(t0)
	k.Update(func(s *State) bool {
		f := Finding{Path: "/etc/containerd/config.toml", Kind: Modified, BootID: "boot-1", Detail: "x"}
		if !s.AddTolerated(f) || s.AddTolerated(f) {
			t.Error("the same tolerated change twice in a row is one")
		}
		for i := range MaxTolerated + 4 {
			s.AddTolerated(Finding{Path: fmt.Sprintf("/t%02d", i), Kind: Added, At: t0})
		}
		s.AddFinding(Finding{Condition: CondNode, Path: "/etc/kubernetes/kubelet.conf", Kind: Modified, At: t0})
		return true
	})
	st := k.State()
	if len(st.Tolerated) != MaxTolerated || st.ToleratedDropped != 5 || st.Tolerated[MaxTolerated-1].Path != fmt.Sprintf("/t%02d", MaxTolerated+3) {
		t.Fatalf("%d tolerated (last %s), %d dropped", len(st.Tolerated), st.Tolerated[len(st.Tolerated)-1].Path, st.ToleratedDropped)
	}
	if fs := st.FindingsFor(CondNode); len(fs) != 1 {
		t.Fatalf("findings %+v, want the one finding", fs)
	}
	r := k.Report()
	if len(r.Tolerated) != MaxTolerated || r.ToleratedOmitted != 5 || r.Tolerated[0].Condition != "" {
		t.Fatalf("report: %d tolerated, %d omitted", len(r.Tolerated), r.ToleratedOmitted)
	}
	// The state file round-trips; one with more than MaxTolerated is refused.
	loaded, err := LoadStateReadOnly(k.dir)
	if err != nil || len(loaded.Tolerated) != MaxTolerated {
		t.Fatalf("reload: %v", err)
	}
	loaded.Tolerated = append(loaded.Tolerated, loaded.Tolerated[0])
	b, _ := loaded.Marshal()
	if _, err := ParseState(b); err == nil || !strings.Contains(err.Error(), "tolerated changes, more than") {
		t.Fatalf("ParseState accepted %d tolerated changes: %v", len(loaded.Tolerated), err)
	}
	if err := k.ClearAll(Clear{At: t0, Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	if st := k.State(); len(st.Tolerated) != 0 || st.ToleratedDropped != 0 {
		t.Fatalf("after a clear: %+v", st.Tolerated)
	}
}

// A state file that is not a regular file, or is larger than any the
// daemon writes, is one the daemon did not write: moved aside and a
// CorruptError (so a finding), never an empty state that drops the
// findings unseen.
func TestLoadStateRefusesWhatTheDaemonDidNotWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, p string)
	}{
		{"symlink", func(t *testing.T, p string) {
			other := filepath.Join(t.TempDir(), "elsewhere.json")
			if err := os.WriteFile(other, []byte(`{"version":1,"findings":[]}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(other, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"oversized", func(t *testing.T, p string) {
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(MaxStateFileSize + 1); err != nil { // sparse
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, StateFileName)
			tc.make(t, p)
			_, err := LoadState(dir)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.MovedTo != p+".corrupt" {
				t.Fatalf("LoadState = %v, want a CorruptError moved aside", err)
			}
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still in place (%v): the daemon's saves could not replace it", p, err)
			}
			// The keeper: a finding of NodeTampered.
			dir = t.TempDir()
			tc.make(t, filepath.Join(dir, StateFileName))
			k := NewKeeper(dir, "boot-1", false)
			k.Load(t0)
			st := k.State()
			if fs := st.FindingsFor(CondNode); len(fs) != 1 || fs[0].Kind != Corrupt {
				t.Errorf("findings %+v, want one %s", fs, Corrupt)
			}
		})
	}
}

// What a scan with a spec reads: a pattern's match and its tree, less the
// excluded paths and trees.
func TestSpecCovers(t *testing.T) {
	s := Spec{Patterns: []string{"/etc/cni/net.d", "/etc/kubernetes/*.conf"}, Exclude: []string{"/etc/cni/net.d/cache", "/etc/cni/net.d/*.swp"}}
	for p, want := range map[string]bool{
		"/etc/cni/net.d":               true,
		"/etc/cni/net.d/10.conflist":   true,
		"/etc/cni/net.d/sub/x":         true,
		"/etc/cni/net.d/cache":         false,
		"/etc/cni/net.d/cache/x":       false,
		"/etc/cni/net.d/a.swp":         false,
		"/etc/cni":                     false,
		"/etc/kubernetes/kubelet.conf": true,
		"/etc/kubernetes/manifests":    false,
		"/var/lib/kubelet/config.yaml": false,
	} {
		if got := s.Covers(p); got != want {
			t.Errorf("Covers(%s) = %v, want %v", p, got, want)
		}
	}
}

// A baseline taken with one scope, compared under another: only where both
// reach. One without a recorded scope (an older daemon's) is compared as
// it is, and its digest is what it was.
func TestInScope(t *testing.T) {
	e := func(p string) Entry { return Entry{Path: p} }
	b := NewBaseline("b", time.Unix(0, 0), Spec{Patterns: []string{"/a"}}, []Entry{e("/a"), e("/a/x"), e("/a/y")})
	base, cur, same := InScope(b, Spec{Patterns: []string{"/a", "/b"}, Exclude: []string{"/a/y"}}, []Entry{e("/a"), e("/a/x"), e("/b"), e("/b/z")})
	if same || len(base) != 2 || len(cur) != 2 || base[1].Path != "/a/x" || cur[1].Path != "/a/x" {
		t.Errorf("InScope: base %v cur %v same %v", base, cur, same)
	}
	old := &Baseline{BootID: "b", TakenAt: time.Unix(0, 0).UTC(), Entries: []Entry{e("/a")}}
	want := old.ComputeDigest()
	raw, _ := json.Marshal(old)
	var back Baseline
	json.Unmarshal(raw, &back)
	if back.ComputeDigest() != want {
		t.Error("a baseline without a scope changed its digest")
	}
	if _, _, same := InScope(&back, Spec{Patterns: []string{"/z"}}, nil); !same {
		t.Error("a baseline without a scope is not compared as it is")
	}
	if b.ComputeDigest() == NewBaseline("b", time.Unix(0, 0), Spec{Patterns: []string{"/b"}}, b.Entries).ComputeDigest() {
		t.Error("the scope is not in the digest")
	}
}

// A second corrupt tamper state never replaces the first (evidence of a
// finding): both are kept, with their contents, and each is a finding.
func TestLoadStateKeepsEveryCorruptFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, StateFileName)
	for i, content := range []string{`{"version":1,"baseline":`, `{"version":7}`} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		want := p + ".corrupt"
		if i > 0 {
			want += fmt.Sprint(".", i)
		}
		_, err := LoadState(dir)
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.MovedTo != want || ce.MoveErr != nil {
			t.Fatalf("LoadState %d = %v, want a CorruptError moved aside to %s", i, err, want)
		}
	}
	for name, want := range map[string]string{".corrupt": `{"version":1,"baseline":`, ".corrupt.1": `{"version":7}`} {
		if b, err := os.ReadFile(p + name); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p+name, b, err, want)
		}
	}
	// Through the keeper: a directory after a corrupt file.
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	k := NewKeeper(dir, "boot-1", false)
	if err := k.Load(t0); err == nil || !strings.Contains(err.Error(), p+".corrupt.2") {
		t.Errorf("Keeper.Load = %v, want moved aside to %s", err, p+".corrupt.2")
	}
	if fi, err := os.Lstat(p + ".corrupt.2"); err != nil || !fi.IsDir() {
		t.Errorf("directory not kept: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(p + ".corrupt"); err != nil || string(b) != `{"version":1,"baseline":` {
		t.Errorf("first corrupt file replaced: %q, %v", b, err)
	}
}

// A tamper state that cannot be moved aside (a read error: the state
// directory is a file) says why in the error.
func TestLoadStateSaysWhyNotMovedAside(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadState(notDir)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.MovedTo != "" || ce.MoveErr == nil || !strings.Contains(err.Error(), "could not be moved aside") {
		t.Errorf("LoadState = %v, want a CorruptError that says why it was not moved aside", err)
	}
}

// A baseline of names in another encoding than UTF-8 is read back as it
// was written: the same paths and link targets, sorted, its digest valid,
// and so are the findings of such names.
func TestStateRoundTripOfNamesInAnotherEncoding(t *testing.T) {
	entries := []Entry{
		{Path: "/etc/cni/net.d/\xa0x.conf", Kind: KindFile, Mode: 0o644, SHA256: "aa"},
		{Path: "/etc/cni/net.d/\xc3\xa9.conf", Kind: KindFile, Mode: 0o644, SHA256: "bb"},
		{Path: "/etc/cni/net.d/\xfe.conf", Kind: KindSymlink, Mode: 0o777, Target: "\xff"},
		{Path: "/etc/cni/net.d/\xff.conf", Kind: KindSymlink, Mode: 0o777, Target: "\xfe"},
	}
	s := State{Baseline: NewBaseline("boot-1", t0, Spec{Patterns: []string{"/etc/cni/net.d"}}, entries)}
	s.AddFinding(Finding{Condition: CondNode, Path: "/etc/cni/net.d/\xfe.conf", Kind: Retarget, At: t0, BootID: "boot-1", Detail: "symlink -> \xff"})
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseState(b)
	if err != nil {
		t.Fatalf("ParseState: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(got.Baseline, s.Baseline) || !reflect.DeepEqual(got.Findings, s.Findings) {
		t.Errorf("read back %+v %q\nwant %+v %q", got.Baseline, got.Findings, s.Baseline, s.Findings)
	}
	// A name that is valid UTF-8 is written as before (no raw field): a
	// baseline of such names keeps its digest across versions.
	if n := bytes.Count(b, []byte(`"rawPath"`)); n != 4 {
		t.Errorf("%d rawPath fields, want 4 (three entries and a finding)\n%s", n, b)
	}
}
