package report

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A run that decides, or the check's stop, forgets the failure: a healthy
// node's Details hold none, so its documents' render costs nothing more
// (staleLocked returns at once).
func TestStaleIsForgottenWhenTheCheckDecidesOrStops(t *testing.T) {
	d := NewDetails()
	fs := Detail{Domain: "storage", Field: "filesystems", Value: []string{"/var"}}
	d.Replace("DiskUsageHigh", []Detail{fs})
	d.Failed("DiskUsageHigh", nil, "statfs /var: timed out")
	if s := d.Stale("storage"); len(s) != 1 || s[0].Check != "DiskUsageHigh" || len(s[0].Fields) != 1 || s[0].Fields[0] != "filesystems" {
		t.Fatalf("stale after a failed run: %+v", s)
	}
	d.Replace("DiskUsageHigh", []Detail{fs})
	if len(d.failed) != 0 || d.Stale("storage") != nil {
		t.Errorf("after a run that decided: failed %v, stale %+v", d.failed, d.Stale("storage"))
	}
	d.Failed("DiskUsageHigh", nil, "statfs /var: timed out")
	d.Drop("DiskUsageHigh")
	if len(d.failed) != 0 || d.Stale("storage") != nil || strings.Contains(storageDoc(t, d), "stale") {
		t.Errorf("after the check stopped: failed %v, document %s", d.failed, storageDoc(t, d))
	}
}

// A stale entry names only the fields from an earlier run, with when the
// oldest was collected; its error is cut to MaxStaleErrorBytes, a byte
// that is not UTF-8 written `\xNN` as the documents' names are.
func TestStaleEntry(t *testing.T) {
	d := NewDetails()
	clock := time.Date(2026, 12, 2, 9, 0, 0, 0, time.FixedZone("x", 3600))
	d.now = func() time.Time { return clock }
	fs := Detail{Domain: "storage", Field: "filesystems", Value: []string{"/var"}}
	vg := Detail{Domain: "storage", Field: "volumeGroups", Value: []string{"vg0"}}
	d.Replace("DiskUsageHigh", []Detail{fs, vg})
	clock = clock.Add(2 * time.Minute)
	d.Failed("DiskUsageHigh", []Detail{fs}, "lvm: caf\xe9 "+strings.Repeat("e", 1000))
	s := d.Stale("storage")
	if len(s) != 1 {
		t.Fatalf("stale: %+v", s)
	}
	if s[0].Check != "DiskUsageHigh" || strings.Join(s[0].Fields, ",") != "volumeGroups" || s[0].CollectedAt != "2026-12-02T08:00:00Z" {
		t.Errorf("stale: %+v", s[0])
	}
	if e := s[0].Error; len(e) > MaxStaleErrorBytes || !strings.HasPrefix(e, `lvm: caf\xe9 eee`) || !strings.HasSuffix(e, "…") {
		t.Errorf("error of %d bytes: %q", len(e), e)
	}
	// The next failed run that carries nothing leaves both fields from
	// earlier runs: the oldest was collected by the run that decided.
	clock = clock.Add(2 * time.Minute)
	d.Failed("DiskUsageHigh", nil, "timed out")
	if s := d.Stale("storage"); len(s) != 1 || strings.Join(s[0].Fields, ",") != "filesystems,volumeGroups" || s[0].CollectedAt != "2026-12-02T08:00:00Z" || s[0].Error != "timed out" {
		t.Errorf("stale after a second failed run: %+v", s)
	}
	for _, other := range []string{"disks", "certs", "tamper", "services"} {
		if s := d.Stale(other); s != nil {
			t.Errorf("%s: %+v", other, s)
		}
	}
}

