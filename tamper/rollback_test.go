package tamper

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// strictFields are the fields the builds before 5040d15 (main up to
// 2026-12-04, 535a78f included) know in tamper.json, by where they stand:
// those builds decode it with DisallowUnknownFields, so a file holding any
// other field is moved aside on a rollback to one of them, its findings lost
// and a BaselineCorrupt finding set (measured: that build's ParseState says
// `json: unknown field "retakeBoot"`).
var strictFields = map[string][]string{
	"state":    {"version", "baseline", "findings", "findingsDropped", "tolerated", "toleratedDropped", "sealed", "cleared", "retake"},
	"baseline": {"bootID", "takenAt", "entries", "patterns", "exclude", "digest"},
	"entry":    {"path", "kind", "mode", "uid", "gid", "size", "sha256", "target", "too_large", "error"},
	"finding":  {"condition", "path", "kind", "at", "bootID", "detail"},
	"sealed":   {"bootID", "recorded"},
	"cleared":  {"at", "reason", "by"},
}

// unknownToStrictBuilds returns the fields of the tamper.json b that the
// builds before 5040d15 do not know, as "where.field".
func unknownToStrictBuilds(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	check := func(where string, obj map[string]json.RawMessage) {
		for k := range obj {
			if !slices.Contains(strictFields[where], k) {
				out = append(out, where+"."+k)
			}
		}
	}
	objects := func(raw json.RawMessage) []map[string]json.RawMessage {
		var os []map[string]json.RawMessage
		if len(raw) > 0 && json.Unmarshal(raw, &os) != nil {
			t.Fatalf("not an array of objects: %s", raw)
		}
		return os
	}
	object := func(raw json.RawMessage) map[string]json.RawMessage {
		var o map[string]json.RawMessage
		if len(raw) > 0 && json.Unmarshal(raw, &o) != nil {
			t.Fatalf("not an object: %s", raw)
		}
		return o
	}
	top := object(b)
	check("state", top)
	if bl := object(top["baseline"]); bl != nil {
		check("baseline", bl)
		for _, e := range objects(bl["entries"]) {
			check("entry", e)
		}
	}
	for _, f := range append(objects(top["findings"]), objects(top["tolerated"])...) {
		check("finding", f)
	}
	if s := object(top["sealed"]); s != nil {
		check("sealed", s)
	}
	if c := object(top["cleared"]); c != nil {
		check("cleared", c)
	}
	slices.Sort(out)
	return out
}

// A rollback to a build before 5040d15, which refuses fields it does not
// know: tamper.json as this build writes it while it runs (a baseline with
// its scope and entries of every kind, findings of both conditions,
// tolerated changes, dropped counts, recorded hashes, the last clear once
// its baseline is taken again) holds only fields those builds know, so they
// read it and keep its findings. Two states hold more, and are what such a
// rollback costs (README, "Tamper conditions"): a clear whose baseline is not
// taken yet (retakeBoot), and a path or detail that is not UTF-8 (rawPath,
// rawTarget, rawDetail; those builds failed the digest of such a baseline
// anyway). Any other field added here fails this test: those builds would
// move the file aside on every node rolled back.
func TestStateReadByBuildsThatRefuseUnknownFields(t *testing.T) {
	steady := sampleState()
	steady.Baseline = NewBaseline("boot-1", t0, Spec{Patterns: []string{"/etc"}, Exclude: []string{"/etc/cni/net.d/*.tmp"}}, []Entry{
		{Path: "/etc/cni/net.d", Kind: KindDir, Mode: 0o755},
		{Path: "/etc/cni/net.d/10-cilium.conflist", Kind: KindSymlink, Mode: 0o777, Target: "/run/cilium.conflist"},
		{Path: "/etc/kubernetes/huge.bin", Kind: KindFile, Mode: 0o600, Size: 1 << 40, TooLarge: true},
		{Path: "/etc/kubernetes/pki", Kind: KindUnreadable, Error: "permission denied"},
		{Path: "/etc/kubernetes/run.sock", Kind: KindOther, Mode: 0o660},
	})
	steady.Findings = append(steady.Findings,
		Finding{Condition: CondNode, Path: "/etc/kubernetes/kubelet.conf", Kind: Corrupt, At: t0, BootID: "boot-1", Detail: "gone"},
		Finding{Condition: CondSealed, Path: "root", Kind: HashMismatch, At: t0, BootID: "boot-1", Detail: "expected 0f, enforced 1e"})
	steady.FindingsDropped = 3
	steady.Tolerated = []Finding{{Condition: CondNode, Path: "/etc/cni/net.d/10-cilium.conflist", Kind: Retarget, At: t0, BootID: "boot-1"}}
	steady.ToleratedDropped = 2
	steady.Cleared = &Clear{At: t0.Add(-time.Hour), Reason: "reviewed", By: "uid 0 (uid 0, pid 42)"}

	k := NewKeeper(t.TempDir(), "boot-1", false)
	if err := k.Load(t0); err != nil {
		t.Fatal(err)
	}
	if err := k.ClearAll(Clear{At: t0, Reason: "reviewed", By: "uid 0"}); err != nil {
		t.Fatal(err)
	}
	pending, err := LoadState(k.dir)
	if err != nil || pending == nil {
		t.Fatalf("the state after a clear: %+v, %v", pending, err)
	}

	notUTF8 := sampleState()
	notUTF8.Baseline = NewBaseline("boot-1", t0, Spec{Patterns: []string{"/etc"}}, []Entry{{Path: "/etc/cni/caf\xe9.conflist.bak", Kind: KindFile, Mode: 0o644}})

	for _, tc := range []struct {
		name string
		s    *State
		want []string
	}{
		{"while it runs", steady, nil},
		{"the baseline of a clear not taken yet", pending, []string{"state.retakeBoot"}},
		{"a name that is not UTF-8", notUTF8, []string{"entry.rawPath"}},
	} {
		b, err := tc.s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if got := unknownToStrictBuilds(t, b); !slices.Equal(got, tc.want) {
			t.Errorf("%s: fields unknown to the builds before 5040d15: %v, want %v\n%s", tc.name, got, tc.want, b)
		}
		if tc.want == nil && !strings.Contains(string(b), `"patterns"`) {
			t.Errorf("%s: the baseline's scope is not written", tc.name)
		}
	}
}
