#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Builds Go main packages as `go build -trimpath -o OUTDIR/ ARGS...` does, but links only what changed since
# the same build last ran on this machine, from any checkout. go build skips the link when the file at -o
# already carries the build ID it would link, and -trimpath keeps the checkout's path out of that ID; yet a
# fresh clone's output directories are empty, so there every binary would be linked again, the
# kubelet-check helpers (the kubelet's dependency tree, once per minor) several times per `make test`.
# Here each build configuration (the arguments, the module, and the environment that changes the output)
# has a directory of its own under the user's cache, which go build keeps up to date; the binaries are then
# copied into OUTDIR (copied, not linked: a later write through the other name would change both).
# Configurations unused for 14 days are removed. For builds whose arguments stay the same from commit to
# commit: one that stamps the commit into the binary would leave a directory per commit.
#
#   hack/gobuild.sh OUTDIR [go build flags] PACKAGES...
#
# Environment: DKC_CACHE_DIR (default ${XDG_CACHE_HOME:-~/.cache}/dkc, as test/devcluster.CacheDir).
set -euo pipefail
out=${1:?usage: $0 <outdir> [go build flags] <packages>}
shift
cache=${DKC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dkc}/gobuild
# The module (by path, not by directory: two checkouts share), the arguments, and what go env says changes
# the binaries; go build itself decides whether the binaries in the directory are current.
key=$({
	go list -m
	printf '%s\n' "$@"
	go env GOOS GOARCH GOAMD64 GOARM64 CGO_ENABLED GOFLAGS GOEXPERIMENT GOVERSION
} | sha256sum | cut -c1-16)
dir=$cache/$key
mkdir -p "$dir" "$out"
touch "$dir"
find "$cache" -mindepth 1 -maxdepth 1 -type d -mtime +14 -exec sh -c 'rm -rf "$1" "$1.lock" "$1.args"' _ {} \; \
	2>/dev/null || true
# Two builds of one configuration at once (suites starting side by side) take turns, the copy included; the
# second finds the binaries current.
exec 9>"$dir.lock"
flock 9
go build -trimpath -o "$dir/" "$@"
printf '%s\n' "$@" >"$dir.args"
find "$dir" -mindepth 1 -maxdepth 1 -type f -exec cp -f -t "$out" {} +
