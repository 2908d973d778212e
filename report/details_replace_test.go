package report

import (
	"strings"
	"testing"
	"time"
)

func storageDoc(t *testing.T, d *Details) string {
	t.Helper()
	docs, err := d.Documents(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	return docs[AnnotationPrefix+"storage"]
}

// A check's result replaces the fields of its previous one: a field the
// latest result lacks leaves the document and the evidence.
func TestReplaceDropsFieldsTheLatestResultLacks(t *testing.T) {
	d := NewDetails()
	fs := Detail{Domain: "storage", Field: "filesystems", Value: []string{"/var"}}
	vg := Detail{Domain: "storage", Field: "volumeGroups", Value: []string{"vg0"}}
	d.Replace("DiskUsageHigh", []Detail{fs, vg})
	if s := storageDoc(t, d); !strings.Contains(s, `"volumeGroups":["vg0"]`) {
		t.Fatalf("storage: %s", s)
	}
	d.Replace("DiskUsageHigh", []Detail{fs})
	if s := storageDoc(t, d); strings.Contains(s, "volumeGroups") || !strings.Contains(s, `"filesystems":["/var"]`) {
		t.Errorf("storage after a result without volume groups: %s", s)
	}
	ev := d.Evidence("DiskUsageHigh")
	if _, ok := ev["storage.volumeGroups"]; ok || len(ev) != 1 {
		t.Errorf("evidence: %v", ev)
	}
	d.Replace("DiskUsageHigh", nil)
	if s := storageDoc(t, d); strings.Contains(s, "filesystems") {
		t.Errorf("storage after a result with no fields: %s", s)
	}
	if ev := d.Evidence("DiskUsageHigh"); ev != nil {
		t.Errorf("evidence after a result with no fields: %v", ev)
	}
}

// A field two conditions' checks carry stays while one of them does, with
// the value that one carried; Drop removes a condition's fields.
func TestSharedFieldStaysWhileAnOwnerCarriesIt(t *testing.T) {
	d := NewDetails()
	tamper := func(v string) []Detail { return []Detail{{Domain: "tamper", Field: "tamper", Value: v}} }
	doc := func() string {
		docs, err := d.Documents(time.Now(), RoleWorker)
		if err != nil {
			t.Fatal(err)
		}
		return docs[AnnotationPrefix+"tamper"]
	}
	d.Replace("SealedOSTampered", tamper("sealed"))
	d.Replace("NodeTampered", tamper("node"))
	if s := doc(); !strings.Contains(s, `"tamper":"node"`) {
		t.Fatalf("tamper: %s", s)
	}
	d.Drop("NodeTampered")
	if s := doc(); !strings.Contains(s, `"tamper":"sealed"`) {
		t.Errorf("tamper once only SealedOSTampered carries it: %s", s)
	}
	if ev := d.Evidence("NodeTampered"); ev != nil {
		t.Errorf("evidence of the dropped condition: %v", ev)
	}
	if ev := d.Evidence("SealedOSTampered"); ev["tamper.tamper"] != "sealed" {
		t.Errorf("evidence of the other owner: %v", ev)
	}
	d.Replace("SealedOSTampered", nil)
	if s := doc(); strings.Contains(s, `"tamper":`) {
		t.Errorf("tamper once no check carries it: %s", s)
	}
}

// Set and SetFor keep working: a field set without an owner stays, SetFor
// adds to a condition's evidence, and Replace panics on a field outside
// the schema before changing anything.
func TestSetForAndReplaceTogether(t *testing.T) {
	d := NewDetails()
	d.Set(Detail{Domain: "certs", Field: "certs", Value: []string{"kubelet"}})
	d.SetFor("DiskUsageHigh", Detail{Domain: "storage", Field: "filesystems", Value: 1})
	d.SetFor("DiskUsageHigh", Detail{Domain: "storage", Field: "volumeGroups", Value: 2})
	if ev := d.Evidence("DiskUsageHigh"); len(ev) != 2 {
		t.Fatalf("evidence: %v", ev)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Replace with a field outside the schema did not panic")
			}
		}()
		d.Replace("DiskUsageHigh", []Detail{{Domain: "storage", Field: "nope"}})
	}()
	if ev := d.Evidence("DiskUsageHigh"); len(ev) != 2 {
		t.Errorf("evidence after a refused Replace: %v", ev)
	}
	d.Drop("DiskUsageHigh")
	docs, _ := d.Documents(time.Now(), RoleWorker)
	if !strings.Contains(docs[AnnotationPrefix+"certs"], "kubelet") {
		t.Errorf("a field set without an owner was removed: %s", docs[AnnotationPrefix+"certs"])
	}
	if s := docs[AnnotationPrefix+"storage"]; strings.Contains(s, "filesystems") {
		t.Errorf("storage after Drop: %s", s)
	}
}
