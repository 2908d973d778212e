// Package kubeapi has the parts of core/v1 objects the daemon reads and
// writes, with core/v1's JSON names. k8s.io/api/core/v1 itself is not
// linked into the daemon: its generated code and type registrations are
// about a megabyte of the daemon's resident memory (README, Cost).
// TestTypesMatchCoreV1 holds these to core/v1.
package kubeapi

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node is what the reporter reads of its Node: which Node it is (the UID
// changes when the Node is deleted and registered again), the annotations
// and the conditions.
type Node struct {
	Metadata struct {
		Name        string            `json:"name"`
		UID         string            `json:"uid,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Status struct {
		Conditions []NodeCondition `json:"conditions,omitempty"`
	} `json:"status"`
}

// NodeCondition is core/v1 NodeCondition.
type NodeCondition struct {
	Type               string      `json:"type"`
	Status             string      `json:"status"`
	LastHeartbeatTime  metav1.Time `json:"lastHeartbeatTime,omitempty"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	Reason             string      `json:"reason,omitempty"`
	Message            string      `json:"message,omitempty"`
}

// Event is the core/v1 Event the daemon creates.
type Event struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	InvolvedObject ObjectReference `json:"involvedObject"`
	Reason         string          `json:"reason,omitempty"`
	Message        string          `json:"message,omitempty"`
	Source         struct {
		Component string `json:"component,omitempty"`
		Host      string `json:"host,omitempty"`
	} `json:"source,omitempty"`
	FirstTimestamp      metav1.Time `json:"firstTimestamp,omitempty"`
	LastTimestamp       metav1.Time `json:"lastTimestamp,omitempty"`
	Count               int32       `json:"count,omitempty"`
	Type                string      `json:"type,omitempty"`
	ReportingController string      `json:"reportingComponent"`
	ReportingInstance   string      `json:"reportingInstance"`
}

// ObjectReference is core/v1 ObjectReference (the fields an Event about a
// Node sets).
type ObjectReference struct {
	Kind       string `json:"kind,omitempty"`
	Name       string `json:"name,omitempty"`
	UID        string `json:"uid,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
}

// EventTypeWarning is core/v1's EventTypeWarning.
const EventTypeWarning = "Warning"

// EventTypeNormal is core/v1's EventTypeNormal.
const EventTypeNormal = "Normal"
