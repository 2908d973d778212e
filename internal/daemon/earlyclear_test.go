package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/syself/autopilot-health/internal/config"
	"github.com/syself/autopilot-health/report"
	"github.com/syself/autopilot-health/report/kube/kubefake"
	"github.com/syself/autopilot-health/tamper"
)

// An operator's clear of an earlier boot, published on the Node (the
// tamper report's cleared.at) and in tamper.json: after a reboot, the
// first write of the conditions carries this boot's report (as far as the
// checks have collected it), before the tamper checks ran. That report
// must keep the clear: the Node is the record of it ("The last clear is
// visible on the Node"), and the only one a restart trusts (the clear in
// tamper.json alone is never reported again once the Node lost it).
func TestEarlyReportKeepsThePublishedClear(t *testing.T) {
	cfg := testConfig(t)
	// The tamper checks' first runs come after the first write of the
	// conditions, as with the shipped 5 s spread at a node's start.
	cfg.Runner.FirstRunSpread = config.Duration{Duration: 5 * time.Minute}
	at := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	k := tamper.NewKeeper(cfg.StateDir, "boot-a", false)
	if err := k.Load(at); err != nil {
		t.Fatal(err)
	}
	if err := k.ClearAll(tamper.Clear{At: at, Reason: "INC-1: reviewed", By: "sudo user alice"}); err != nil {
		t.Fatal(err)
	}
	published := fmt.Sprintf(`{"schemaVersion":1,"bootID":"boot-a","tamper":{"cleared":{"at":%q,"reason":"INC-1: reviewed","by":"sudo user alice"}}}`,
		at.Format(time.RFC3339))
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, Annotations: map[string]string{
		report.AnnotationPrefix + "storage": `{"schemaVersion":1,"bootID":"boot-a"}`,
		report.AnnotationPrefix + "tamper":  published,
	}}})
	statusWrites := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	node := func() *corev1.Node {
		n, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", cfg.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		return n.(*corev1.Node)
	}
	// run starts the daemon and stops it after its first write of the
	// conditions (before the first pass: a restart then).
	run := func(what string) *Daemon {
		before := statusWrites()
		d, err := New(cfg, quietLog(), Options{Version: "test", Listener: newIdleListener(), Kube: kubefake.New(client)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		deadline := time.Now().Add(20 * time.Second)
		for statusWrites() == before {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no write of the conditions within 20 s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := report.ReportedClear(node().Annotations); !got.Equal(at) {
			t.Errorf("%s: the clear published on the Node: %v; want %v (tamper report %s)", what, got, at,
				node().Annotations[report.AnnotationPrefix+"tamper"])
		}
		return d
	}
	run("after the first write of this boot's conditions")
	d := run("after a restart before the first pass")
	if c := d.currentEnv().Tamper.Report().Cleared; c == nil || !c.At.Equal(at) {
		t.Errorf("the clear the tamper report carries after the restart: %+v; want the one of %v", c, at)
	}
}
