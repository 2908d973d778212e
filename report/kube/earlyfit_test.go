package kube

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syself/autopilot-health/internal/testenv"
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
		n := crowdedNode(256*1024 - 2000)
		// The earlier boot's report: its tamper document with the clear.
		n.Annotations[tk] = fmt.Sprintf(`{"schemaVersion":1,"bootID":"boot-a","tamper":{"cleared":{"at":%q,"by":"operator"}}}`, cleared.Format(time.RFC3339))
		client := fake.NewClientset(n)
		annotationLimit(client)
		// What the checks collected before the first write (a few KiB),
		// and the clear published before, trusted at start (the daemon
		// sets the tamper field from it before the checks ran).
		store, det := diskUsageHighBootB(40)
		det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{"cleared": map[string]any{"at": cleared, "by": "operator"}}})
		h := startBeforeFirstPass(t, client, store, det, io.Discard) // no refresh
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

// The early report's fitted retry (what fits of it, after the 422) fails
// too (a 500: the API server restarting; or another writer grew its
// annotations meanwhile): the next write of the conditions is the fitted
// report again (one more read of the Node), not the five annotations
// removed, the operator's clear with them, which README keeps for a Node
// that cannot be read or has no room for the tamper stub.
func TestEarlyReportRetryThatFailsKeepsTheClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cleared := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
		tk := report.AnnotationPrefix + "tamper"
		n := crowdedNode(256*1024 - 2000)
		n.Annotations[tk] = fmt.Sprintf(`{"schemaVersion":1,"bootID":"boot-a","tamper":{"cleared":{"at":%q,"by":"operator"}}}`, cleared.Format(time.RFC3339))
		client := fake.NewClientset(n)
		annotationLimit(client)
		var mu sync.Mutex
		statusWrites := 0
		client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "status" {
				return false, nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			statusWrites++
			if statusWrites == 2 { // the fitted retry
				return true, nil, apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
			}
			return false, nil, nil
		})
		store, det := diskUsageHighBootB(40)
		det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{"cleared": map[string]any{"at": cleared, "by": "operator"}}})
		h := startBeforeFirstPass(t, client, store, det, io.Discard)
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		got := h.node(t)
		mu.Lock()
		writes := statusWrites
		mu.Unlock()
		if c := findCond(got, "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("DiskUsageHigh on the Node 5 minutes after the start: %+v; want True (%d status writes)", c, writes)
		}
		if writes < 3 {
			t.Fatalf("%d status writes; the test needs the one after the failed retry", writes)
		}
		for _, dm := range report.Domains {
			if v, ok := got.Annotations[report.AnnotationPrefix+dm.Name]; ok && !strings.Contains(v, `"bootID":"boot-b"`) {
				t.Errorf("%s: %s; want this boot's document or none", dm.Name, v)
			}
		}
		if at := report.ReportedClear(got.Annotations); !at.Equal(cleared) {
			t.Errorf("the clear read back from the Node after the retry failed and the next write landed is %v, want %v: tamper %q", at, cleared, got.Annotations[tk])
		}
		h.stop()
	})
}

// The early write that left documents out says so as a refresh that left
// them out does (README, Report annotations): status's reportLeftOut and
// autopilot_health_report_documents_left_out_total{domain}, which the alert
// AutopilotHealthReportDocumentsLeftOut watches, and the journal's
// left_out. Before, the Node held the stubs (for as long as the checks'
// first pass took) while status and the counter said nothing was left out.
func TestEarlyReportThatDoesNotFitIsCountedLeftOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(crowdedNode(256*1024 - 2000))
		annotationLimit(client)
		store, det := diskUsageHighBootB(40)
		var logs testenv.SyncBuffer
		h := startBeforeFirstPass(t, client, store, det, &logs)
		time.Sleep(time.Minute)
		synctest.Wait()
		if v := h.node(t).Annotations[report.AnnotationPrefix+"storage"]; !strings.Contains(v, `"leftOut"`) {
			t.Fatalf("storage on the Node: %s; the test needs it left out", v)
		}
		if got := h.m.LeftOut("storage"); got != 1 {
			t.Errorf("report_documents_left_out_total{domain=storage} = %v after the early write left it out; want 1", got)
		}
		if got := h.m.Reporting().ReportLeftOut; !slices.Contains(got, "storage") {
			t.Errorf("status's reportLeftOut = %q after the early write left storage out", got)
		}
		if l := logs.String(); !strings.Contains(l, "left_out=[storage]") {
			t.Errorf("the journal does not say which documents the early write left out:\n%s", l)
		}
		h.stop()
	})
}

// Where the Node cannot be read for the room, or its other annotations
// leave not even the tamper stub room, the first write of the conditions
// takes the earlier boot's report off instead (README): the conditions land,
// and no document of the earlier boot stays beside them.
func TestEarlyReportThatDoesNotFitWithoutARead(t *testing.T) {
	for name, tc := range map[string]struct {
		others   int
		readFail bool
	}{
		"the Node's read fails": {others: 256*1024 - 2000, readFail: true},
		"no room for anything":  {others: 256*1024 - 100},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := kubeletNode()
				n.Annotations["tool.example.com/state"] = strings.Repeat("x", tc.others)
				n.Annotations[report.AnnotationPrefix+"tamper"] = `{"schemaVersion":1,"bootID":"boot-a","tamper":{}}`
				client := fake.NewClientset(n)
				annotationLimit(client)
				var mu sync.Mutex
				gets := 0
				client.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					mu.Lock()
					defer mu.Unlock()
					gets++
					if tc.readFail && gets > 1 { // the start's read answered
						return true, nil, apierrors.NewServiceUnavailable("apiserver shutting down")
					}
					return false, nil, nil
				})
				store, det := diskUsageHighBootB(0)
				det.Set(report.Detail{Domain: "storage", Field: "filesystems", Value: []map[string]string{{"mountPoint": strings.Repeat("/v", 1000)}}})
				h := startBeforeFirstPass(t, client, store, det, io.Discard)
				time.Sleep(time.Minute)
				synctest.Wait()
				got := h.node(t)
				if c := findCond(got, "DiskUsageHigh"); c == nil || c.Status != corev1.ConditionTrue {
					t.Fatalf("DiskUsageHigh on the Node: %+v; want True", c)
				}
				for _, dm := range report.Domains {
					if v, ok := got.Annotations[report.AnnotationPrefix+dm.Name]; ok {
						t.Errorf("%s on the Node: %s; want the earlier boot's report off", dm.Name, v)
					}
				}
				if v := h.m.LeftOut("tamper"); v != 0 {
					t.Errorf("tamper counted left out %v times; the report was taken off, nothing written", v)
				}
				h.stop()
			})
		})
	}
}
