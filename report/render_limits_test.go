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
	b, err := renderDocument(now, RoleWorker, "boot", map[string]any{"disks": disks})
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
