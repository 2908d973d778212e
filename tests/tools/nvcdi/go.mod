// Separate module: NVIDIA's own CDI spec generator (nvidia-ctk's pkg/nvcdi)
// for the GpuActivationFailed integration test. Not imported by the daemon.
module github.com/syself/autopilot-health/tests/tools/nvcdi

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/NVIDIA/nvidia-container-toolkit v1.20.2
	github.com/sirupsen/logrus v1.9.4
)

require (
	github.com/Masterminds/semver/v3 v3.5.0 // indirect
	github.com/NVIDIA/go-nvlib v0.12.0 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/moby/sys/devices v0.1.0 // indirect
	github.com/opencontainers/cgroups v0.1.0 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
	tags.cncf.io/container-device-interface v1.1.1 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
