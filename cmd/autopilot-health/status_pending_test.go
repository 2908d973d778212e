package main

import (
	"strings"
	"testing"
	"time"

	"github.com/syself/autopilot-health/internal/daemon"
	"github.com/syself/autopilot-health/report/kube"
)

// A daemon waiting for its kubeconfig (a node whose kubelet has not joined
// yet) queues its events for the API server: a tamper clear's
// TamperCleared, the kernel's events. status says they are pending, as it
// does while reporting, since a stop before the kubeconfig comes loses
// them; before, the screen said only "waiting (...)", and the count was in
// --json alone.
func TestStatusShowsTheEventsPendingWhileWaitingForTheKubeconfig(t *testing.T) {
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	waiting := daemon.KubernetesStatus{State: "waiting", Detail: "for a usable kubeconfig: no kubeconfig: /etc/kubernetes/kubelet.conf does not exist"}
	for _, tc := range []struct {
		queued int
		want   string
	}{
		{1, "Kubernetes: waiting (for a usable kubeconfig: no kubeconfig: /etc/kubernetes/kubelet.conf does not exist)\n  conditions last written: never; pending: 1 event\n"},
		{3, "  conditions last written: never; pending: 3 events\n"},
	} {
		k := waiting
		k.Reporting = kube.Reporting{EventsQueued: tc.queued}
		var b strings.Builder
		printStatus(&b, daemon.StatusReport{Now: now, Kubernetes: k})
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("%d events queued: status lacks %q:\n%s", tc.queued, tc.want, b.String())
		}
	}
	// Nothing queued: nothing more than the state.
	var b strings.Builder
	printStatus(&b, daemon.StatusReport{Now: now, Kubernetes: waiting})
	if strings.Contains(b.String(), "pending") {
		t.Errorf("nothing queued, yet status says something is pending:\n%s", b.String())
	}
}

// A report document left out for want of room on the Node is said where an
// operator looks, and so is the tamper annotation left as it was (not even
// its stub fits), whose updatedAt then stands still though the daemon runs:
// a stale updatedAt there is not the daemon gone. Before, only the journal
// (once) and a counter said so.
func TestStatusShowsReportDocumentsLeftOut(t *testing.T) {
	now := time.Date(2026, 12, 2, 19, 0, 0, 0, time.UTC)
	k := daemon.KubernetesStatus{State: "reporting", Reporting: kube.Reporting{ReportLeftOut: []string{"tamper", "disks"}, TamperAnnotationAsIs: true}}
	var b strings.Builder
	printStatus(&b, daemon.StatusReport{Now: now, Kubernetes: k})
	for _, want := range []string{
		"  REPORT DOCUMENTS LEFT OUT (no room on the Node beside its other annotations): tamper, disks\n",
		"  the Node's tamper annotation is left as it was (not even its stub fits): its updatedAt stands still while the daemon runs",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printStatus(&b, daemon.StatusReport{Now: now, Kubernetes: daemon.KubernetesStatus{State: "reporting"}})
	if strings.Contains(b.String(), "LEFT OUT") || strings.Contains(b.String(), "left as it was") {
		t.Errorf("the whole report written, yet status says something is left out:\n%s", b.String())
	}
}
