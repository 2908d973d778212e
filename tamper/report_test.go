package tamper

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/report"
)

// 16 changes with ~760-byte paths and a long clear reason: the tamper
// document still fits (paths cut to MaxReportedText, changes shortened
// until it fits), and every other domain renders.
func TestReportFitsItsDocument(t *testing.T) {
	k := NewKeeper(t.TempDir(), "boot-1", false)
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	if err := k.ClearAll(Clear{At: now, Reason: strings.Repeat("r", 2000), By: "ops"}); err != nil {
		t.Fatal(err)
	}
	k.Update(func(s *State) bool {
		for i := range 16 {
			s.AddFinding(Finding{Condition: CondNode, Path: fmt.Sprintf("/etc/%03d/%s", i, strings.Repeat("p", 750)), Kind: "modified", At: now, BootID: "boot-1"})
			s.AddTolerated(Finding{Path: fmt.Sprintf("/etc/containerd/%03d/%s", i, strings.Repeat("t", 750)), Kind: "modified", At: now, BootID: "boot-1"})
		}
		return true
	})
	layers := make([]LayerReport, 40)
	for i := range layers {
		layers[i] = LayerReport{Name: fmt.Sprintf("layer-%d", i), Expected: strings.Repeat("a", 64), Enforced: strings.Repeat("a", 64), Status: "ok"}
	}
	k.SetLayers(layers)

	d := report.NewDetails()
	d.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: k.Report()})
	d.Set(report.Detail{Domain: "disks", Field: "disks", Value: []string{"sda"}})
	docs, err := d.Documents(now, report.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != len(report.Domains) {
		t.Fatalf("%d documents, want %d", len(docs), len(report.Domains))
	}
	raw := docs[report.AnnotationPrefix+"tamper"]
	if len(raw) > report.MaxDocumentBytes {
		t.Fatalf("tamper document is %d bytes", len(raw))
	}
	var doc struct {
		Tamper Report `json:"tamper"`
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	r := doc.Tamper
	if len(r.Changes) == 0 || len(r.Changes)+r.ChangesOmitted != 16 {
		t.Fatalf("%d changes + %d omitted, want 16", len(r.Changes), r.ChangesOmitted)
	}
	for _, c := range r.Changes {
		if len(c.Path) > MaxReportedText || !strings.HasSuffix(c.Path, "…") {
			t.Fatalf("path not cut: %d bytes", len(c.Path))
		}
	}
	if last := r.Changes[len(r.Changes)-1].Path; !strings.HasPrefix(last, "/etc/015/") {
		t.Fatalf("the most recent change is not kept: %.12s", last)
	}
	if len(r.Tolerated)+r.ToleratedOmitted != 16 || !strings.HasPrefix(r.Tolerated[len(r.Tolerated)-1].Path, "/etc/containerd/015/") {
		t.Fatalf("%d tolerated + %d omitted, want 16 with the most recent kept", len(r.Tolerated), r.ToleratedOmitted)
	}
	if len(r.SealedLayers)+r.SealedLayersOmitted != 40 {
		t.Fatalf("%d layers + %d omitted, want 40", len(r.SealedLayers), r.SealedLayersOmitted)
	}
	if r.Cleared == nil || len(r.Cleared.Reason) > MaxReportedText {
		t.Fatalf("clear reason not cut: %+v", r.Cleared)
	}
	if !strings.Contains(docs[report.AnnotationPrefix+"disks"], `"sda"`) {
		t.Fatalf("disks document: %s", docs[report.AnnotationPrefix+"disks"])
	}
}

// A clear found only in the state file (possibly forged) is not reported,
// so it never reaches the Node, where the next start would trust it; it is
// once it matches the clear the Node shows, or this process performed it.
func TestReportOnlyTrustedClear(t *testing.T) {
	dir := t.TempDir()
	forged := `{"version":1,"findings":[],"cleared":{"at":"2099-01-01T00:00:00Z","reason":"x","by":"y"},"retake":true}`
	if err := os.WriteFile(filepath.Join(dir, StateFileName), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	k := NewKeeper(dir, "boot-1", false)
	if err := k.Load(time.Now()); err != nil {
		t.Fatal(err)
	}
	if c := k.Report().Cleared; c != nil {
		t.Fatalf("an unconfirmed clear is reported: %+v", c)
	}
	if k.TrustClear(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) || k.Report().Cleared != nil {
		t.Fatal("a clear that does not match the Node's is trusted")
	}
	if !k.TrustClear(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)) || k.Report().Cleared == nil {
		t.Fatal("the clear the Node shows is not trusted")
	}
	k2 := NewKeeper(t.TempDir(), "boot-1", false)
	k2.ClearAll(Clear{At: time.Now(), Reason: "ok", By: "ops"})
	if k2.Report().Cleared == nil {
		t.Fatal("this process's clear is not reported")
	}
}
