package kube

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/syself/autopilot-health/internal/testenv"
	"github.com/syself/autopilot-health/report"
)

// What a refresh writes where the Node's other annotations leave too
// little room for the whole report: the documents that fit in fitOrder,
// a stub for each other, the last in fitOrder removed where not even the
// stubs fit; never more than the room. The tamper document is never
// removed: where not even its stub fits, the Node's tamper annotation is
// left as it is (not in the patch; its size counted in the room), the other
// stubs removed or written beside it as they fit. Before, with under about
// 400 bytes free, the tamper stub was removed, and with it tamper.cleared,
// the Node's only record of an operator's clear.
func TestFitReportChoosesWhatFits(t *testing.T) {
	doc := func(n int) string { return strings.Repeat("d", n) }
	docs := map[string]string{}
	for _, dm := range fitOrder {
		docs[report.AnnotationPrefix+dm] = doc(1000)
	}
	docs[report.AnnotationPrefix+"disks"] = doc(8000)
	docs[report.AnnotationPrefix+"tamper"] = doc(6000)
	stub := func(string, int) string { return doc(100) }
	key := func(dm string) int { return len(report.AnnotationPrefix + dm) }
	all := 0
	for k, v := range docs {
		all += len(k) + len(v)
	}
	stubs := 0
	for _, dm := range fitOrder {
		stubs += key(dm) + 100
	}
	for _, tc := range []struct {
		name      string
		room      int
		left      []string
		removed   []string
		tamperNow int  // the Node's tamper annotation, key and value
		asIs      bool // the tamper annotation left as it is
	}{
		{"room for all", all, nil, nil, 0, false},
		{"disks too large", all - 1, []string{"disks"}, nil, 0, false},
		{"tamper before disks", all - 7000, []string{"disks"}, nil, 0, false},
		{"tamper kept, disks and a small one out", all - 8000 - 1000 + 200, []string{"storage", "disks"}, nil, 0, false},
		{"only the small ones", 3*1000 + 2*100 + stubs, []string{"tamper", "disks"}, nil, 0, false},
		{"stubs alone", stubs, fitOrder, nil, 0, false},
		{"not even the stubs", stubs - 1, fitOrder, []string{"disks"}, 0, false},
		{"the tamper stub alone", key("tamper") + 100, fitOrder, fitOrder[1:], 0, false},
		{"not even the tamper stub: no tamper annotation, left so", key("tamper") + 99, fitOrder, fitOrder[1:], 0, true},
		{"no room: the tamper annotation left as it is", 0, fitOrder, fitOrder[1:], 0, true},
		{"the tamper annotation the Node holds left as it is", key("tamper") + 99, fitOrder, fitOrder[1:], key("tamper") + 60, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, left, asIs := fitReport(docs, annotationsLimit-tc.room, tc.tamperNow, stub)
			if !slices.Equal(left, tc.left) {
				t.Errorf("left out %v, want %v", left, tc.left)
			}
			if asIs != tc.asIs {
				t.Errorf("tamper left as it is: %v, want %v", asIs, tc.asIs)
			}
			used := 0
			if asIs {
				used = tc.tamperNow
			}
			for _, dm := range fitOrder {
				k := report.AnnotationPrefix + dm
				v, ok := out[k]
				switch {
				case dm == "tamper" && tc.asIs:
					if ok {
						t.Errorf("tamper in the patch (%v), want it left as it is", v)
					}
				case !ok:
					t.Errorf("%s not in the patch", dm)
				case slices.Contains(tc.removed, dm):
					if v != nil {
						t.Errorf("%s written (%d bytes), want it removed", dm, len(*v))
					}
				case v == nil:
					t.Errorf("%s removed", dm)
				case slices.Contains(tc.left, dm) && *v != doc(100):
					t.Errorf("%s is %d bytes, want its stub", dm, len(*v))
				case !slices.Contains(tc.left, dm) && *v != docs[k]:
					t.Errorf("%s is %d bytes, want it whole", dm, len(*v))
				}
				if v != nil {
					used += len(k) + len(*v)
				}
			}
			if used > tc.room {
				t.Errorf("%d bytes written, over the room's %d", used, tc.room)
			}
		})
	}
}

