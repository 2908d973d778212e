#!/usr/bin/env bash
# Builds kube-apiserver and etcd from this tools module into DIR (default
# ../../.cache/bin), skipping the build when DIR/stamp matches this script,
# go.mod, go.sum and cmd/etcd/main.go (the version baked in is in this script).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../.cache/bin}
mkdir -p "$out"; out=$(cd "$out" && pwd)
# The files' contents only, not their paths: a checkout elsewhere (a git
# worktree, CI's clone) with a copied cache is the same build.
stamp=$(cat "$here/build.sh" "$here/go.mod" "$here/go.sum" "$here/cmd/etcd/main.go" | sha256sum | cut -c1-16)
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
	exit 0
fi
cd "$here"
LDF="-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean"
CGO_ENABLED=0 go build -trimpath -ldflags "$LDF" -o "$out/" tool
echo "$stamp" > "$out/stamp"
