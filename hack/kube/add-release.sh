#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Creates (or refreshes) the wrapper module hack/kube/v<minor> that pins one Kubernetes release for the local
# cluster: go.mod requires k8s.io/kubernetes v<version> and replaces each staging module (the list is read from
# that release's own go.mod, so new staging modules such as k8s.io/cri-streaming come along by themselves) with
# its matching v0 version; tools.go imports the programs the cluster runs; `go mod tidy` resolves the rest.
#
#   hack/kube/add-release.sh 1.38.0
#
# Then add the minor to kubeModule in test/devcluster/binaries.go, move DefaultKubeVersion to it, and mark the
# minor that left upstream support in kubeEndOfLife (docs/versions.md lists every step).
set -euo pipefail
version=${1:?usage: $0 <kubernetes version, e.g. 1.37.2>}
version=${version#v}
minor=${version%.*}
dir=$(cd "$(dirname "$0")" && pwd)/v$minor
mod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
[ -n "$mod" ] || { echo "k8s.io/kubernetes@v$version: not served by the module proxy" >&2; exit 1; }
staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$mod" | sort -u)
mkdir -p "$dir"
{
	echo "module github.com/dkc-dev/dkc/hack/kube/v$minor"
	echo
	echo "go $(awk '$1 == "go" {print $2; exit}' "$mod")"
	echo
	echo "require k8s.io/kubernetes v$version"
	echo
	echo "// k8s.io/kubernetes replaces its staging modules with ./staging; outside its tree they are pinned to the"
	echo "// matching v0 versions."
	echo "replace ("
	for m in $staging; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${version#*.}"; done
	echo ")"
} >"$dir/go.mod"
cat >"$dir/tools.go" <<GO
//go:build tools

// Package tools pins the Kubernetes v$minor binaries the local cluster runs (hack/kube/add-release.sh made
// it). This module is kept out of the main go.mod on purpose: kube-apiserver drags in etcd's server and a
// large dependency tree that dkc itself must not inherit.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
(cd "$dir" && go mod tidy)
echo "wrote $dir (k8s.io/kubernetes v$version, $(echo "$staging" | wc -l) staging modules)"
