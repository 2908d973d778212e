// Package kubefake makes a kube.Client of a client-go clientset, for tests:
// a fake clientset (k8s.io/client-go/kubernetes/fake) records every action
// the reporter takes, and an admin clientset reaches a real API server. The
// daemon itself links none of this (see kube.Client).
package kubefake

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"

	"github.com/syself/autopilot-health/report/kube/kubeapi"
)

// New returns cs as a kube.Client (it implements the interface without
// importing kube, so kube's own tests can use it).
func New(cs kubernetes.Interface) Client { return Client{cs} }

// Client is a kube.Client on a clientset.
type Client struct{ cs kubernetes.Interface }

func (c Client) GetNode(ctx context.Context, name string) (*kubeapi.Node, error) {
	return node(c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}))
}

func (c Client) PatchNodeStatus(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	return node(c.cs.CoreV1().Nodes().PatchStatus(ctx, name, patch))
}

// PatchNode refuses a patch whose metadata.uid is not the Node's, as
// kube-apiserver does (422, "metadata.uid: field is immutable"), where the
// fake clientset would overwrite the UID.
func (c Client) PatchNode(ctx context.Context, name string, patch []byte) (*kubeapi.Node, error) {
	var p struct {
		Metadata struct {
			UID types.UID `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err == nil && p.Metadata.UID != "" {
		n, err := c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if n.UID != p.Metadata.UID {
			return nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, name, field.ErrorList{
				field.Invalid(field.NewPath("metadata", "uid"), p.Metadata.UID, "field is immutable")})
		}
	}
	return node(c.cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}))
}

// node converts an answer's Node.
func node(n *corev1.Node, err error) (*kubeapi.Node, error) {
	if err != nil {
		return nil, err
	}
	out := &kubeapi.Node{}
	return out, convert(n, out)
}

func (c Client) CreateEvent(ctx context.Context, ev *kubeapi.Event) error {
	var out corev1.Event
	if err := convert(ev, &out); err != nil {
		return err
	}
	_, err := c.cs.CoreV1().Events(out.Namespace).Create(ctx, &out, metav1.CreateOptions{})
	return err
}

// convert goes through JSON, as the daemon's own client does on the wire.
func convert(in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

func (c Client) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*kubeapi.Event, error) {
	ev, err := c.cs.CoreV1().Events(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, err
	}
	out := &kubeapi.Event{}
	return out, convert(ev, out)
}
