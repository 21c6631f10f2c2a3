#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Runs the cluster suites (make test-integration): `go test -tags integration` over the packages given, each
# test binary on a real local cluster of its own, INTEGRATION_P of them side by side. A suite with shards
# (INTEGRATION_SHARDS=n for ./test/integration/, INSTALLED_SHARDS=n for ./test/installed/; n > 1, and
# INTEGRATION_P > 1) runs as n test binaries beside the others, each with DKC_TEST_SHARD=<i>/<n> on a cluster
# of its own in $OUT/test/<suite>-<i> (devclustertest deals the suite's tests to the shards). The installed
# shards share one build of the images in $OUT/test/installed-images. Each shard writes its `go test -v`
# output to $OUT/test/<suite>-<i>.log; the logs are printed after the unsharded suites' output, then one
# line per shard.
# Environment: OUT, INTEGRATION_P, INTEGRATION_SHARDS, INSTALLED_SHARDS, TEST_FLAGS (split into words), HELM.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-_output}
# Absolute: each test binary runs in its package's directory.
[[ $out = /* ]] || out=$PWD/$out
p=${INTEGRATION_P:-2}
read -r -a flags <<<"${TEST_FLAGS:-}"
# Built as dkc's binaries are (CGO_ENABLED=0, -trimpath), so the suites compile little that `make build` did
# not, and a fresh clone compiles what an earlier one did from the build cache.
export CGO_ENABLED=0
gotest=(go test -trimpath -tags integration -count=1 -timeout 45m -v)

# shards_of PKG: how many shards the suite PKG runs as (1: whole, with the others).
shards_of() {
	local n=1
	case $1 in
	./test/integration/) n=${INTEGRATION_SHARDS:-1} ;;
	./test/installed/) n=${INSTALLED_SHARDS:-1} ;;
	esac
	if [ "$p" -gt 1 ]; then echo "$n"; else echo 1; fi
}

pkgs=() sharded=()
for pkg in "$@"; do
	if [ "$(shards_of "$pkg")" -gt 1 ]; then sharded+=("$pkg"); else pkgs+=("$pkg"); fi
done

# suite_of PKG: the suite's name, its directory's (./test/installed/ → installed).
suite_of() { basename "$1"; }

# The test binary's own flags for TEST_FLAGS: go test's -run X, -v, -count=1 … are -test.run X, -test.v …
# to the binary itself.
binflags=()
for f in "${flags[@]}"; do
	case $f in
	-test.*) binflags+=("$f") ;;
	-*) binflags+=("-test.${f#-}") ;;
	*) binflags+=("$f") ;;
	esac
done

# run_shards PKG runs the suite PKG as its shards side by side and waits for them; each shard's result goes
# to <suite>-<i>.result ("ok" or "FAIL", and its seconds). The suite's test binary is compiled once for its
# shards, and the installed suite's images are built first, once.
run_shards() {
	local pkg=$1 suite n i pids=() env=() bin
	suite=$(suite_of "$pkg")
	n=$(shards_of "$pkg")
	rm -f "$out/test/$suite"-*.result
	bin=$out/test/$suite.test
	echo "go test -c -trimpath -tags integration -o $bin $pkg (for the $n $suite shards)"
	if ! go test -c -trimpath -tags integration -o "$bin" "$pkg"; then
		for i in $(seq 1 "$n"); do echo "FAIL 0 (the test binary did not build)" >"$out/test/$suite-$i.result"; done
		return 1
	fi
	if [ "$pkg" = ./test/installed/ ]; then
		local images=$out/test/installed-images
		rm -rf "$images"
		echo "go run ./hack/images -out $images (for the $n installed shards)"
		if ! go run ./hack/images -out "$images" >"$out/test/installed-images.log" 2>&1; then
			cat "$out/test/installed-images.log"
			for i in $(seq 1 "$n"); do echo "FAIL 0 (the images did not build)" >"$out/test/$suite-$i.result"; done
			return 1
		fi
		env=(DKC_TEST_IMAGES_DIR="$images")
	fi
	for i in $(seq 1 "$n"); do
		# In the package's directory, as go test runs a test binary.
		(
			cd "$pkg"
			start=$(date +%s)
			rc=ok
			env "${env[@]}" DKC_TEST_SHARD="$i/$n" "$bin" -test.count=1 -test.timeout=45m -test.v "${binflags[@]}" \
				>"$out/test/$suite-$i.log" 2>&1 || rc=FAIL
			echo "$rc $(($(date +%s) - start))" >"$out/test/$suite-$i.result"
		) &
		pids+=($!)
		echo "(cd $pkg && DKC_TEST_SHARD=$i/$n $bin -test.count=1 -test.timeout=45m -test.v ${binflags[*]})" \
			">$out/test/$suite-$i.log"
	done
	local rc=0
	for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
	return $rc
}

rc=0
mkdir -p "$out/test"
shard_pids=()
for pkg in "${sharded[@]}"; do
	run_shards "$pkg" &
	shard_pids+=($!)
done
if [ ${#pkgs[@]} -gt 0 ]; then
	"${gotest[@]}" -p "$p" "${flags[@]}" "${pkgs[@]}" || rc=1
fi
for pid in "${shard_pids[@]}"; do wait "$pid" || true; done
for pkg in "${sharded[@]}"; do
	suite=$(suite_of "$pkg")
	for i in $(seq 1 "$(shards_of "$pkg")"); do
		echo "== $suite shard $i ($out/test/$suite-$i.log)"
		cat "$out/test/$suite-$i.log" 2>/dev/null || true
	done
done
for pkg in "${sharded[@]}"; do
	suite=$(suite_of "$pkg")
	n=$(shards_of "$pkg")
	for i in $(seq 1 "$n"); do
		read -r result secs <"$out/test/$suite-$i.result" 2>/dev/null || { result=FAIL secs=?; }
		echo "== $suite shard $i/$n: $result in ${secs}s ($out/test/$suite-$i.log)"
		[ "$result" = ok ] || rc=1
	done
done
exit $rc
