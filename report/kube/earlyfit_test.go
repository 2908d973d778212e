package kube

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/report"
)

// After a reboot, where this boot's first report does not fit beside the
// Node's other annotations, the first write of the conditions carries what
// fits of it (fitReport: tamper first, a stub for each other document), not
// none: the earlier boot's report still leaves the Node (every document
// now this boot's), and the tamper document keeps the operator's clear the
// daemon published (tamper.cleared, the Node's only record of it, read back
// at start). Before, the conditions went with the five annotations removed,
// the clear with them, until the first refresh after the checks' first
// pass: a restart (or a reboot) meanwhile lost the clear.
func TestEarlyReportThatDoesNotFitKeepsTheClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cleared := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
		tk := report.AnnotationPrefix + "tamper"
		n := kubeletNode()
		n.Annotations["tool.example.com/state"] = strings.Repeat("x", 256*1024-2000)
		// The earlier boot's report: its tamper document with the clear.
		n.Annotations[tk] = fmt.Sprintf(`{"schemaVersion":1,"bootID":"boot-a","tamper":{"cleared":{"at":%q,"by":"operator"}}}`, cleared.Format(time.RFC3339))
		n.Annotations[report.AnnotationPrefix+"storage"] = `{"schemaVersion":1,"bootID":"boot-a"}`
		client := fake.NewClientset(n)
		annotationLimit(client)
		store := report.NewStore("boot-b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusTrue, Reason: report.ReasonFilesystemSpaceHigh}, time.Now())
		det := report.NewDetails()
		det.SetBootID("boot-b")
		// The clear published before, trusted at start (the daemon sets
		// the tamper field from it before the checks ran), and what the
		// checks collected before the first write: a few KiB.
		det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{"cleared": map[string]any{"at": cleared, "by": "operator"}}})
		var fss []map[string]string
		for i := range 40 {
			fss = append(fss, map[string]string{"mountPoint": fmt.Sprintf("/var/lib/kubelet/pods/%032d/volumes", i), "device": "/dev/sda1"})
		}
		det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: fss})
		never := make(chan struct{}) // the checks' first pass does not end: no refresh
		h := startOpts(t, client, store, det, io.Discard, func(o *Options) { o.FirstPass = never })
		<-h.r.Adopted()
		time.Sleep(time.Minute)
		synctest.Wait()
		got := h.node(t)
		if c := findCond(got, "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("DiskUsageHigh on the Node a minute after the start: %+v; want True", c)
		}
		if b := report.ReportBootID(got.Annotations); b == "boot-a" {
			t.Errorf("the earlier boot's report beside this boot's conditions: %q", got.Annotations)
		}
		for _, dm := range report.Domains {
			if v, ok := got.Annotations[report.AnnotationPrefix+dm.Name]; ok && !strings.Contains(v, `"bootID":"boot-b"`) {
				t.Errorf("%s: %s; want this boot's document or none", dm.Name, v)
			}
		}
		if v := got.Annotations[report.AnnotationPrefix+"storage"]; strings.Contains(v, "/var/lib/kubelet/pods") {
			t.Fatalf("storage written whole: %d bytes; the test needs a report that does not fit", len(v))
		}
		if at := report.ReportedClear(got.Annotations); !at.Equal(cleared) {
			t.Errorf("the clear read back from the Node after the first write of the conditions is %v, want %v: tamper %q", at, cleared, got.Annotations[tk])
		}
		h.stop()
	})
}
