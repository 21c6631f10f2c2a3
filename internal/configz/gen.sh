#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Writes defaults/<minor>.json for each kubelet minor dkc supports: a defaulted, otherwise empty v1beta1
# KubeletConfiguration from that minor's own scheme, printed by its dkc-kubelet-check helper (built by
# internal/kubeletcheck/build.sh with the flags `make build` uses, so the compile is shared). `make generate`
# runs it; `make verify-generated` fails when a file no longer matches the kubelet's code.
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
../../internal/kubeletcheck/build.sh "$tmp"
rm -f defaults/*.json
mkdir -p defaults
for helper in "$tmp"/dkc-kubelet-check-*; do
	"$helper" defaults >"defaults/${helper##*-}.json"
done
