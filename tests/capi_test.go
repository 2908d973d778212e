//go:build integration

package tests

// The shipped Cluster API objects (packaging/manifests) on a real
// kube-apiserver with Cluster API's own CRDs installed: server-side schema
// validation with strict field validation, the strictest check there is.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/syself/autopilot-health/internal/manifests"
	"github.com/syself/autopilot-health/tests/harness"
)

// clusterVars fills the templates' clusterctl variables.
var clusterVars = strings.NewReplacer(
	"${CLUSTER_NAME}", "prod-1",
	"${HCLOUD_WORKER_DEPLOYMENT}", "prod-1-md-hcloud",
	"${BAREMETAL_WORKER_DEPLOYMENT}", "prod-1-md-baremetal",
)

func yamlObjects(t *testing.T, b []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

func rendered(t *testing.T, kind string) []*unstructured.Unstructured {
	t.Helper()
	m, ok := manifests.Lookup(kind)
	if !ok {
		t.Fatalf("no manifest %s", kind)
	}
	b, err := m.Render()
	if err != nil {
		t.Fatal(err)
	}
	return yamlObjects(t, []byte(clusterVars.Replace(string(b))))
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates the CRDs and waits until each is established.
func installCRDs(t *testing.T, dyn dynamic.Interface, files []string) {
	t.Helper()
	ctx := context.Background()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, crd := range yamlObjects(t, b) {
			_, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("CRD %s: %v", crd.GetName(), err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
				if err == nil && established(got) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("CRD %s not established in 30 s (%v)", crd.GetName(), err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

func gvrOf(u *unstructured.Unstructured) schema.GroupVersionResource {
	gv, _ := schema.ParseGroupVersion(u.GetAPIVersion())
	return gv.WithResource(strings.ToLower(u.GetKind()) + "s")
}

// create creates obj with strict field validation (an unknown or duplicate
// field is an error, not a warning) as a dry run.
func create(dyn dynamic.Interface, ns string, obj *unstructured.Unstructured) error {
	_, err := dyn.Resource(gvrOf(obj)).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{
		FieldValidation: "Strict", DryRun: []string{metav1.DryRunAll}})
	return err
}

// mergeInto deep-merges patch into obj (maps merge, anything else replaces).
func mergeInto(obj, patch map[string]any) {
	for k, v := range patch {
		if pm, ok := v.(map[string]any); ok {
			if om, ok := obj[k].(map[string]any); ok {
				mergeInto(om, pm)
				continue
			}
		}
		obj[k] = v
	}
}

// adminDynamic is a dynamic client of the real kube-apiserver as a
// cluster admin (system:masters) named name.
func adminDynamic(t *testing.T, name string) dynamic.Interface {
	t.Helper()
	kc, err := apiServer(t).Kubeconfig(name, name, []string{"system:masters"}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

func TestShippedClusterAPIObjectsOnARealAPIServer(t *testing.T) {
	dyn := adminDynamic(t, "capi-admin")
	crds, err := harness.ClusterAPICRDs()
	if err != nil {
		t.Fatalf("Cluster API CRDs: %v", err)
	}
	caph, _ := filepath.Glob("testdata/caph/*.yaml")
	installCRDs(t, dyn, append(crds, caph...))
	const ns = "default"

	t.Run("shipped", func(t *testing.T) {
		n := 0
		for _, kind := range []string{"machinehealthchecks", "machinehealthchecks-v1beta1", "remediation-templates"} {
			for _, obj := range rendered(t, kind) {
				if err := create(dyn, ns, obj); err != nil {
					t.Errorf("%s %s %s: %v", kind, obj.GetKind(), obj.GetName(), err)
				}
				n++
			}
		}
		if n != 2*len(manifests.Pools)+2 {
			t.Errorf("validated %d objects, want %d", n, 2*len(manifests.Pools)+2)
		}
	})

	// The drain and detach patches, applied to minimal MachineDeployments
	// and KubeadmControlPlanes of each version.
	t.Run("deletion settings", func(t *testing.T) {
		base := map[string]map[string]any{
			"cluster.x-k8s.io/v1beta2/MachineDeployment": {"spec": map[string]any{
				"clusterName": "prod-1", "selector": map[string]any{},
				"template": map[string]any{"spec": map[string]any{"clusterName": "prod-1",
					"bootstrap":         map[string]any{"dataSecretName": "bootstrap"},
					"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "HCloudMachineTemplate", "name": "m"}}}}},
			"controlplane.cluster.x-k8s.io/v1beta2/KubeadmControlPlane": {"spec": map[string]any{
				"version": "v1.33.0",
				"machineTemplate": map[string]any{"spec": map[string]any{
					"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "HCloudMachineTemplate", "name": "m"}}}}},
			"cluster.x-k8s.io/v1beta1/MachineDeployment": {"spec": map[string]any{
				"clusterName": "prod-1", "selector": map[string]any{},
				"template": map[string]any{"spec": map[string]any{"clusterName": "prod-1",
					"bootstrap":         map[string]any{"dataSecretName": "bootstrap"},
					"infrastructureRef": map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "HCloudMachineTemplate", "name": "m"}}}}},
			"controlplane.cluster.x-k8s.io/v1beta1/KubeadmControlPlane": {"spec": map[string]any{
				"version": "v1.33.0", "kubeadmConfigSpec": map[string]any{},
				"machineTemplate": map[string]any{
					"infrastructureRef": map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "HCloudMachineTemplate", "name": "m"}}}},
		}
		n := 0
		for _, kind := range []string{"deletion-settings", "deletion-settings-v1beta1"} {
			for _, patch := range rendered(t, kind) {
				key := patch.GetAPIVersion() + "/" + patch.GetKind()
				b, ok := base[key]
				if !ok {
					t.Fatalf("no base object for %s", key)
				}
				obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": patch.GetAPIVersion(), "kind": patch.GetKind(),
					"metadata": map[string]any{"name": "prod-1-" + strings.ToLower(patch.GetKind())}}}
				mergeInto(obj.Object, b)
				mergeInto(obj.Object, patch.Object)
				if err := create(dyn, ns, obj); err != nil {
					t.Errorf("%s with %s: %v", key, kind, err)
				}
				n++
			}
		}
		if n != 4 {
			t.Errorf("validated %d patched objects, want 4", n)
		}
	})

	// The validation above can fail: the same server refuses what the
	// schemas refuse.
	t.Run("refused", func(t *testing.T) {
		mhc := rendered(t, "machinehealthchecks")[0]
		conds, _, _ := unstructured.NestedSlice(mhc.Object, "spec", "checks", "unhealthyNodeConditions")
		conds[0].(map[string]any)["timeoutSeconds"] = int64(-1)
		unstructured.SetNestedSlice(mhc.Object, conds, "spec", "checks", "unhealthyNodeConditions")
		if err := create(dyn, ns, mhc); err == nil || !strings.Contains(err.Error(), "timeoutSeconds") {
			t.Errorf("a negative timeout: %v, want refused", err)
		}
		old := rendered(t, "machinehealthchecks-v1beta1")[0]
		unstructured.SetNestedField(old.Object, "1m", "spec", "nodeStartupTimeoutSeconds")
		if err := create(dyn, ns, old); err == nil || !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("a v1beta2 field in v1beta1: %v, want refused as unknown", err)
		}
		tmpl := rendered(t, "remediation-templates")[1]
		unstructured.SetNestedField(tmpl.Object, "Replace", "spec", "template", "spec", "strategy", "onExhaustion")
		if err := create(dyn, ns, tmpl); err == nil || !strings.Contains(err.Error(), "onExhaustion") {
			t.Errorf("onExhaustion Replace: %v, want refused", err)
		}
	})
}

// kubeconform -strict, with JSON schemas converted from the same CRDs by
// kubeconform's own openapi2jsonschema.py: the check an operator's CI would
// run on these files before applying them.
func TestShippedClusterAPIObjectsPassKubeconform(t *testing.T) {
	bin, converter, err := harness.Kubeconform()
	if err != nil {
		t.Fatalf("kubeconform: %v", err)
	}
	crds, err := harness.ClusterAPICRDs()
	if err != nil {
		t.Fatalf("Cluster API CRDs: %v", err)
	}
	caph, _ := filepath.Glob("testdata/caph/*.yaml")
	for i := range caph {
		caph[i], _ = filepath.Abs(caph[i])
	}
	schemas := t.TempDir()
	conv := exec.Command("python3", append([]string{converter}, append(crds, caph...)...)...)
	conv.Dir = schemas
	conv.Env = append(os.Environ(), "FILENAME_FORMAT={kind}_{version}")
	if out, err := conv.CombinedOutput(); err != nil {
		t.Fatalf("openapi2jsonschema.py (needs python3-yaml): %v\n%s", err, out)
	}
	kubeconform := func(objs []*unstructured.Unstructured) (string, error) {
		var b bytes.Buffer
		for _, o := range objs {
			j, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString("---\n")
			b.Write(j)
			b.WriteString("\n")
		}
		f := filepath.Join(t.TempDir(), "objects.yaml")
		if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "-strict", "-summary",
			"-schema-location", filepath.Join(schemas, "{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"), f).CombinedOutput()
		return string(out), err
	}
	var objs []*unstructured.Unstructured
	for _, kind := range []string{"machinehealthchecks", "machinehealthchecks-v1beta1", "remediation-templates"} {
		objs = append(objs, rendered(t, kind)...)
	}
	out, err := kubeconform(objs)
	want := fmt.Sprintf("Valid: %d, Invalid: 0, Errors: 0, Skipped: 0", len(objs))
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("kubeconform: %v, want %q in\n%s", err, want, out)
	}
	bad := rendered(t, "machinehealthchecks")[0]
	unstructured.SetNestedField(bad.Object, int64(1), "spec", "maxUnhealthy")
	if out, err := kubeconform([]*unstructured.Unstructured{bad}); err == nil || !strings.Contains(out, "Invalid: 1") {
		t.Errorf("kubeconform accepted a v1beta1 field in v1beta2: %v\n%s", err, out)
	}
}

// The Prometheus Operator objects (PrometheusRule, ScrapeConfig) on the real
// kube-apiserver with the Operator's own CRDs, strict field validation.
func TestShippedPrometheusOperatorObjectsOnARealAPIServer(t *testing.T) {
	dyn := adminDynamic(t, "promop-admin")
	crds, err := harness.PrometheusOperatorCRDs()
	if err != nil {
		t.Fatalf("Prometheus Operator CRDs: %v", err)
	}
	installCRDs(t, dyn, crds)
	for _, kind := range []string{"prometheusrule", "scrapeconfig"} {
		objs := rendered(t, kind)
		if len(objs) != 1 {
			t.Fatalf("%s: %d objects", kind, len(objs))
		}
		if err := create(dyn, "default", objs[0]); err != nil {
			t.Errorf("%s: %v", kind, err)
		}
	}
	// Refused: a for: that is not a Prometheus duration, a role not known.
	rule := rendered(t, "prometheusrule")[0]
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	rules := groups[0].(map[string]any)["rules"].([]any)
	rules[0].(map[string]any)["for"] = "5 minutes"
	unstructured.SetNestedSlice(rule.Object, groups, "spec", "groups")
	// Refused for that field, as the API server words it: any error
	// containing "for" or "role" (a 403's "forbidden", "waiting for") is
	// not the refusal.
	if err := create(dyn, "default", rule); err == nil || !strings.Contains(err.Error(), `spec.groups[0].rules[0].for: Invalid value: "5 minutes"`) {
		t.Errorf("for: \"5 minutes\": %v, want refused", err)
	}
	sc := rendered(t, "scrapeconfig")[0]
	unstructured.SetNestedSlice(sc.Object, []any{map[string]any{"role": "Machine"}}, "spec", "kubernetesSDConfigs")
	if err := create(dyn, "default", sc); err == nil || !strings.Contains(err.Error(), `spec.kubernetesSDConfigs[0].role: Unsupported value: "Machine"`) {
		t.Errorf("role Machine: %v, want refused", err)
	}
}
