package manifests

import (
	"fmt"
	"time"
)

// Cluster API objects for the spec's "Automatic replacement": which
// conditions each pool kind remediates on and after how long, the safety
// gates, the startup grace, and the Syself CAPH remediation templates that
// reboot before a machine is replaced.
//
// The objects are templates in clusterctl's variable syntax: ${CLUSTER_NAME}
// (the Cluster), ${HCLOUD_WORKER_DEPLOYMENT} and ${BAREMETAL_WORKER_DEPLOYMENT}
// (the MachineDeployments of the cloud and bare-metal worker pools); clusterctl
// generate yaml, envsubst or a kustomize replacement fills them in.

// UnhealthyCondition is a node condition a MachineHealthCheck acts on.
type UnhealthyCondition struct {
	Type    string
	Status  string
	Timeout time.Duration
}

// cloudConditions: spec "Cloud pools (HCloud control plane and HCloud
// workers)".
var cloudConditions = []UnhealthyCondition{
	{"Ready", "Unknown", 600 * time.Second},
	{"Ready", "False", 300 * time.Second},
	{"ReadonlyFilesystem", "True", 120 * time.Second},
	{"KernelDeadlock", "True", 120 * time.Second},
	{"ServiceNotRecovering", "True", 60 * time.Second},
	{"VerityCorruption", "True", 60 * time.Second},
}

// bareMetalConditions: spec "Bare-metal pools": Ready=False only.
var bareMetalConditions = []UnhealthyCondition{
	{"Ready", "False", 300 * time.Second},
}

// Pool is one kind of machine pool of the spec, with its gates.
type Pool struct {
	// Name is the MachineHealthCheck's name suffix.
	Name string
	// ControlPlane: the pool is the control plane (selected by
	// cluster.x-k8s.io/control-plane); else a MachineDeployment named by
	// DeploymentVar.
	ControlPlane  bool
	DeploymentVar string
	Conditions    []UnhealthyCondition
	// At most MaxUnhealthy machines (absolute), or, when Range is set,
	// only while the count of unhealthy machines is in that range.
	MaxUnhealthy int
	Range        string
	StartupGrace time.Duration
	// Remediation is the CAPH remediation template's kind.
	Remediation string
}

// Pools: the spec's "Safety gates and startup grace". A cluster has one
// control plane, HCloud or bare metal: apply the MachineHealthCheck of the
// kind it has.
var Pools = []Pool{
	{Name: "hcloud-control-plane", ControlPlane: true, Conditions: cloudConditions,
		MaxUnhealthy: 1, StartupGrace: 1800 * time.Second, Remediation: hcloudRemediation},
	{Name: "hcloud-workers", DeploymentVar: "${HCLOUD_WORKER_DEPLOYMENT}", Conditions: cloudConditions,
		Range: "[0-2]", StartupGrace: 600 * time.Second, Remediation: hcloudRemediation},
	{Name: "baremetal-control-plane", ControlPlane: true, Conditions: bareMetalConditions,
		MaxUnhealthy: 1, StartupGrace: 1800 * time.Second, Remediation: bareMetalRemediation},
	{Name: "baremetal-workers", DeploymentVar: "${BAREMETAL_WORKER_DEPLOYMENT}", Conditions: bareMetalConditions,
		MaxUnhealthy: 1, StartupGrace: 1800 * time.Second, Remediation: bareMetalRemediation},
}

const (
	capiGroup            = "cluster.x-k8s.io"
	caphAPIVersion       = "infrastructure.cluster.x-k8s.io/v1beta1"
	hcloudRemediation    = "HCloudRemediationTemplate"
	bareMetalRemediation = "HetznerBareMetalRemediationTemplate"
	// Drain before delete, detach volumes before delete (spec table).
	nodeDrainTimeout        = 180 * time.Second
	nodeVolumeDetachTimeout = 120 * time.Second
)

