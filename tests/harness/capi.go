package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ClusterAPIVersion is the Cluster API release whose CRDs validate the
// shipped MachineHealthChecks (v1.11 serves v1beta2 and v1beta1).
const ClusterAPIVersion = "v1.11.3"

// ClusterAPICRDs fetches the Cluster API module from the Go module proxy
// (into the module cache, once per machine) and returns the paths of the
// CRDs the shipped manifests use: MachineHealthCheck, MachineDeployment and
// KubeadmControlPlane.
func ClusterAPICRDs() ([]string, error) {
	return moduleFiles("sigs.k8s.io/cluster-api@"+ClusterAPIVersion,
		"config/crd/bases/cluster.x-k8s.io_machinehealthchecks.yaml",
		"config/crd/bases/cluster.x-k8s.io_machinedeployments.yaml",
		"controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml")
}

// PrometheusOperatorVersion is the Prometheus Operator release whose CRDs
// validate the shipped PrometheusRule and ScrapeConfig.
const PrometheusOperatorVersion = "v0.85.0"

// PrometheusOperatorCRDs returns the paths of the Prometheus Operator's
// PrometheusRule and ScrapeConfig CRDs, from its module on the proxy.
func PrometheusOperatorCRDs() ([]string, error) {
	return moduleFiles("github.com/prometheus-operator/prometheus-operator@"+PrometheusOperatorVersion,
		"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_scrapeconfigs.yaml")
}

// moduleFiles downloads module@version into the module cache (once per
// machine) and returns the paths of the named files in it.
func moduleFiles(modVersion string, files ...string) ([]string, error) {
	dir, err := os.MkdirTemp("", "module-download-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s: %v\n%s", modVersion, err, out)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, err
	}
	if mod.Error != "" || mod.Dir == "" {
		return nil, fmt.Errorf("go mod download %s: %s", modVersion, mod.Error)
	}
	var paths []string
	for _, f := range files {
		p := filepath.Join(mod.Dir, f)
		if _, err := os.Stat(p); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// KubeconformVersion is the kubeconform release built for the tests.
const KubeconformVersion = "v0.7.0"

// Kubeconform builds kubeconform from the Go module proxy into
// tests/.cache/bin (once per machine) and returns its path and the path of
// the openapi2jsonschema.py script it ships, which turns CRDs into the JSON
// schemas kubeconform reads.
func Kubeconform() (bin, converter string, err error) {
	dir := filepath.Join(repoRoot(), "tests", ".cache", "bin")
	bin = filepath.Join(dir, "kubeconform")
	if _, err := os.Stat(bin); err != nil {
		cmd := exec.Command("go", "install", "github.com/yannh/kubeconform/cmd/kubeconform@"+KubeconformVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go install kubeconform@%s: %v\n%s", KubeconformVersion, err, out)
		}
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", "", err
	}
	converter = filepath.Join(string(bytesTrimSpace(out)), "github.com/yannh/kubeconform@"+KubeconformVersion, "scripts", "openapi2jsonschema.py")
	if _, err := os.Stat(converter); err != nil {
		return "", "", err
	}
	return bin, converter, nil
}

func bytesTrimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
