package kubeapi

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// roundTrip writes in as JSON, reads it into core/v1's type refusing
// unknown fields (a JSON name that is not core/v1's fails), and back.
func roundTrip(t *testing.T, in, core, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(core); err != nil {
		t.Fatalf("%T as %T: %v\n%s", in, core, err, b)
	}
	b, err = json.Marshal(core)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	// Compared as JSON: a time read back is in the local zone.
	want, _ := json.Marshal(in)
	got, _ := json.Marshal(out)
	if !bytes.Equal(got, want) {
		t.Errorf("%T through %T:\n got %s\nwant %s", in, core, got, want)
	}
}

func TestTypesMatchCoreV1(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 2, 22, 0, 0, 0, time.UTC))
	var n Node
	n.Metadata.Name = "node-a"
	n.Metadata.Annotations = map[string]string{"autopilot.syself.com/report": "{}"}
	n.Status.Conditions = []NodeCondition{{Type: "DiskUsageHigh", Status: "False", LastHeartbeatTime: at, LastTransitionTime: at, Reason: "DiskUsageOK", Message: "m"}}
	roundTrip(t, &n, &corev1.Node{}, &Node{})

	ev := Event{APIVersion: "v1", Kind: "Event",
		InvolvedObject: ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a", APIVersion: "v1"},
		Reason:         "OOMKilling", Message: "m", FirstTimestamp: at, LastTimestamp: at, Count: 3, Type: EventTypeWarning,
		ReportingController: "autopilot-health", ReportingInstance: "node-a"}
	ev.Metadata.Name, ev.Metadata.Namespace = "node-a.1", "default"
	ev.Source.Component, ev.Source.Host = "autopilot-health", "node-a"
	var core corev1.Event
	roundTrip(t, &ev, &core, &Event{})
	if core.ReportingController != "autopilot-health" || core.Source.Host != "node-a" || core.InvolvedObject.UID != "node-a" || core.Type != corev1.EventTypeWarning {
		t.Errorf("core/v1 reads %+v", core)
	}
}
