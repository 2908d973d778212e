package manifests

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"testing"

	"go.yaml.in/yaml/v3"
)

// renderedDecoder is a decoder of the YAML documents of the manifest of
// kind, as rendered.
func renderedDecoder(t *testing.T, kind string) *yaml.Decoder {
	t.Helper()
	m, ok := Lookup(kind)
	if !ok {
		t.Fatalf("no manifest %s", kind)
	}
	b, err := m.Render()
	if err != nil {
		t.Fatal(err)
	}
	return yaml.NewDecoder(bytes.NewReader(b))
}

// renderedDocs decodes every YAML document of the manifest of kind.
func renderedDocs(t *testing.T, kind string) []map[string]any {
	t.Helper()
	var out []map[string]any
	dec := renderedDecoder(t, kind)
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		out = append(out, doc)
	}
}

// dig returns the value at path in nested maps (nil where it is not).
func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// The remediation templates as rendered say what the spec's "Automatic
// replacement" says, written out here again rather than read from capi.go:
// cloud pools reboot once and allow up to 180 s for it, then replace the
// machine (spec, under the cloud table); bare metal reboots up to two times,
// 300 s each, then re-provisions the same host (the bare-metal table's
// "reboot (up to 2x), then re-provision", and its note). The MachineHealthChecks'
// own figures are TestMachineHealthChecksFollowTheSpec's.
func TestRemediationTemplatesFollowTheSpec(t *testing.T) {
	type strategy struct {
		kind, typ    string
		retryLimit   int
		timeout      string
		onExhaustion any
	}
	spec := map[string]strategy{
		"${CLUSTER_NAME}-hcloud-reboot":    {"HCloudRemediationTemplate", "Reboot", 1, "180s", nil},
		"${CLUSTER_NAME}-baremetal-reboot": {"HetznerBareMetalRemediationTemplate", "Reboot", 2, "300s", "Reuse"},
	}
	remaining := maps.Clone(spec)
	for _, doc := range renderedDocs(t, "remediation-templates") {
		name, _ := dig(doc, "metadata", "name").(string)
		want, ok := remaining[name]
		if !ok {
			t.Errorf("remediation template %q is not one of the spec's, or twice", name)
			continue
		}
		delete(remaining, name)
		s := dig(doc, "spec", "template", "spec", "strategy")
		got := strategy{kind: dig(doc, "kind").(string)}
		got.typ, _ = dig(s, "type").(string)
		got.retryLimit, _ = dig(s, "retryLimit").(int)
		got.timeout, _ = dig(s, "timeout").(string)
		got.onExhaustion = dig(s, "onExhaustion")
		if got != want {
			t.Errorf("%s: %+v, the spec's %+v", name, got, want)
		}
	}
	for name := range remaining {
		t.Errorf("no remediation template %s", name)
	}
}

// Drain before delete 180 s and detach volumes before delete 120 s, on the
// control plane and on every worker pool alike (spec, "Safety gates and
// startup grace"), in both Cluster API versions.
func TestDeletionSettingsFollowTheSpec(t *testing.T) {
	for _, tc := range []struct {
		kind           string
		md, kcp        []string // where the settings sit in each object
		drain, detach  any
		drainKey, dKey string
	}{
		{"deletion-settings", []string{"spec", "template", "spec", "deletion"}, []string{"spec", "machineTemplate", "spec", "deletion"},
			180, 120, "nodeDrainTimeoutSeconds", "nodeVolumeDetachTimeoutSeconds"},
		{"deletion-settings-v1beta1", []string{"spec", "template", "spec"}, []string{"spec", "machineTemplate"},
			"180s", "120s", "nodeDrainTimeout", "nodeVolumeDetachTimeout"},
	} {
		seen := map[string]bool{}
		for _, doc := range renderedDocs(t, tc.kind) {
			kind, _ := doc["kind"].(string)
			seen[kind] = true
			var at []string
			switch kind {
			case "MachineDeployment":
				at = tc.md
			case "KubeadmControlPlane":
				at = tc.kcp
			default:
				t.Errorf("%s: unexpected %s", tc.kind, kind)
				continue
			}
			s := dig(doc, at...)
			if d := dig(s, tc.drainKey); d != tc.drain {
				t.Errorf("%s %s: %s = %v, the spec's is %v", tc.kind, kind, tc.drainKey, d, tc.drain)
			}
			if d := dig(s, tc.dKey); d != tc.detach {
				t.Errorf("%s %s: %s = %v, the spec's is %v", tc.kind, kind, tc.dKey, d, tc.detach)
			}
		}
		if !seen["MachineDeployment"] || !seen["KubeadmControlPlane"] {
			t.Errorf("%s: objects %v, want a MachineDeployment and a KubeadmControlPlane", tc.kind, seen)
		}
	}
}
