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

// The worst case of a tamper document while this boot's baseline is
// pending: the pending message names a baseline_after glob of any length
// (the configuration bounds none; a bracket expression matches one
// character however long it is), with characters the document writes as
// 6-byte \u escapes ('<', a control character), beside a clear whose reason
// and operator are at their cap in the same characters, a full list of
// findings and tolerated changes and many sealed layers. The document fits,
// with the clear (the next start trusts it from the Node), the bootID and
// the most recent change, and says the baseline is pending.
func TestReportWithALongBaselinePendingFitsItsDocument(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for name, glob := range map[string]string{
		"plain 16 KiB glob":   "/etc/kubernetes/[" + strings.Repeat("k", 16<<10) + "]",
		"escaped 4 KiB glob":  "/etc/" + strings.Repeat("<\x01", 2<<10),
		"PATH_MAX plain glob": "/" + strings.Repeat("a", 4094),
	} {
		t.Run(name, func(t *testing.T) {
			k := NewKeeper(t.TempDir(), "boot-1", false)
			worst := strings.Repeat("<\x01", 1000)
			if err := k.ClearAll(Clear{At: now, Reason: worst, By: worst}); err != nil {
				t.Fatal(err)
			}
			k.Update(func(s *State) bool {
				s.Baseline = nil // a reboot after the clear: this boot's baseline waits
				for i := range 16 {
					s.AddFinding(Finding{Condition: CondNode, Path: fmt.Sprintf("/etc/%03d/%s", i, worst), Kind: "modified", At: now, BootID: "boot-0"})
					s.AddTolerated(Finding{Path: fmt.Sprintf("/etc/containerd/%03d/%s", i, worst), Kind: "modified", At: now, BootID: "boot-0"})
				}
				return true
			})
			layers := make([]LayerReport, 40)
			for i := range layers {
				layers[i] = LayerReport{Name: fmt.Sprintf("layer-%d", i), Expected: strings.Repeat("a", 64), Enforced: strings.Repeat("b", 64), Status: "mismatch"}
			}
			k.SetLayers(layers)
			// The longest message NodeTampered's takeBaseline writes.
			k.SetPending(fmt.Sprintf("waiting for %s before taking this boot's baseline (at most %s)", glob, "10m"))

			d := report.NewDetails()
			d.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: k.Report()})
			docs, err := d.Documents(now, report.RoleWorker)
			if err != nil {
				t.Fatal(err)
			}
			raw := docs[report.AnnotationPrefix+"tamper"]
			if len(raw) > report.MaxDocumentBytes {
				t.Fatalf("tamper document is %d bytes", len(raw))
			}
			var doc struct {
				Tamper *Report `json:"tamper"`
			}
			if err := json.Unmarshal([]byte(raw), &doc); err != nil {
				t.Fatal(err)
			}
			r := doc.Tamper
			if r == nil {
				t.Fatalf("no tamper report in the document: %.300s", raw)
			}
			if r.BootID != "boot-1" || r.Cleared == nil || !r.Cleared.At.Equal(now) {
				t.Fatalf("bootID %q, cleared %+v", r.BootID, r.Cleared)
			}
			if !strings.HasPrefix(r.BaselinePending, "waiting for /") || len(r.BaselinePending) > MaxReportedText {
				t.Fatalf("baselinePending (%d bytes): %.80q", len(r.BaselinePending), r.BaselinePending)
			}
			if len(r.Changes) == 0 || !strings.HasPrefix(r.Changes[len(r.Changes)-1].Path, "/etc/015/") {
				t.Fatalf("the most recent change is not kept: %d changes", len(r.Changes))
			}
		})
	}
}

// The two tamper checks both carry the keeper's report: one check's run
// takes it, the other's changes the state (a clear, a new baseline) and is
// recorded, and the first is recorded after it (the runs side by side, as
// both tamper checks are woken by a clear). The document keeps the report
// taken later: CI at 525a84a showed a Node's tamper document without the
// baseline taken 1 s after a clear for as long as neither check ran again.
func TestDocumentKeepsTheLaterReportOfTheTwoChecks(t *testing.T) {
	k := NewKeeper(t.TempDir(), "boot-1", false)
	now := time.Date(2026, 12, 6, 21, 41, 20, 0, time.UTC)
	before := k.Report() // SealedOSTampered's run, before the clear
	if err := k.ClearAll(Clear{At: now, Reason: "reviewed", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	after := k.Report() // NodeTampered's run, after it
	if after.Taken() <= before.Taken() {
		t.Fatalf("Taken %d after %d: not ordered", after.Taken(), before.Taken())
	}
	cleared := func(d *report.Details) bool {
		t.Helper()
		docs, err := d.Documents(now, report.RoleWorker)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(docs[report.AnnotationPrefix+"tamper"], `"cleared":`)
	}
	d := report.NewDetails()
	d.Replace(CondNode, []report.Detail{{Domain: "tamper", Field: "tamper", Value: after}})
	d.Replace(CondSealed, []report.Detail{{Domain: "tamper", Field: "tamper", Value: before}})
	if !cleared(d) {
		t.Fatal("the report taken before the clear, recorded last, replaced the one taken after it")
	}
	// Each check's evidence is its own result's.
	if ev := d.Evidence(CondSealed)["tamper.tamper"]; ev.(Report).Cleared != nil {
		t.Fatalf("SealedOSTampered's evidence is not its own report: %+v", ev)
	}
	// A failed run's fields and a read-back's SetFor follow the same rule.
	d.Failed(CondSealed, []report.Detail{{Domain: "tamper", Field: "tamper", Value: before}}, "timed out")
	if !cleared(d) {
		t.Fatal("a failed run's older report replaced the later one")
	}
	// The check that carried the later report stops: the other's is the
	// field's value, as before.
	d.Drop(CondNode)
	if cleared(d) {
		t.Fatal("NodeTampered dropped: its report still stands")
	}
	// A later report replaces an earlier one, whichever check carries it.
	d.Replace(CondNode, []report.Detail{{Domain: "tamper", Field: "tamper", Value: before}})
	d.Replace(CondSealed, []report.Detail{{Domain: "tamper", Field: "tamper", Value: k.Report()}})
	if !cleared(d) {
		t.Fatal("a report taken later did not replace an earlier one")
	}
}