func remediationName(kind string) string {
	if kind == hcloudRemediation {
		return "${CLUSTER_NAME}-hcloud-reboot"
	}
	return "${CLUSTER_NAME}-baremetal-reboot"
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

func (p Pool) selector() labelSelector {
	l := map[string]string{"cluster.x-k8s.io/cluster-name": "${CLUSTER_NAME}"}
	if p.ControlPlane {
		l["cluster.x-k8s.io/control-plane"] = ""
	} else {
		l["cluster.x-k8s.io/deployment-name"] = p.DeploymentVar
	}
	return labelSelector{MatchLabels: l}
}

type typeMeta struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
}

func meta(apiVersion, kind, name string) typeMeta {
	return typeMeta{APIVersion: apiVersion, Kind: kind, Metadata: objectMeta{Name: name,
		Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "${CLUSTER_NAME}", "app.kubernetes.io/part-of": Job}}}
}

func mhcName(p Pool) string { return "${CLUSTER_NAME}-" + p.Name }

func seconds(d time.Duration) int { return int(d / time.Second) }

// v1beta2 (Cluster API v1.11 and later).
func renderMHCv1beta2() ([]byte, error) {
	type cond struct {
		Type           string `yaml:"type"`
		Status         string `yaml:"status"`
		TimeoutSeconds int    `yaml:"timeoutSeconds"`
	}
	type checks struct {
		NodeStartupTimeoutSeconds int    `yaml:"nodeStartupTimeoutSeconds"`
		UnhealthyNodeConditions   []cond `yaml:"unhealthyNodeConditions"`
	}
	type triggerIf struct {
		UnhealthyLessThanOrEqualTo *int   `yaml:"unhealthyLessThanOrEqualTo,omitempty"`
		UnhealthyInRange           string `yaml:"unhealthyInRange,omitempty"`
	}
	type ref struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Name       string `yaml:"name"`
	}
	type remediation struct {
		TriggerIf   triggerIf `yaml:"triggerIf"`
		TemplateRef ref       `yaml:"templateRef"`
	}
	type spec struct {
		ClusterName string        `yaml:"clusterName"`
		Selector    labelSelector `yaml:"selector"`
		Checks      checks        `yaml:"checks"`
		Remediation remediation   `yaml:"remediation"`
	}
	type mhc struct {
		typeMeta `yaml:",inline"`
		Spec     spec `yaml:"spec"`
	}
	var docs []any
	for _, p := range Pools {
		s := spec{ClusterName: "${CLUSTER_NAME}", Selector: p.selector(),
			Checks:      checks{NodeStartupTimeoutSeconds: seconds(p.StartupGrace)},
			Remediation: remediation{TemplateRef: ref{APIVersion: caphAPIVersion, Kind: p.Remediation, Name: remediationName(p.Remediation)}}}
		for _, c := range p.Conditions {
			s.Checks.UnhealthyNodeConditions = append(s.Checks.UnhealthyNodeConditions, cond{c.Type, c.Status, seconds(c.Timeout)})
		}
		if p.Range != "" {
			s.Remediation.TriggerIf.UnhealthyInRange = p.Range
		} else {
			n := p.MaxUnhealthy
			s.Remediation.TriggerIf.UnhealthyLessThanOrEqualTo = &n
		}
		docs = append(docs, mhc{meta(capiGroup+"/v1beta2", "MachineHealthCheck", mhcName(p)), s})
	}
	return yamlDocs("machinehealthchecks", docs...)
}

