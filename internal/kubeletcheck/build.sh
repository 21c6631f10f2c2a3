#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Builds one dkc-kubelet-check per kubelet minor dkc supports into OUTDIR: dkc-kubelet-check-<minor>, the same
# source linked against that minor's kubelet code — go.mod for the newest, kube-<minor>.mod for each older
# one (pin.sh writes them). Static, path-free builds as the images are built, each linked only when its code
# changed since the last build on this machine (hack/gobuild.sh); GOARCH is taken from the
# environment. Extra arguments go to go build (e.g. -ldflags=-s -w).
#
#   internal/kubeletcheck/build.sh _output/bin
set -euo pipefail
out=${1:?usage: $0 <outdir> [go build flags]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")"
shopt -s nullglob
# A minor dropped since the last build must not linger: the sidecar and kubectl-dkc take every helper here.
rm -f "$out"/dkc-kubelet-check-*
for modfile in go.mod kube-*.mod; do
	version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2} $1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$modfile")
	minor=$(echo "$version" | sed -n 's/^v\([0-9]*\.[0-9]*\)\..*/\1/p')
	[ -n "$minor" ] || { echo "build.sh: no k8s.io/kubernetes version in $modfile" >&2; exit 1; }
	# Linked once per machine until its code changes (hack/gobuild.sh), into a directory of its own per minor.
	bin=$(mktemp -d "$out/.build-XXXXXX")
	CGO_ENABLED=0 GOFLAGS=-mod=readonly ../../hack/gobuild.sh "$bin" -modfile="$modfile" -buildvcs=false \
		"$@" ./cmd/dkc-kubelet-check
	mv "$bin/dkc-kubelet-check" "$out/dkc-kubelet-check-$minor"
	rm -rf "$bin"
done
