package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// DisksFailure is the one condition with two sources (spec: NVMe SMART or
// the kernel's disk I/O errors); the row names them, and only the row.
func TestDisksFailureParts(t *testing.T) {
	for _, d := range Conditions {
		if len(d.Parts) > 0 && d.Type != "DisksFailure" {
			t.Errorf("%s has parts; the spec gives only DisksFailure two sources", d.Type)
		}
	}
	d, _ := Lookup("DisksFailure")
	if k, ok := d.Part(SourceKmsg); !ok || k.Name != "kernel-io-errors" {
		t.Errorf("kernel part: %+v %v", k, ok)
	}
	if c, ok := d.Part(SourceCheck); !ok || c.Name != "nvme-smart" {
		t.Errorf("check part: %+v %v", c, ok)
	}
	if _, ok := d.Part(SourceTamper); ok {
		t.Error("a tamper part")
	}
}

func TestSetPart(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	s := NewStore("b")
	s.SetPart(SourceCheck, disks(StatusFalse, ReasonDisksHealthy, "smart ok"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || c.Message != "smart ok" {
		t.Errorf("one part seen: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusUnknown, ReasonCheckFailed, "window unreadable"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusUnknown || c.Reason != ReasonCheckFailed || c.Message != "window unreadable; smart ok" {
		t.Errorf("a part Unknown: %+v", c)
	}
	// Both True: the first part of the row (the kernel's) gives the reason;
	// the messages follow the row's order.
	s.SetPart(SourceCheck, disks(StatusTrue, ReasonNVMeCriticalWarning, "nvme0: spare"), t0)
	s.SetPart(SourceKmsg, disks(StatusTrue, ReasonDiskIOErrors, "5 I/O errors"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || c.Reason != ReasonDiskIOErrors || c.Message != "5 I/O errors; nvme0: spare" {
		t.Errorf("both True: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 I/O errors"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || c.Reason != ReasonNVMeCriticalWarning || c.Message != "nvme0: spare" {
		t.Errorf("the check part True: %+v", c)
	}

	for _, tc := range []struct {
		src Source
		c   Condition
	}{
		{SourceTamper, disks(StatusFalse, ReasonDisksHealthy, "")},
		{SourceCheck, Condition{Type: "ClockNotSynchronized", Status: StatusFalse, Reason: ReasonClockSynchronized}},
		{SourceKmsg, Condition{Type: "NoSuchCondition", Status: StatusFalse, Reason: ReasonDisksHealthy}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("SetPart(%s, %s) did not panic: the row gives it no such part", tc.src, tc.c.Type)
				}
			}()
			s.SetPart(tc.src, tc.c, t0)
		}()
	}
}

// A part that found nothing to check (no NVMe drives) is neutral: the
// kernel's part decides; when the kernel part is blind the condition is
// Unknown; when no part checked anything (no drives, kernel log monitor
// off) it is Unknown/NothingToCheck, never a fake False.
func TestSetPartNothingToCheck(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	none := disks(StatusUnknown, ReasonNothingToCheck, "no NVMe drives")

	s := NewStore("b")
	s.SetPart(SourceCheck, none, t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusUnknown || c.Reason != ReasonNothingToCheck || c.Message != "no NVMe drives" {
		t.Errorf("only a part with nothing to check: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "the kernel logged 0 disk I/O errors"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || c.Reason != ReasonDisksHealthy || c.Message != "the kernel logged 0 disk I/O errors; no NVMe drives" {
		t.Errorf("kernel part healthy, no drives: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusUnknown, ReasonCheckFailed, "cannot read the kernel log"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusUnknown || c.Reason != ReasonCheckFailed {
		t.Errorf("kernel part blind, no drives: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusTrue, ReasonDiskIOErrors, "5 errors"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || c.Reason != ReasonDiskIOErrors {
		t.Errorf("kernel part True: %+v", c)
	}
}

// A domain whose document cannot be rendered gets an error document; the
// other domains are rendered all the same.
func TestDocumentsOneDomainFailing(t *testing.T) {
	d := NewDetails()
	d.Set(Detail{Domain: "storage", Field: "filesystems", Value: strings.Repeat("x", MaxDocumentBytes)})
	d.Set(Detail{Domain: "certs", Field: "certs", Value: []string{"kubelet"}})
	docs, err := d.Documents(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), RoleWorker)
	if err == nil || !strings.Contains(err.Error(), "report domain storage") {
		t.Fatalf("err = %v", err)
	}
	if len(docs) != len(Domains) {
		t.Fatalf("%d documents, want %d", len(docs), len(Domains))
	}
	if s := docs[AnnotationPrefix+"storage"]; len(s) > MaxDocumentBytes || !strings.Contains(s, `"error":"document is`) {
		t.Fatalf("storage document: %s", s)
	}
	if !strings.Contains(docs[AnnotationPrefix+"certs"], `"kubelet"`) {
		t.Fatalf("certs document: %s", docs[AnnotationPrefix+"certs"])
	}
}

// A part with no data yet (the kernel log not read yet, the second or so
// after a start) does not decide: the other part does, so a start that
// adopted DisksFailure=False from the Node and whose SMART run comes first
// does not turn it Unknown and back. With no other part it has no data.
func TestSetPartNoDataDoesNotDecide(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	s := NewStore("b")
	s.SetPart(SourceKmsg, disks(StatusUnknown, ReasonNoData, "the kernel log has not been read yet"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusUnknown || c.Reason != ReasonNoData {
		t.Errorf("only a part without data: %+v", c)
	}
	s.SetPart(SourceCheck, disks(StatusUnknown, ReasonNothingToCheck, "no NVMe drives"), t0)
	if c, _ := s.Get("DisksFailure"); c.Status != StatusUnknown || c.Reason != ReasonNoData {
		t.Errorf("no data and nothing to check: %+v", c)
	}
	s.SetPart(SourceCheck, disks(StatusFalse, ReasonDisksHealthy, "smart ok"), t0.Add(time.Second))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || c.Message != "smart ok" {
		t.Errorf("SMART healthy, the kernel part without data yet: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusTrue, ReasonDiskIOErrors, "5 errors"), t0.Add(2*time.Second))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || c.Reason != ReasonDiskIOErrors {
		t.Errorf("the kernel part True once read: %+v", c)
	}
}

// A start without the state file on a node without NVMe drives:
// DisksFailure taken over from the Node (False) stays False while the
// kernel part has no data and the SMART part finds nothing to check, and
// the kernel part's False then changes nothing: no flap.
func TestSetPartNoDataKeepsATakenOverStatus(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	s := NewStore("b")
	s.SetPart(SourceKmsg, disks(StatusUnknown, ReasonNoData, "the kernel log has not been read yet"), t0)
	if !s.Adopt(Condition{Type: "DisksFailure", Status: StatusFalse, Reason: ReasonDisksHealthy, LastTransitionTime: t0.Add(-time.Hour)}, "b") {
		t.Fatal("the Node's False was not taken over")
	}
	s.SetPart(SourceCheck, disks(StatusUnknown, ReasonNothingToCheck, "no NVMe drives"), t0.Add(time.Second))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || !c.LastTransitionTime.Equal(t0.Add(-time.Hour)) {
		t.Errorf("no part decided yet: %+v", c)
	}
	s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "the kernel logged 0 disk I/O errors"), t0.Add(2*time.Second))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || !c.LastTransitionTime.Equal(t0.Add(-time.Hour)) {
		t.Errorf("after the kernel part decided: %+v", c)
	}
}

// The parts of a condition are saved with it and restored in the same boot:
// after a restart, the part that reports first does not decide alone (the
// NVMe part's True lowered by the kernel's False until SMART runs again).
// They are not restored in another boot, and the Node's word, taken over at
// start for another status, drops them.
func TestPartsRestoredWithTheirCondition(t *testing.T) {
	prev := NewStore("b1")
	prev.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0)
	prev.SetPart(SourceCheck, disks(StatusTrue, ReasonNVMeCriticalWarning, "nvme0: spare below threshold"), t0)
	dir := saved(t, prev)

	s := loaded(t, "b1", dir)
	if p, ok := s.Part(SourceCheck, "DisksFailure"); !ok || p.Status != StatusTrue {
		t.Fatalf("the SMART part was not restored: %+v, %v", p, ok)
	}
	// The kernel log read again first: its False does not lower the True
	// the SMART part holds.
	s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0.Add(time.Hour))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || c.Reason != ReasonNVMeCriticalWarning || !c.LastTransitionTime.Equal(t0) {
		t.Errorf("after the kernel's part: %s/%s since %v, want True/NVMeCriticalWarning since %v", c.Status, c.Reason, c.LastTransitionTime, t0)
	}

	other := loaded(t, "b2", dir)
	// Another boot: the saved parts are not restored (the kernel's False
	// was about the other boot's log); the parts are what the condition
	// says, as for a state file without parts.
	if p, _ := other.Part(SourceKmsg, "DisksFailure"); p.Status != StatusUnknown || p.Reason != ReasonNoData {
		t.Errorf("the kernel's part in another boot: %+v, want no data", p)
	}
	if p, _ := other.Part(SourceCheck, "DisksFailure"); p.Status != StatusTrue || p.Reason != ReasonNVMeCriticalWarning {
		t.Errorf("the SMART part in another boot: %+v, want the condition's True", p)
	}

	// A state file of an earlier version, without parts.
	raw, err := os.ReadFile(filepath.Join(dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var sf map[string]any
	if err := json.Unmarshal(raw, &sf); err != nil {
		t.Fatal(err)
	}
	delete(sf, "parts")
	oldDir := t.TempDir()
	raw, _ = json.Marshal(sf)
	if err := os.WriteFile(filepath.Join(oldDir, StateFileName), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	old := loaded(t, "b1", oldDir)
	old.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0.Add(time.Hour))
	if c, _ := old.Get("DisksFailure"); c.Status != StatusTrue || !c.LastTransitionTime.Equal(t0) {
		t.Errorf("a state file without parts, the kernel's part first: %s/%s since %v, want True since %v", c.Status, c.Reason, c.LastTransitionTime, t0)
	}

	adopted := loaded(t, "b1", dir)
	if !adopted.Adopt(Condition{Type: "DisksFailure", Status: StatusFalse, Reason: ReasonDisksHealthy, LastTransitionTime: t0.Add(time.Minute)}, "b1") {
		t.Fatal("the Node's later False was not adopted")
	}
	if p, ok := adopted.Part(SourceCheck, "DisksFailure"); !ok || p.Status != StatusUnknown || p.Reason != ReasonNoData {
		t.Errorf("a restored part survived the Node's word for another status: %+v", p)
	}
}

// The Node's word taken over at start replaces the parts no source has
// decided since (restored ones, no data yet): the part whose reason the
// Node's True has holds it, so the other part, deciding first, does not
// lower it. Both parts were saved False; the Node holds a later True for
// the kernel's I/O errors (the last save failed).
func TestAdoptSeedsThePartsItReplaces(t *testing.T) {
	prev := NewStore("b1")
	prev.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0)
	prev.SetPart(SourceCheck, disks(StatusFalse, ReasonDisksHealthy, "nvme0 ok"), t0)
	dir := saved(t, prev)
	s := loaded(t, "b1", dir)
	node := Condition{Type: "DisksFailure", Status: StatusTrue, Reason: ReasonDiskIOErrors, Message: "the kernel logged 7 disk I/O errors", LastTransitionTime: t0.Add(time.Minute)}
	if !s.Adopt(node, "b1") {
		t.Fatal("the Node's later True was not adopted")
	}
	if p, _ := s.Part(SourceKmsg, "DisksFailure"); p.Status != StatusTrue || p.Reason != ReasonDiskIOErrors {
		t.Errorf("the kernel's part after the Node's True: %+v", p)
	}
	s.SetPart(SourceCheck, disks(StatusFalse, ReasonDisksHealthy, "nvme0 ok"), t0.Add(time.Hour))
	if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || !c.LastTransitionTime.Equal(node.LastTransitionTime) {
		t.Errorf("after the SMART part's False: %s/%s since %v, want True since %v", c.Status, c.Reason, c.LastTransitionTime, node.LastTransitionTime)
	}
}

// disks is a part (or the whole) of DisksFailure.
func disks(st Status, r Reason, msg string) Condition {
	return Condition{Type: "DisksFailure", Status: st, Reason: r, Message: msg}
}

// saved saves s to a new directory and returns it.
func saved(t *testing.T, s *Store) string {
	t.Helper()
	dir := t.TempDir()
	if err := s.Save(dir, t0); err != nil {
		t.Fatal(err)
	}
	return dir
}

// loaded returns a store of boot loaded from dir.
func loaded(t *testing.T, boot, dir string) *Store {
	t.Helper()
	s := NewStore(boot)
	if _, err := s.Load(dir); err != nil {
		t.Fatal(err)
	}
	return s
}

// A part whose source does not run on this node (the kernel log monitor
// off, or the SMART check disabled: the daemon forgets that part at start,
// and a reload removes it) is not set again from the Node's word when the
// condition is taken over (the state file lost, or older than the Node):
// nothing would ever set it again, and it would hold the condition True for
// good. The part that runs decides alone, as README says of a check
// disabled at start.
func TestAdoptDoesNotSeedAPartNotEvaluatedHere(t *testing.T) {
	t.Run("kernel log monitor off", func(t *testing.T) {
		s := NewStore("b1")
		s.ForgetPart(SourceKmsg, "DisksFailure")
		node := Condition{Type: "DisksFailure", Status: StatusTrue, Reason: ReasonDiskIOErrors, Message: "the kernel logged 7 disk I/O errors", LastTransitionTime: t0}
		if !s.Adopt(node, "b0") {
			t.Fatal("the Node's True was not taken over")
		}
		if p, ok := s.Part(SourceKmsg, "DisksFailure"); ok {
			t.Errorf("the kernel's part, not evaluated here, set from the Node: %+v", p)
		}
		s.SetPart(SourceCheck, disks(StatusFalse, ReasonDisksHealthy, "nvme0 ok"), t0.Add(time.Hour))
		if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse {
			t.Errorf("after the SMART part's False: %s/%s %q, want False: the SMART check alone decides", c.Status, c.Reason, c.Message)
		}
	})
	t.Run("SMART check disabled", func(t *testing.T) {
		s := NewStore("b1")
		s.ForgetPart(SourceCheck, "DisksFailure")
		// The kernel log monitor's placeholder until it has read the log.
		s.SetPart(SourceKmsg, disks(StatusUnknown, ReasonNoData, "the kernel log has not been read yet"), t0)
		node := Condition{Type: "DisksFailure", Status: StatusTrue, Reason: ReasonNVMeCriticalWarning, Message: "nvme0: spare below threshold", LastTransitionTime: t0}
		if !s.Adopt(node, "b1") {
			t.Fatal("the Node's True was not taken over")
		}
		s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0.Add(time.Minute))
		if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse {
			t.Errorf("after the kernel's part's False: %s/%s %q, want False: the kernel's part alone decides", c.Status, c.Reason, c.Message)
		}
	})
	t.Run("SMART check disabled by a reload before the Node was read", func(t *testing.T) {
		// The API server was down at start: the Node's conditions are
		// read after the reload that disabled the check.
		s := NewStore("b1")
		s.SetPart(SourceKmsg, disks(StatusUnknown, ReasonNoData, "the kernel log has not been read yet"), t0)
		s.SetPart(SourceCheck, disks(StatusUnknown, ReasonCheckFailed, "nvme0: timed out"), t0)
		s.RemovePart(SourceCheck, "DisksFailure", t0)
		node := Condition{Type: "DisksFailure", Status: StatusTrue, Reason: ReasonNVMeCriticalWarning, Message: "nvme0: spare below threshold", LastTransitionTime: t0.Add(-time.Hour)}
		s.Adopt(node, "b1")
		s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0.Add(time.Minute))
		if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse {
			t.Errorf("after the kernel's part's False: %s/%s %q, want False: the kernel's part alone decides", c.Status, c.Reason, c.Message)
		}
	})
	t.Run("source back", func(t *testing.T) {
		// A reload enabled the SMART check again: its part counts again.
		s := NewStore("b1")
		s.ForgetPart(SourceCheck, "DisksFailure")
		s.SetPart(SourceCheck, disks(StatusFalse, ReasonDisksHealthy, "nvme0 ok"), t0)
		s.SetPart(SourceKmsg, disks(StatusFalse, ReasonDisksHealthy, "0 errors"), t0)
		if c, _ := s.Get("DisksFailure"); c.Status != StatusFalse || c.Message != "0 errors; nvme0 ok" {
			t.Errorf("both parts False: %+v", c)
		}
		s.SetPart(SourceCheck, disks(StatusTrue, ReasonNVMeCriticalWarning, "nvme0: spare"), t0.Add(time.Minute))
		if c, _ := s.Get("DisksFailure"); c.Status != StatusTrue || c.Reason != ReasonNVMeCriticalWarning {
			t.Errorf("the SMART part True again: %+v", c)
		}
	})
}
