package report

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A domain's list is capped at MaxListLen entries, the count left out in
// <field>Truncated; a document over MaxDocumentBytes is shortened further
// (halving the cap) until it fits; a list inside an entry is not cut.
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
	b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"filesystems": many})
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
	b, err = renderDocument(now, RoleWorker, "boot", map[string]any{"filesystems": big})
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
	b, err = renderDocument(now, RoleWorker, "boot", map[string]any{"volumeGroups": []vg{{Name: "vg0", ThinPools: pools}}})
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
