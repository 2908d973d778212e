package daemon

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// A state file whose conditions lack their lastTransitionTime (edited by
// hand, a field dropped) is restored with a transition time all the same,
// once: the file's save time (the status held then; when it began is not
// known, and no earlier time is claimed), saved with the next write so
// that the next start keeps it. Before, the zero time was kept for as long
// as the status held: the Node's condition was written without a
// lastTransitionTime (`null` in the status patch, which also deleted the
// one the Node had), and `status` said since 0001-01-01.
func TestRestoredConditionWithoutATransitionTime(t *testing.T) {
	cfg := testConfig(t)
	// run runs a daemon reporting to a Node of its own (no condition on
	// it) until the Node holds DiskUsageHigh, and returns the Node's
	// conditions.
	var logs *syncBuffer
	run := func(what string) map[string]corev1.NodeCondition {
		t.Helper()
		client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
		logs = &syncBuffer{}
		d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		conds := map[string]corev1.NodeCondition{}
		await(t, d, what+": DiskUsageHigh on the Node", func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range n.Status.Conditions {
				conds[string(c.Type)] = c
			}
			_, ok := conds["DiskUsageHigh"]
			return ok
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return conds
	}
	run("the first start")

	// The transition times dropped from the file.
	path := filepath.Join(cfg.StateDir, report.StateFileName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sf map[string]any
	if err := json.Unmarshal(b, &sf); err != nil {
		t.Fatal(err)
	}
	savedAt, err := time.Parse(time.RFC3339Nano, sf["savedAt"].(string))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range sf["conditions"].([]any) {
		delete(c.(map[string]any), "lastTransitionTime")
	}
	if b, err = json.Marshal(sf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	second := run("the start on the edited file")
	if c := second["DiskUsageHigh"]; !c.LastTransitionTime.Time.Equal(savedAt.Truncate(time.Second)) {
		t.Errorf("DiskUsageHigh %s/%s restored without a transition time: on the Node since %v, want the file's save time %v",
			c.Status, c.Reason, c.LastTransitionTime.Time, savedAt.Truncate(time.Second))
	}
	for ty, c := range second {
		if _, ours := report.Lookup(ty); ours && c.LastTransitionTime.IsZero() {
			t.Errorf("%s on the Node without a lastTransitionTime", ty)
		}
	}
	if l := grepLines(logs.String(), "condition=DiskUsageHigh"); !strings.Contains(l, "condition read back without a transition time") {
		t.Errorf("the time taken for DiskUsageHigh is not logged:\n%s", l)
	}
	// Taken once: the next start keeps it.
	third := run("the next start")
	if a, b := second["DiskUsageHigh"].LastTransitionTime, third["DiskUsageHigh"].LastTransitionTime; !a.Equal(&b) {
		t.Errorf("DiskUsageHigh's transition time moved from %v to %v at a restart", a.Time, b.Time)
	}
	if strings.Contains(logs.String(), "condition read back without a transition time") {
		t.Errorf("the next start found conditions without a transition time again:\n%s", grepLines(logs.String(), "without a transition time"))
	}
}

// The same of a condition read from the Node without a lastTransitionTime
// (the Node edited by hand, or written so by a build before
// TestRestoredConditionWithoutATransitionTime's fix) where the daemon has
// no state file: it is taken as now, once, and the Node's condition gets
// a time. Before, the zero time was adopted and written back (`null`).
func TestNodeConditionWithoutATransitionTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(t) // no state file
		// Its watcher blocks in a read of file events the fake clock
		// cannot wait out.
		cfg.Checks.NodeTampered.Enabled = false
		// The first runs spread: DiskUsageHigh's first run comes after
		// the Node's conditions were read.
		cfg.Runner.FirstRunSpread = config.Duration{Duration: 5 * time.Minute}
		client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: "DiskUsageHigh", Status: corev1.ConditionFalse,
				Reason: "DiskUsageOK", Message: "from the node"}}}})
		logs := &syncBuffer{}
		d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client)})
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if c, _ := d.Store().Get("DiskUsageHigh"); !c.LastUpdateTime.After(began.Add(time.Second)) {
			t.Fatalf("DiskUsageHigh has not run: %+v", c)
		}
		n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == "DiskUsageHigh" && (c.Status != corev1.ConditionFalse || !c.LastTransitionTime.Time.Equal(began)) {
				t.Errorf("DiskUsageHigh %s/%s read from the Node without a transition time: written back since %v; want since the start, %v", c.Status, c.Reason, c.LastTransitionTime.Time, began)
			}
		}
		if l := grepLines(logs.String(), "condition=DiskUsageHigh"); !strings.Contains(l, "condition read back without a transition time") || !strings.Contains(l, "from=node") {
			t.Errorf("the time taken for DiskUsageHigh is not logged:\n%s", l)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
