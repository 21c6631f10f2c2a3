#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Pins the kubelet code one dkc-kubelet-check helper is built with: writes MODFILE (go.mod for the newest
# minor, which the main module uses too; kube-<minor>.mod for each older one) requiring k8s.io/kubernetes
# VERSION with each staging module replaced by its matching v0 version (the list read from that release's
# own go.mod), then tidies it. build.sh builds one helper per module file.
#
#   internal/kubeletcheck/pin.sh 1.34.4 kube-1.34.mod
#
# docs/versions.md says when to run it.
set -euo pipefail
version=${1:?usage: $0 <kubernetes version> <modfile>}
version=${version#v}
modfile=${2:?usage: $0 <kubernetes version> <modfile>}
cd "$(dirname "$0")"
mod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
[ -n "$mod" ] || { echo "k8s.io/kubernetes@v$version: not served by the module proxy" >&2; exit 1; }
{
	echo "module github.com/dkc-dev/dkc/internal/kubeletcheck"
	echo
	echo "go $(awk '$1 == "go" {print $2; exit}' "$mod")"
	echo
	echo "require k8s.io/kubernetes v$version"
	echo
	echo "// k8s.io/kubernetes replaces its staging modules with ./staging; outside its tree they are pinned to the"
	echo "// matching v0 versions."
	echo "replace ("
	awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$mod" | sort -u | while read -r m; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${version#*.}"; done
	echo ")"
} >"$modfile"
rm -f "${modfile%.mod}.sum"
if [ "$modfile" = go.mod ]; then go mod tidy; else go mod tidy -modfile="$modfile"; fi
echo "pinned kubelet v$version in internal/kubeletcheck/$modfile"
