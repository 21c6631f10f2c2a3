#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0

# Runs the cluster suites (make test-integration): `go test -tags integration` over the packages given, each
# test binary on a real local cluster of its own, INTEGRATION_P of them side by side. With INSTALLED_SHARDS=n
# (n > 1, and INTEGRATION_P > 1) ./test/installed/ runs as n shards beside the others, each shard a test
# binary with DKC_TEST_SHARD=<i>/<n> on a cluster of its own in $OUT/test/installed-<i>
# (devclustertest.MainInstalled deals the suite's tests to the shards), all sharing one build of the images
# in $OUT/test/installed-images. Each shard writes its `go test -v` output to $OUT/test/installed-<i>.log;
# the logs are printed after the other suites' output, then one line per shard.
# Environment: OUT, INTEGRATION_P, INSTALLED_SHARDS, TEST_FLAGS (split into words), HELM.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-_output}
# Absolute: each test binary runs in its package's directory.
[[ $out = /* ]] || out=$PWD/$out
p=${INTEGRATION_P:-2}
shards=${INSTALLED_SHARDS:-1}
read -r -a flags <<<"${TEST_FLAGS:-}"
installed=./test/installed/

pkgs=()
sharded=
for pkg in "$@"; do
	if [ "$pkg" = "$installed" ] && [ "$shards" -gt 1 ] && [ "$p" -gt 1 ]; then
		sharded=1
	else
		pkgs+=("$pkg")
	fi
done

# run_shards builds the images once, then runs the shards side by side and waits for them; each shard's
# result goes to installed-<i>.result ("ok" or "FAIL", and its seconds).
run_shards() {
	local images=$out/test/installed-images i pids=()
	rm -rf "$images"
	echo "go run ./hack/images -out $images (for the $shards installed shards)"
	if ! go run ./hack/images -out "$images" >"$out/test/installed-images.log" 2>&1; then
		cat "$out/test/installed-images.log"
		for i in $(seq 1 "$shards"); do echo "FAIL 0 (the images did not build)" >"$out/test/installed-$i.result"; done
		return 1
	fi
	for i in $(seq 1 "$shards"); do
		(
			start=$(date +%s)
			rc=ok
			DKC_TEST_SHARD=$i/$shards DKC_TEST_IMAGES_DIR=$images go test -tags integration -count=1 -timeout 45m -v \
				"${flags[@]}" "$installed" >"$out/test/installed-$i.log" 2>&1 || rc=FAIL
			echo "$rc $(($(date +%s) - start))" >"$out/test/installed-$i.result"
		) &
		pids+=($!)
		echo "DKC_TEST_SHARD=$i/$shards go test -tags integration -count=1 -timeout 45m -v ${flags[*]} $installed" \
			">$out/test/installed-$i.log"
	done
	local rc=0
	for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
	return $rc
}

rc=0
if [ -n "$sharded" ]; then
	mkdir -p "$out/test"
	rm -f "$out"/test/installed-*.result
	run_shards &
	shards_pid=$!
fi
if [ ${#pkgs[@]} -gt 0 ]; then
	go test -tags integration -count=1 -p "$p" -timeout 45m -v "${flags[@]}" "${pkgs[@]}" || rc=1
fi
if [ -n "$sharded" ]; then
	wait "$shards_pid" || true
	for i in $(seq 1 "$shards"); do
		echo "== installed shard $i/$shards ($out/test/installed-$i.log)"
		cat "$out/test/installed-$i.log" 2>/dev/null || true
	done
	for i in $(seq 1 "$shards"); do
		read -r result secs <"$out/test/installed-$i.result" 2>/dev/null || { result=FAIL secs=?; }
		echo "== installed shard $i/$shards: $result in ${secs}s ($out/test/installed-$i.log)"
		[ "$result" = ok ] || rc=1
	done
fi
exit $rc
