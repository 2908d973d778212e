#!/usr/bin/env bash
# Regenerates checks/testdata/cdi/nvidia-*.{yaml,json} with gen-cdi (the code
# of `nvidia-ctk cdi generate`, NVML mocked): a driver root in a temporary
# directory with the /dev/nvidia* character devices (mknod: run as root) and
# libcuda, then that root's path written as "/" (as on a host, whose driver
# root is /). The UUIDs are those of checks/testdata/roots/pci-*-gpu.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/../../../checks/testdata/cdi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
drv=$tmp/drv
mkdir -p "$drv/dev" "$drv/usr/lib/x86_64-linux-gnu"
for i in 0 1 2 3; do mknod "$drv/dev/nvidia$i" c 195 $i; done
mknod "$drv/dev/nvidiactl" c 195 255; mknod "$drv/dev/nvidia-modeset" c 195 254
mknod "$drv/dev/nvidia-uvm" c 510 0; mknod "$drv/dev/nvidia-uvm-tools" c 510 1
touch "$drv/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" "$drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"
(cd "$here" && CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$tmp/gen-cdi" .)
four=GPU-3f1c2a8e-5b7d-4e19-a6c2-8d9e0f1a2b3c,GPU-7a2e9c41-0d3b-4f58-b1e7-2c6d8a9f0e14,GPU-c4d81f26-93ab-4e07-8f5c-6b1a2d3e4f50,GPU-e9b05d73-1c2f-4a86-9d4e-7f8a0b1c2d36
gen() { "$tmp/gen-cdi" -driver-root "$drv" "$@"; }
gen -output "$tmp/nvidia-4-gpus.yaml" -uuids "$four"
gen -output "$tmp/nvidia-2-of-4-gpus.yaml" -uuids "$(echo $four | cut -d, -f1-2)"
gen -output "$tmp/nvidia-4-gpus-uuid.yaml" -uuids "$four" -device-name-strategy uuid
gen -output "$tmp/nvidia-1-gpu.json" -uuids GPU-5d6e7f80-1a2b-4c3d-8e9f-0a1b2c3d4e5f
# pci-vfio: NVML sees only the GPU bound to nvidia (0000:18:00.0), its index 0.
gen -output "$tmp/nvidia-vfio.yaml" -uuids "$(echo $four | cut -d, -f1)"
for f in nvidia-4-gpus.yaml nvidia-2-of-4-gpus.yaml nvidia-4-gpus-uuid.yaml nvidia-1-gpu.json nvidia-vfio.yaml; do
	sed -e "s|$drv/|/|g" -e "s|$drv|/|g" "$tmp/$f" > "$out/$f"
done
# A torn write: the 4-GPU spec cut off inside the quoted name of the third
# GPU ('- name: "2'), which does not parse.
n=$(grep -bo 'name: "2"' "$out/nvidia-4-gpus.yaml" | cut -d: -f1)
head -c $((n + 8)) "$out/nvidia-4-gpus.yaml" > "$out/nvidia-torn.yaml"
# A spec that parses but does not validate: a CDI version the loader does
# not know.
sed 's/"cdiVersion":"0.5.0"/"cdiVersion":"9.9.9"/' "$out/nvidia-1-gpu.json" > "$out/nvidia-unknown-version.json"
