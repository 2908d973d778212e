package tamper

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// longEntries are n files under /x whose paths are 4,000 bytes, most not
// UTF-8 (each such byte is a \ufffd escape and again in base64): about 29
// KB of JSON each.
func longEntries(n int) []Entry {
	var es []Entry
	for i := range n {
		es = append(es, Entry{Path: fmt.Sprintf("/x/%05d%s", i, strings.Repeat("\xff", 3990)), Kind: KindFile, Mode: 0o644, Size: 1, SHA256: strings.Repeat("ab", 32)})
	}
	return es
}

// The state the daemon writes is one it reads back, whatever the protected
// paths' names: a baseline larger than MaxBaselineSize (600 paths of 29 KB,
// 17 MB) is cut in the scan's order where the next path would not fit,
// and with every other part at its cap (findings and tolerated changes of
// the longest texts, the clear's reason, the recorded hashes) the file is
// within MaxStateFileSize, and ParseState reads it. Before, the baseline
// was written whole and refused at the next start (BaselineCorrupt).
func TestStateAtEveryCapFitsTheFile(t *testing.T) {
	spec := Spec{Patterns: []string{"/x"}}
	all := longEntries(600)
	cur, over := FitBaseline("boot-1", spec, all, nil)
	if over == nil || over.Bytes != MaxBaselineSize || len(cur) == 0 || len(cur) >= len(all) || over.At != all[len(cur)].Path {
		t.Fatalf("FitBaseline kept %d of %d, cut %+v; want a cut at the first path that does not fit", len(cur), len(all), over)
	}
	if !strings.Contains(over.Error(), "baseline is larger than") {
		t.Errorf("the cut says %q", over.Error())
	}
	s := &State{Baseline: NewBaseline("boot-1", t0, spec, cur), Retake: true, RetakeBoot: strings.Repeat("b", maxBootID)}
	long := strings.Repeat("\xff", 3*maxFindingText)
	for i := range MaxFindings + 1 {
		s.AddFinding(Finding{Condition: CondNode, Path: fmt.Sprintf("/%d", i) + long, Kind: Modified, At: t0, BootID: "boot-1", Detail: long})
	}
	for i := range MaxTolerated + 1 {
		s.AddTolerated(Finding{Path: fmt.Sprintf("/%d", i) + long, Kind: Modified, At: t0, BootID: "boot-1", Detail: long})
	}
	s.Cleared = &Clear{At: t0, Reason: strings.Repeat("\x01", maxClearText), By: strings.Repeat("\x01", maxClearText)}
	s.Sealed = &SealedSeen{BootID: "boot-1", Recorded: map[string]string{}}
	for i := 0; len(mustJSON(s.Sealed)) < maxSealedJSON-40_000; i++ {
		s.Sealed.Recorded[fmt.Sprintf("%03d%s", i, strings.Repeat("\x01", 5000))] = strings.Repeat("0f", 32)
	}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	rest := *s
	rest.Baseline = nil
	rb, err := rest.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if part := len(b) - len(rb); part > MaxBaselineSize {
		t.Errorf("the baseline takes %d bytes of the file, more than MaxBaselineSize %d", part, MaxBaselineSize)
	}
	if len(rb) > MaxStateFileSize-MaxBaselineSize {
		t.Errorf("the state at every cap but the baseline is %d bytes, more than the %d left to it", len(rb), MaxStateFileSize-MaxBaselineSize)
	}
	if len(b) > MaxStateFileSize {
		t.Fatalf("the state is %d bytes, more than MaxStateFileSize", len(b))
	}
	got, err := ParseState(b)
	if err != nil {
		t.Fatalf("the state the daemon wrote does not read back: %v", err)
	}
	if got.Baseline.Digest != s.Baseline.Digest || len(got.Findings) != MaxFindings || got.Findings[0].Path != s.Findings[0].Path {
		t.Errorf("read back %d findings, baseline %s; want %d, %s", len(got.Findings), got.Baseline.Digest, MaxFindings, s.Baseline.Digest)
	}
	// The cut is where it must be: the next path would not have fit.
	s.Baseline = NewBaseline("boot-1", t0, spec, all[:len(cur)+1])
	if wb, err := s.Marshal(); err == nil && len(wb)-len(rb) <= MaxBaselineSize {
		t.Errorf("a baseline of one path more takes %d bytes, within MaxBaselineSize: the cut is too early", len(wb)-len(rb))
	}
	// Uncut, the state is not written: Marshal says why, rather than write
	// a file the next start refuses.
	s.Baseline = NewBaseline("boot-1", t0, spec, all)
	if _, err := s.Marshal(); err == nil || !strings.Contains(err.Error(), "more than the 16777216 it may be") {
		t.Errorf("marshalling a state over the limit: %v", err)
	}
}

// What FitBaseline estimates without encoding is never under an entry's
// size, so that a baseline it lets through whole fits.
func TestEntrySizeBound(t *testing.T) {
	for _, e := range []Entry{
		{Path: "/a", Kind: KindFile},
		{Path: "/" + strings.Repeat("\xff", 300), Kind: KindSymlink, Target: strings.Repeat("\x01<", 300), Mode: 0o7777, UID: 1 << 31, GID: 1 << 31},
		{Path: "/" + strings.Repeat("<", 300), Kind: KindUnreadable, Error: strings.Repeat("\xfe", 100)},
		{Path: "/b", Kind: KindFile, Size: 1 << 62, SHA256: strings.Repeat("ab", 32), TooLarge: true},
	} {
		if b, n := entrySizeBound(e), entrySize(e); b < n {
			t.Errorf("entry %q: bound %d under its size %d", e.Path[:min(len(e.Path), 10)], b, n)
		}
	}
}

// A file the daemon did not write, with parts past the caps the daemon
// writes within, is refused; a finding's detail of an earlier build, which
// did not cut it, is read cut.
func TestParseStateChecksTheCapsOutsideTheDigest(t *testing.T) {
	s := sampleState()
	s.Sealed.Recorded["big"+strings.Repeat("a", maxSealedJSON)] = "00"
	b, _ := s.Marshal()
	if _, err := ParseState(b); err == nil || !strings.Contains(err.Error(), "recorded hashes of") {
		t.Errorf("a file with recorded hashes past the cap: %v", err)
	}
	s = sampleState()
	s.Findings[0].Detail = strings.Repeat("d", 3*maxFindingText)
	b, _ = s.Marshal()
	got, err := ParseState(b)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Findings[0].Detail; len(d) != maxFindingText || !strings.HasSuffix(d, "…") {
		t.Errorf("a long detail read back as %d bytes", len(d))
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
