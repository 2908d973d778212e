package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
)

// A start with NodeTampered disabled drops the finding the state file
// restores, and logs it as a warning (README, "Tamper conditions"), once,
// whatever Kubernetes does: with no Kubernetes at all (kubeconfig empty),
// and with a Node that carries the same finding (the reporter, which takes
// it off the Node, does not log it a second time). Before, a start without
// Kubernetes said only "condition not evaluated on this node" at Info: the
// finding left without a warning on the record.
func TestStartWithATamperCheckDisabledLogsTheRestoredFindingOnce(t *testing.T) {
	const msg = "/etc/kubernetes/manifests/evil.yaml added"
	since := time.Now().Add(-time.Hour).Truncate(time.Second)
	// withFinding is a configuration with NodeTampered disabled and a
	// state file that holds its finding.
	withFinding := func(t *testing.T) *config.Config {
		t.Helper()
		cfg := testConfig(t)
		prev := report.NewStore("0f6c4a0e-3b1d-4a57-9a3c-5d1f6f0b2c11")
		prev.Set(report.Condition{Type: "NodeTampered", Status: report.StatusTrue, Reason: report.ReasonProtectedFileChanged, Message: msg}, since)
		if err := prev.Save(cfg.StateDir, since); err != nil {
			t.Fatal(err)
		}
		cfg.Checks.NodeTampered.Enabled = false
		return cfg
	}
	check := func(t *testing.T, logs string) {
		t.Helper()
		if n := strings.Count(logs, report.TamperFindingRemovedLog); n != 1 {
			t.Fatalf("the removed finding is logged %d times, want once:\n%s", n, logs)
		}
		l := grepLines(logs, report.TamperFindingRemovedLog)
		if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "condition=NodeTampered") ||
			!strings.Contains(l, "reason="+string(report.ReasonProtectedFileChanged)) || !strings.Contains(l, "evil.yaml added") {
			t.Errorf("the removed finding is not logged as a warning with its condition, reason and message:\n%s", l)
		}
	}

	t.Run("no Kubernetes", func(t *testing.T) {
		cfg := withFinding(t)
		logs := &syncBuffer{}
		d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: newIdleListener()})
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := d.Store().Get("NodeTampered"); ok {
			t.Errorf("the disabled check's finding was restored: %+v", c)
		}
		check(t, logs.String())
	})

	t.Run("the Node carries it too", func(t *testing.T) {
		cfg := withFinding(t)
		client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: "NodeTampered", Status: corev1.ConditionTrue,
				Reason: string(report.ReasonProtectedFileChanged), Message: msg, LastTransitionTime: metav1.NewTime(since)}}}})
		logs := &syncBuffer{}
		d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)), Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		await(t, d, "NodeTampered taken off the Node and DiskUsageHigh written", func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
			if err != nil {
				return false
			}
			tampered, disk := false, false
			for _, c := range n.Status.Conditions {
				tampered = tampered || c.Type == "NodeTampered"
				disk = disk || c.Type == "DiskUsageHigh"
			}
			return !tampered && disk
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		check(t, logs.String())
	})
}
