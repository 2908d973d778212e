package checks

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/systemd"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/tamper"
)

// The "stale" list is never cut and counts toward its document's 8 KiB.
// At its worst (every check of every domain failing after it collected,
// each error of 256 bytes that JSON writes 6 bytes each, `<` as \u003c)
// beside lists of 40 entries of long names of the same, every document
// still renders within MaxDocumentBytes, with its stale list whole, every
// problem entry its condition names (the last 4 of each list), and the
// operator's clear of the tamper document (read back at start:
// report.ReportedClear).
func TestStaleAtItsWorstKeepsTheProblemEntries(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	long := func(i int) string { return fmt.Sprintf("/%02d/%s", i, strings.Repeat("<", 600)) }
	problem := func(i int) bool { return i >= 36 }
	var fs []FSUsage
	var vgs []VGUsage
	var hs []NVMeHealth
	var certs []CertInfo
	var ops []OperabilityUnit
	var svcs []ServiceState
	for i := range 40 {
		fs = append(fs, FSUsage{MountPoint: long(i), FSType: "ext4", Source: long(i), FSFigures: &FSFigures{UsedPercent: 50}, OverThreshold: problem(i)})
		vgs = append(vgs, VGUsage{Name: long(i), OverThreshold: problem(i)})
		h := NVMeHealth{Controller: fmt.Sprintf("nvme%d", i), Model: long(i), Serial: long(i)}
		if problem(i) {
			h.CriticalWarning = 1 << 2
		}
		hs = append(hs, h)
		// renewWithin at its longest: a renew_within of the largest
		// Duration, 2562047h47m16.854775807s.
		certs = append(certs, CertInfo{Path: long(i), Subject: long(i), NotAfter: now, DaysLeft: -106751, RenewWithin: time.Duration(math.MaxInt64).String(), Expiring: problem(i)})
		u := systemd.Unit{Name: fmt.Sprintf("u%02d%s.service", i, strings.Repeat("<", 200)), LoadState: "loaded", ActiveState: "active", SubState: "running"}
		ops = append(ops, OperabilityUnit{Unit: u, Down: problem(i)})
		svcs = append(svcs, ServiceState{Unit: u, NotRecovering: problem(i)})
	}
	k := tamper.NewKeeper(t.TempDir(), "boot-1", false)
	if err := k.ClearAll(tamper.Clear{At: now, Reason: strings.Repeat("<", 2000), By: strings.Repeat(">", 2000)}); err != nil {
		t.Fatal(err)
	}
	k.Update(func(s *tamper.State) bool {
		for i := range 16 {
			s.AddFinding(tamper.Finding{Condition: tamper.CondNode, Path: "/etc" + long(i), Kind: "modified", At: now, BootID: "boot-1"})
		}
		return true
	})
	tr := k.Report()
	fields := map[string][]report.Detail{
		"DiskUsageHigh":        {{Domain: "storage", Field: "filesystems", Value: fs}, {Domain: "storage", Field: "volumeGroups", Value: vgs}},
		"DisksFailure":         {{Domain: "disks", Field: "disks", Value: hs}},
		"CertRenewalFailing":   {{Domain: "certs", Field: "certs", Value: certs}},
		"NodeServiceDown":      {{Domain: "services", Field: "operabilityServices", Value: ops}},
		"ServiceNotRecovering": {{Domain: "services", Field: "services", Value: svcs}},
		"NodeTampered":         {{Domain: "tamper", Field: "tamper", Value: tr}},
		"SealedOSTampered":     {{Domain: "tamper", Field: "tamper", Value: tr}},
	}
	d := report.NewDetails()
	for cond, ds := range fields {
		d.Replace(cond, ds)
	}
	for cond := range fields {
		d.Failed(cond, nil, strings.Repeat("<", 3000))
	}
	docs, err := d.Documents(now, report.RoleWorker)
	if err != nil {
		t.Fatal(err)
	}
	for _, dm := range report.Domains {
		raw := docs[report.AnnotationPrefix+dm.Name]
		var doc map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &doc); err != nil {
			t.Fatalf("%s: %v", dm.Name, err)
		}
		var stale []report.Stale
		if err := json.Unmarshal(doc["stale"], &stale); err != nil {
			t.Fatalf("%s: stale: %v", dm.Name, err)
		}
		want := 0
		for _, ds := range fields {
			if ds[0].Domain == dm.Name {
				want++
			}
		}
		t.Logf("%s: %d bytes, %d stale entries", dm.Name, len(raw), len(stale))
		if len(raw) > report.MaxDocumentBytes || len(stale) != want {
			t.Errorf("%s: %d bytes (limit %d), %d stale entries, want %d", dm.Name, len(raw), report.MaxDocumentBytes, len(stale), want)
		}
		for _, s := range stale {
			if len(s.Error) > report.MaxStaleErrorBytes || !strings.HasPrefix(s.Error, "<<<") {
				t.Errorf("%s: error of %d bytes", dm.Name, len(s.Error))
			}
		}
		if dm.Name == "tamper" {
			if c := report.ReportedClear(docs); c.IsZero() {
				t.Errorf("tamper: the operator's clear is not in the document: %.300s", raw)
			}
			continue
		}
		for _, field := range dm.Fields {
			var entries []json.RawMessage
			if err := json.Unmarshal(doc[field], &entries); err != nil {
				t.Fatalf("%s.%s: %v", dm.Name, field, err)
			}
			for i := 36; i < 40; i++ {
				name := fmt.Sprintf("/%02d/", i)
				if strings.HasSuffix(field, "ervices") {
					name = fmt.Sprintf(`"u%02d`, i)
				} else if field == "disks" {
					name = fmt.Sprintf(`"nvme%d"`, i)
				}
				found := false
				for _, e := range entries {
					found = found || strings.Contains(string(e), name)
				}
				if !found {
					t.Errorf("%s.%s: the problem entry %s is cut (%d entries kept)", dm.Name, field, name, len(entries))
				}
			}
		}
	}
}