// The stale list counts toward the document's MaxDocumentBytes and is
// never cut: the domain's lists are cut to make room for it.
func TestStaleCountsTowardTheDocumentAndIsKept(t *testing.T) {
	type fs struct {
		MountPoint string `json:"mountPoint"`
		Pad        string `json:"pad"`
	}
	big := make([]fs, 20)
	for i := range big {
		big[i] = fs{MountPoint: "/big", Pad: strings.Repeat("p", 400)}
	}
	d := NewDetails()
	d.Replace("DiskUsageHigh", []Detail{{Domain: "storage", Field: "filesystems", Value: big}})
	without := storageDoc(t, d)
	d.Failed("DiskUsageHigh", nil, strings.Repeat("why ", 200))
	with := storageDoc(t, d)
	if len(with) > MaxDocumentBytes {
		t.Errorf("document of %d bytes, over %d", len(with), MaxDocumentBytes)
	}
	var a, b struct {
		Filesystems []json.RawMessage `json:"filesystems"`
		Stale       []Stale           `json:"stale"`
	}
	if err := json.Unmarshal([]byte(without), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(with), &b); err != nil {
		t.Fatal(err)
	}
	if len(b.Stale) != 1 || len(b.Filesystems) >= len(a.Filesystems) {
		t.Errorf("%d filesystems without stale, %d with; stale %+v", len(a.Filesystems), len(b.Filesystems), b.Stale)
	}
}

// DecidedEvidence is what the check's last run that decided carried, through
// the failed runs after it, whatever they set over it (two in a row: the
// runner holds a True through as many); FailedRunEvidence is what the latest
// failed run set itself, nothing once a run decides again. `status` shows the
// first as the evidence of a True held through failed runs, the second apart.
func TestDecidedEvidenceThroughFailedRuns(t *testing.T) {
	d := NewDetails()
	show := func(m map[string]any) string {
		b, _ := json.Marshal(m)
		return string(b)
	}
	ok := Detail{Domain: "certs", Field: "certs", Value: []string{"k.pem expires on 2026-12-04"}}
	bad := Detail{Domain: "certs", Field: "certs", Value: []string{"k.pem: not a regular file"}}
	worse := Detail{Domain: "certs", Field: "certs", Value: []string{"k.pem: not present"}}
	d.Replace("CertRenewalFailing", []Detail{ok})
	if got, want := show(d.DecidedEvidence("CertRenewalFailing")), `{"certs.certs":["k.pem expires on 2026-12-04"]}`; got != want || d.FailedRunEvidence("CertRenewalFailing") != nil {
		t.Errorf("after a run that decided: decided %s, failed run %s; want %s and none", got, show(d.FailedRunEvidence("CertRenewalFailing")), want)
	}
	d.Failed("CertRenewalFailing", []Detail{bad}, "k.pem: not a regular file")
	d.Failed("CertRenewalFailing", []Detail{worse}, "k.pem: not present")
	if got, want := show(d.Evidence("CertRenewalFailing")), `{"certs.certs":["k.pem: not present"]}`; got != want {
		t.Errorf("Evidence after two failed runs: %s, want %s (as before: the fields as they are now)", got, want)
	}
	if got, want := show(d.DecidedEvidence("CertRenewalFailing")), `{"certs.certs":["k.pem expires on 2026-12-04"]}`; got != want {
		t.Errorf("DecidedEvidence after two failed runs: %s, want %s", got, want)
	}
	if got, want := show(d.FailedRunEvidence("CertRenewalFailing")), `{"certs.certs":["k.pem: not present"]}`; got != want {
		t.Errorf("FailedRunEvidence after two failed runs: %s, want %s", got, want)
	}
	// A failed run that collected nothing: no evidence of its own, the
	// deciding run's kept.
	d.Failed("CertRenewalFailing", nil, "timed out")
	if got := d.FailedRunEvidence("CertRenewalFailing"); got != nil {
		t.Errorf("FailedRunEvidence of a run that collected nothing: %s", show(got))
	}
	if got, want := show(d.DecidedEvidence("CertRenewalFailing")), `{"certs.certs":["k.pem expires on 2026-12-04"]}`; got != want {
		t.Errorf("DecidedEvidence after a third failed run: %s, want %s", got, want)
	}
	d.Replace("CertRenewalFailing", []Detail{bad})
	if got := show(d.DecidedEvidence("CertRenewalFailing")); got != `{"certs.certs":["k.pem: not a regular file"]}` || d.FailedRunEvidence("CertRenewalFailing") != nil {
		t.Errorf("after a run that decided again: decided %s, failed run %s", got, show(d.FailedRunEvidence("CertRenewalFailing")))
	}
	// A check that never decided: nothing decided.
	d.Failed("DiskUsageHigh", []Detail{{Domain: "storage", Field: "filesystems", Value: []string{"/var"}}}, "statfs: timed out")
	if got := d.DecidedEvidence("DiskUsageHigh"); got != nil {
		t.Errorf("DecidedEvidence of a check that never decided: %s", show(got))
	}
}