// v1beta1 (Cluster API before v1.11, still served by later ones).
func renderMHCv1beta1() ([]byte, error) {
	type cond struct {
		Type    string `yaml:"type"`
		Status  string `yaml:"status"`
		Timeout string `yaml:"timeout"`
	}
	type ref struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Name       string `yaml:"name"`
	}
	type spec struct {
		ClusterName         string        `yaml:"clusterName"`
		Selector            labelSelector `yaml:"selector"`
		UnhealthyConditions []cond        `yaml:"unhealthyConditions"`
		MaxUnhealthy        *int          `yaml:"maxUnhealthy,omitempty"`
		UnhealthyRange      string        `yaml:"unhealthyRange,omitempty"`
		NodeStartupTimeout  string        `yaml:"nodeStartupTimeout"`
		RemediationTemplate ref           `yaml:"remediationTemplate"`
	}
	type mhc struct {
		typeMeta `yaml:",inline"`
		Spec     spec `yaml:"spec"`
	}
	var docs []any
	for _, p := range Pools {
		s := spec{ClusterName: "${CLUSTER_NAME}", Selector: p.selector(),
			NodeStartupTimeout:  fmt.Sprintf("%ds", seconds(p.StartupGrace)),
			RemediationTemplate: ref{APIVersion: caphAPIVersion, Kind: p.Remediation, Name: remediationName(p.Remediation)}}
		for _, c := range p.Conditions {
			s.UnhealthyConditions = append(s.UnhealthyConditions, cond{c.Type, c.Status, fmt.Sprintf("%ds", seconds(c.Timeout))})
		}
		if p.Range != "" {
			s.UnhealthyRange = p.Range
		} else {
			n := p.MaxUnhealthy
			s.MaxUnhealthy = &n
		}
		docs = append(docs, mhc{meta(capiGroup+"/v1beta1", "MachineHealthCheck", mhcName(p)), s})
	}
	return yamlDocs("machinehealthchecks-v1beta1", docs...)
}

// The CAPH remediation templates (CAPH v1.1's infrastructure.cluster.x-k8s.io/
// v1beta1 API): HCloud reboots once and allows 180 s for it; bare metal
// reboots up to twice, 300 s each, then re-provisions the same host
// (onExhaustion Reuse: the machine is deleted and the host provisioned again).
func renderRemediationTemplates() ([]byte, error) {
	type strategy struct {
		Type         string `yaml:"type"`
		RetryLimit   int    `yaml:"retryLimit"`
		Timeout      string `yaml:"timeout"`
		OnExhaustion string `yaml:"onExhaustion,omitempty"`
	}
	type inner struct {
		Strategy strategy `yaml:"strategy"`
	}
	type template struct {
		Spec inner `yaml:"spec"`
	}
	type spec struct {
		Template template `yaml:"template"`
	}
	type obj struct {
		typeMeta `yaml:",inline"`
		Spec     spec `yaml:"spec"`
	}
	return yamlDocs("remediation-templates",
		obj{meta(caphAPIVersion, hcloudRemediation, remediationName(hcloudRemediation)),
			spec{template{inner{strategy{Type: "Reboot", RetryLimit: 1, Timeout: "180s"}}}}},
		obj{meta(caphAPIVersion, bareMetalRemediation, remediationName(bareMetalRemediation)),
			spec{template{inner{strategy{Type: "Reboot", RetryLimit: 2, Timeout: "300s", OnExhaustion: "Reuse"}}}}},
	)
}

// The drain and volume-detach timeouts, as merge patches of the generated
// MachineDeployment and KubeadmControlPlane.
func renderDeletionV1beta2() ([]byte, error) {
	deletion := map[string]int{
		"nodeDrainTimeoutSeconds":        seconds(nodeDrainTimeout),
		"nodeVolumeDetachTimeoutSeconds": seconds(nodeVolumeDetachTimeout),
	}
	md := map[string]any{"apiVersion": capiGroup + "/v1beta2", "kind": "MachineDeployment",
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"deletion": deletion}}}}
	kcp := map[string]any{"apiVersion": "controlplane." + capiGroup + "/v1beta2", "kind": "KubeadmControlPlane",
		"spec": map[string]any{"machineTemplate": map[string]any{"spec": map[string]any{"deletion": deletion}}}}
	return yamlDocs("deletion-settings", md, kcp)
}

func renderDeletionV1beta1() ([]byte, error) {
	t := map[string]string{
		"nodeDrainTimeout":        fmt.Sprintf("%ds", seconds(nodeDrainTimeout)),
		"nodeVolumeDetachTimeout": fmt.Sprintf("%ds", seconds(nodeVolumeDetachTimeout)),
	}
	md := map[string]any{"apiVersion": capiGroup + "/v1beta1", "kind": "MachineDeployment",
		"spec": map[string]any{"template": map[string]any{"spec": t}}}
	kcp := map[string]any{"apiVersion": "controlplane." + capiGroup + "/v1beta1", "kind": "KubeadmControlPlane",
		"spec": map[string]any{"machineTemplate": t}}
	return yamlDocs("deletion-settings-v1beta1", md, kcp)
}
