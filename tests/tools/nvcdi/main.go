// Command gen-cdi writes a CDI spec for NVIDIA GPUs with the code
// `nvidia-ctk cdi generate` runs (github.com/NVIDIA/nvidia-container-toolkit
// pkg/nvcdi and its spec writer, the same options as its generateSpecs),
// with NVML answered by go-nvml's mock of a DGX H100 in place of a driver:
// one H100 per -uuids entry, in that order (NVML's index). The driver root
// must hold what nvcdi looks up: the /dev/nvidia* character devices and
// libcuda.so.550.54.15 (the mock's driver version).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/spec"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"
	"github.com/sirupsen/logrus"
)

func main() {
	driverRoot := flag.String("driver-root", "/", "the driver root nvcdi looks devices and libraries up in")
	output := flag.String("output", "", "the spec file to write (.yaml or .json)")
	uuids := flag.String("uuids", "", "comma-separated GPU UUIDs, one per GPU, in NVML index order")
	names := flag.String("device-name-strategy", "index,uuid", "comma-separated device name strategies (nvidia-ctk's default: index,uuid)")
	flag.Parse()
	if err := run(*driverRoot, *output, strings.Split(*uuids, ","), strings.Split(*names, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "gen-cdi:", err)
		os.Exit(1)
	}
}

func run(driverRoot, output string, uuids, strategies []string) error {
	mock := dgxh100.NewWithGPUs(gpus.Multiple(len(uuids), gpus.H100_SXM5_80GB)...)
	for i, d := range mock.Devices {
		dev := d.(*server.Device)
		dev.UUID = uuids[i]
		// Not implemented by the mock (as nvidia-ctk's own tests set it).
		dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	}
	var namers []nvcdi.DeviceNamer
	for _, s := range strategies {
		n, err := nvcdi.NewDeviceNamer(s)
		if err != nil {
			return err
		}
		namers = append(namers, n)
	}
	log := logrus.New()
	log.SetLevel(logrus.ErrorLevel) // its warnings name every driver file this root lacks
	lib, err := nvcdi.New(
		nvcdi.WithLogger(log),
		nvcdi.WithDriverRoot(driverRoot),
		nvcdi.WithNVIDIACDIHookPath("/usr/bin/nvidia-cdi-hook"),
		nvcdi.WithDeviceNamers(namers...),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(mock),
	)
	if err != nil {
		return fmt.Errorf("creating the CDI library: %w", err)
	}
	devices, err := lib.GetDeviceSpecsByID("all")
	if err != nil {
		return fmt.Errorf("device specs: %w", err)
	}
	common, err := lib.GetCommonEdits()
	if err != nil {
		return fmt.Errorf("common edits: %w", err)
	}
	format := spec.FormatYAML
	if strings.HasSuffix(output, ".json") {
		format = spec.FormatJSON
	}
	s, err := spec.New(
		spec.WithVendor("nvidia.com"),
		spec.WithClass("gpu"),
		spec.WithEdits(*common.ContainerEdits),
		spec.WithFormat(format),
		spec.WithPermissions(0o644),
		spec.WithMergedDeviceOptions(transform.WithName("all"), transform.WithSkipIfExists(true)),
		spec.WithDeviceSpecs(devices),
	)
	if err != nil {
		return err
	}
	return s.Save(output)
}