// A report that outgrows the Node's room (the fake API server refuses
// annotations over 256 KiB together, as kube-apiserver does): the refresh
// refused reads the Node once and writes what fits at once, the disks
// document a stub; the refreshes after choose by their answers, with no
// read and no refused write, the heartbeat riding on every other one as
// ever; the journal says it once, the count rises per refresh; once the
// other writer's annotation shrinks, the whole report is back.
func TestReportLeftOutForRoomReadsOnceThenChoosesByTheAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.Annotations["tool.example.com/state"] = strings.Repeat("x", 256*1024-6*1024)
		client := fake.NewClientset(n)
		annotationLimit(client)
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		det := report.NewDetails()
		det.SetBootID("b")
		var disks []map[string]any
		for i := range 32 {
			disks = append(disks, map[string]any{"controller": fmt.Sprintf("nvme%d", i), "model": strings.Repeat("M", 200)})
		}
		det.Set(report.Detail{Domain: "disks", Field: "disks", Value: disks})
		logs := &testenv.SyncBuffer{}
		h := startLogged(t, client, store, det, logs)
		<-h.r.Adopted()
		time.Sleep(time.Minute)
		synctest.Wait()
		before := countActions(client)
		time.Sleep(20 * time.Minute)
		synctest.Wait()
		got := h.node(t)
		var d struct {
			LeftOut string `json:"leftOut"`
			Disks   []any  `json:"disks"`
		}
		if err := json.Unmarshal([]byte(got.Annotations[report.AnnotationPrefix+"disks"]), &d); err != nil || d.LeftOut == "" || d.Disks != nil {
			t.Errorf("disks document %q: want the stub", got.Annotations[report.AnnotationPrefix+"disks"])
		}
		if !strings.Contains(got.Annotations[report.AnnotationPrefix+"storage"], `"updatedAt"`) || strings.Contains(got.Annotations[report.AnnotationPrefix+"storage"], "leftOut") {
			t.Errorf("storage document %q: want it whole", got.Annotations[report.AnnotationPrefix+"storage"])
		}
		after := countActions(client)
		if r := after["get nodes"] - before["get nodes"]; r != 0 {
			t.Errorf("%d reads of the Node in 20 minutes after the first refusal; want 0: %v", r, after)
		}
		if w := after["patch nodes"] + after["patch nodes/status"] - before["patch nodes"] - before["patch nodes/status"]; w != 10 {
			t.Errorf("%d writes in 20 minutes; want 10 (a refresh every 2 min, every other carrying the heartbeat): %v", w, after)
		}
		st := testutil.ToFloat64(h.m.writes.WithLabelValues(KindStatus, "error"))
		an := testutil.ToFloat64(h.m.writes.WithLabelValues(KindAnnotations, "error"))
		if st+an != 2 {
			t.Errorf("%v status and %v annotations writes failed; want 2 in all (the first write of the conditions with the early report, the first refresh, each refused whole)", st, an)
		}
		if v := h.m.LeftOut("disks"); v != 12 {
			t.Errorf("disks left out %v times; want 12 (the first write of the conditions, with what fits of the early report, and a refresh every 2 min)", v)
		}
		if c := strings.Count(logs.String(), "report documents left out"); c != 1 {
			t.Errorf("%d journal lines about the documents left out; want 1:\n%s", c, logs.String())
		}
		if rp := h.m.Reporting(); !slices.Equal(rp.ReportLeftOut, []string{"disks"}) || rp.TamperAnnotationAsIs {
			t.Errorf("status's reporting while disks is left out: %+v", rp)
		}
		// The other writer makes room: the next refresh's answer shows it,
		// and the one after is the whole report.
		n = h.node(t)
		delete(n.Annotations, "tool.example.com/state")
		if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		if s := h.node(t).Annotations[report.AnnotationPrefix+"disks"]; !strings.Contains(s, "nvme31") {
			t.Errorf("disks document %q after the room came back; want it whole", s)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if c := strings.Count(logs.String(), "report documents fit on the Node again"); c != 1 {
			t.Errorf("the journal says %d times that the report fits again, want once:\n%s", c, logs.String())
		}
		if rp := h.m.Reporting(); rp.ReportLeftOut != nil || rp.TamperAnnotationAsIs {
			t.Errorf("status's reporting once the whole report fits again: %+v", rp)
		}
		if got, v := h.node(t).Annotations[report.AnnotationPrefix+"disks"], h.m.LeftOut("disks"); strings.Contains(got, "leftOut") || v != 13 {
			t.Errorf("10 minutes after the room came back: disks %d bytes, a stub: %v; left out %v times, want 13 (the refresh whose answer showed the room, none since)", len(got), strings.Contains(got, "leftOut"), v)
		}
		h.stop()
	})
}

// A tamper document too large for the room left (the Node's other
// annotations nearly fill it) is written as a stub; the operator's clear
// it published (tamper.cleared, read back at start: report.ReportedClear)
// stays on the Node all the same: a restart while the document is left out
// must not lose the clear and take back a finding cleared before.
func TestTamperStubKeepsTheClear(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := kubeletNode()
		n.Annotations["tool.example.com/state"] = strings.Repeat("x", 256*1024-3000)
		client := fake.NewClientset(n)
		annotationLimit(client)
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		det := report.NewDetails()
		det.SetBootID("b")
		cleared := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
		var changes []string
		for i := range 30 {
			changes = append(changes, fmt.Sprintf("/etc/file-%02d %s", i, strings.Repeat("c", 120)))
		}
		det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{
			"cleared": map[string]any{"at": cleared, "by": "operator"},
			"changes": changes,
		}})
		h := startLogged(t, client, store, det, &testenv.SyncBuffer{})
		<-h.r.Adopted()
		time.Sleep(3 * time.Minute)
		synctest.Wait()
		got := h.node(t).Annotations
		if !strings.Contains(got[report.AnnotationPrefix+"tamper"], "leftOut") {
			t.Fatalf("tamper document %q: want the stub (the premise)", got[report.AnnotationPrefix+"tamper"])
		}
		if at := report.ReportedClear(got); !at.Equal(cleared) {
			t.Errorf("the clear read back from the Node is %v, want %v (lost with the tamper document left out): %s", at, cleared, got[report.AnnotationPrefix+"tamper"])
		}
		if v := h.m.LeftOut("tamper"); v == 0 {
			t.Errorf("tamper never counted as left out")
		}
		h.stop()
	})
}

// Where not even the tamper stub fits (the Node's other annotations leave
// it under about 400 bytes), the Node's tamper annotation is left as it
// is, neither written nor removed: its tamper.cleared, published before a
// restart, is the Node's only record of the operator's clear, read back at
// start. The journal says so once; tamper is counted as left out. Before,
// the stub was removed, and with it the clear.
func TestTamperAnnotationStaysWhereNotEvenItsStubFits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cleared := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
		tk := report.AnnotationPrefix + "tamper"
		// A restart in the same boot: the stub this boot wrote before.
		before := fmt.Sprintf(`{"bootID":"b","tamper":{"cleared":{"at":%q,"by":"operator"}}}`, cleared.Format(time.RFC3339))
		n := kubeletNode()
		n.Annotations[tk] = before
		used := 0
		for k, v := range n.Annotations {
			used += len(k) + len(v)
		}
		const filler = "tool.example.com/state"
		n.Annotations[filler] = strings.Repeat("x", annotationsLimit-used-len(filler)-50)
		client := fake.NewClientset(n)
		annotationLimit(client)
		store := report.NewStore("b")
		store.Set(report.Condition{Type: "DiskUsageHigh", Status: report.StatusFalse, Reason: report.ReasonDiskUsageOK}, time.Now())
		det := report.NewDetails()
		det.SetBootID("b")
		det.Set(report.Detail{Domain: "tamper", Field: "tamper", Value: map[string]any{"cleared": map[string]any{"at": cleared, "by": "operator"}}})
		logs := &testenv.SyncBuffer{}
		h := startLogged(t, client, store, det, logs)
		<-h.r.Adopted()
		time.Sleep(9 * time.Minute)
		synctest.Wait()
		got := h.node(t).Annotations
		if s := report.LeftOutDocument(time.Now(), report.RoleWorker, "b", "tamper", "", leftOutWhy(1)); len(s) <= 50+len(before) {
			t.Fatalf("the tamper stub is %d bytes: it fits in the room left, and the test proves nothing", len(s))
		}
		if got[tk] != before {
			t.Errorf("the Node's tamper annotation is %q, want it left as it was, %q\n%s", got[tk], before, logs.String())
		}
		if at := report.ReportedClear(got); !at.Equal(cleared) {
			t.Errorf("the clear read back from the Node is %v, want %v", at, cleared)
		}
		if v := h.m.LeftOut("tamper"); v < 4 {
			t.Errorf("tamper counted left out %v times in 9 minutes; want one a refresh (4 or more)", v)
		}
		if c := strings.Count(logs.String(), "tamper_left_as_is=true"); c != 1 {
			t.Errorf("%d journal lines saying the tamper annotation is left as it is; want 1:\n%s", c, logs.String())
		}
		// status says so, where an operator looks: the annotation's
		// updatedAt stands still while the daemon runs.
		if rp := h.m.Reporting(); !rp.TamperAnnotationAsIs || !slices.Contains(rp.ReportLeftOut, "tamper") {
			t.Errorf("status's reporting does not say the tamper annotation is left as it is: %+v", rp)
		}
		h.stop()
	})
}
